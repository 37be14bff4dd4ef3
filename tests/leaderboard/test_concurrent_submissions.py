"""Concurrent submissions on PostgreSQL: the duplicate and name checks hold under a race, the
losers get the same refusal a sequential duplicate gets (a 400 on the API), and nothing they
uploaded stays on disk."""

from pathlib import Path

import pytest
from django.conf import settings

from leaderboard import services
from leaderboard.models import Submission
from pipeline.services import benchmark_import
from tests.concurrency import race
from tests.leaderboard.test_submissions import scores_upload
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db(transaction=True)


def upload_files() -> set[str]:
    folder = Path(settings.MEDIA_ROOT)
    return {str(p.relative_to(folder)) for p in folder.rglob("*.jsonl")} if folder.exists() else set()


def test_eight_concurrent_uploads_of_one_scores_file_make_one_submission_and_no_orphan_file(researcher,
                                                                                            require_postgres):
    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    before = upload_files()
    outcomes = race(8, lambda i: services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name=f"copy {i}", benchmark="sample", kind="scores", settings=("no_profile",),
        scores_file=scores_upload(benchmark))))
    made = [o for o in outcomes if isinstance(o, Submission)]
    refused = [o for o in outcomes if isinstance(o, services.SubmissionRefused)]
    assert len(made) == 1 and len(refused) == 7, outcomes
    assert all("was already evaluated on sample" in str(r) and r.field == "model_path" for r in refused)
    assert Submission.objects.count() == 1
    assert upload_files() - before == {made[0].scores_file.name}  # the losers' files are gone


def test_concurrent_submissions_never_share_a_display_name(researcher, require_postgres):
    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    ids = list(benchmark.items.values_list("source_id", flat=True))
    # Eight different models (each gets a different pair wrong), one name.
    outcomes = race(8, lambda i: services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="same name", benchmark="sample", kind="scores", settings=("no_profile",),
        scores_file=scores_upload(benchmark, wrong={ids[i % len(ids)]}))))
    made = [o for o in outcomes if isinstance(o, Submission)]
    assert len(made) == 1, outcomes
    assert all("You already have a submission named 'same name'" in str(o) for o in outcomes if o not in made)
    assert Submission.objects.filter(display_name="same name").count() == 1
