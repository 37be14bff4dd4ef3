"""Retries count toward the hourly submission limit (issue 33, fault 5, hostile review): a
retry queues the work again, as a submission does, so it costs one attempt, on the submission's
page and API and on the Jobs page and API alike."""

import pytest
from django.test import Client

from jobs.services import job_cancel
from leaderboard import services
from leaderboard.models import EvaluationRun, SubmissionAttempt
from tests.annotation.test_blindness import _scores
from tests.factories import UserFactory
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

LIMIT = ("You reached the limit of 3 submission attempts per hour (SUBMISSIONS_PER_HOUR; refused ones count too); "
         "try again later.")


def _cancelled_submission(user, bench, name):
    """A submission of uploaded scores whose one run was cancelled before it ran."""
    submission = services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=name, benchmark=bench.name, kind="scores", settings=("no_profile",),
        scores_file=_scores(bench, lambda text: len(text)), options={}))
    for run in submission.runs.all():
        job_cancel(user=user, job=run)
    return submission


def _cancel_all(submission, user):
    for run in submission.runs.all():
        job_cancel(user=user, job=run)


def test_each_retry_is_one_attempt_and_the_one_past_the_limit_is_a_429(settings, sample):  # noqa: F811
    settings.SUBMISSIONS_PER_HOUR = 3
    researcher = UserFactory(roles=["researcher"])
    client = Client()
    client.force_login(researcher)
    submission = _cancelled_submission(researcher, sample, "rm")  # attempt 1: the submission

    retried = client.post(f"/api/submissions/{submission.pk}/retry/")  # attempt 2
    assert retried.status_code == 200 and SubmissionAttempt.objects.filter(owner=researcher).count() == 1
    assert set(submission.runs.values_list("status", flat=True)) == {"QUEUED"}
    _cancel_all(submission, researcher)
    run = submission.runs.order_by("setting").first()
    assert client.post(f"/api/jobs/evaluation/{run.pk}/retry/").status_code == 200  # attempt 3, on the Jobs API
    _cancel_all(submission, researcher)

    refused = client.post(f"/api/submissions/{submission.pk}/retry/")
    assert (refused.status_code, refused.json()) == (429, {"detail": LIMIT})
    assert set(submission.runs.values_list("status", flat=True)) == {"CANCELLED"}  # nothing was queued
    refused = client.post(f"/api/jobs/evaluation/{run.pk}/retry/")
    assert (refused.status_code, refused.json()) == (429, {"detail": LIMIT})
    # The page says the same and queues nothing.
    page = client.post(f"/submissions/{submission.pk}/retry/", follow=True)
    assert LIMIT in page.content.decode()
    assert EvaluationRun.objects.get(pk=run.pk).status == "CANCELLED"
    # A new submission is refused too: retries used the hour up.
    with pytest.raises(services.SubmissionRefused) as caught:
        _cancelled_submission(researcher, sample, "another")
    assert (caught.value.status, str(caught.value)) == (429, LIMIT)


def test_staff_retries_are_not_counted(settings, sample):  # noqa: F811
    settings.SUBMISSIONS_PER_HOUR = 1
    staff = UserFactory(is_staff=True)
    submission = _cancelled_submission(staff, sample, "reference")
    for _ in range(3):
        assert services.submission_retry(user=staff, submission=submission) == 1
        _cancel_all(submission, staff)
    assert not SubmissionAttempt.objects.exists()
