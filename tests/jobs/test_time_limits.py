"""The Celery soft time limit beyond builds (tests/pipeline/test_build_answers.py): an evaluation
run of a pairwise judge, policy sampling and Best-of-N judging, each against an endpoint whose
requests hang. Reaching the limit cancels the requests in flight and the job stops within
seconds, FAILED with a readable reason; everything stored so far is kept and a retry finishes the
rest without asking again what was answered.

The limit is simulated as Celery raises it: SoftTimeLimitExceeded from a SIGALRM handler in the
job's thread, armed 1 s after the job reported its first progress."""

import json
import signal
import threading
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from jobs.services import job_retry
from leaderboard import services
from leaderboard.services import outcomes as outcome_services
from leaderboard.services import runs as run_services
from leaderboard.models import BestOfNRun, BestOfNSample, EvaluationRun, PairScore
from pipeline.downstream import samples_generate
from pipeline.models import LLMEndpoint, PolicySample, PolicySampleSet
from tests.leaderboard.test_best_of_n import grade, tiny_world
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)
from tests.prblib.fake_openai import hang, text

pytestmark = pytest.mark.django_db
LIMIT = settings.CELERY_TASK_SOFT_TIME_LIMIT


class HangAfterArmed:
    """Answers with `respond` until armed (or, with `hang_after`, once it has answered that many
    requests), then every request hangs (60 s, against a 30 s timeout with 4 retries: minutes,
    were the requests not cancelled). Logs the bodies it answered."""

    def __init__(self, respond, *, hang_after: int | None = None):
        self.respond, self.armed, self.answered = respond, threading.Event(), []
        self.hang_after, self._lock = hang_after, threading.Lock()

    def __call__(self, body):
        with self._lock:  # the fake server answers each request in a thread of its own
            if self.armed.is_set() or (self.hang_after is not None and len(self.answered) >= self.hang_after):
                hanging = True
            else:
                hanging = False
                self.answered.append(json.dumps(body["messages"], sort_keys=True))
        return hang(60) if hanging else self.respond(body)


class SoftLimit:
    """Raise SoftTimeLimitExceeded in this thread 1 s after `arm()`; `stopped_at` is when it fired."""

    def __enter__(self):
        self.stopped_at = None
        self._previous = signal.signal(signal.SIGALRM, self._fire)
        return self

    def _fire(self, signum, frame):
        self.stopped_at = time.monotonic()
        raise SoftTimeLimitExceeded()

    def arm(self):
        signal.setitimer(signal.ITIMER_REAL, 1.0)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous)


def arm_on_first_progress(monkeypatch, module, limit: SoftLimit, endpoint: HangAfterArmed, *, after: int = 1):
    """Arm the limit (and make the endpoint hang) once `module.job_progress` reports `after` units."""
    real = module.job_progress

    def progress(job, done, total=None):
        real(job, done, total) if total is not None else real(job, done)
        if done >= after and not endpoint.armed.is_set():
            endpoint.armed.set()
            limit.arm()

    monkeypatch.setattr(module, "job_progress", progress)


def stopped_promptly(limit: SoftLimit, returned: float) -> None:
    assert limit.stopped_at is not None, "the time limit never fired"
    assert returned - limit.stopped_at < 5  # not the 30 s timeout times 5 attempts


def test_an_evaluation_run_of_a_pairwise_judge_stops_at_the_time_limit_and_resumes(researcher, sample,  # noqa: F811
                                                                                  fake_openai, monkeypatch):
    endpoint = HangAfterArmed(lambda body: "Answer A fits this person.\nVerdict: A")
    fake_openai.responder = endpoint
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=4, timeout_seconds=30,
                               max_concurrency=4)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="judge", benchmark="sample", kind="pairwise", settings=("profile",), judge_backend="judge",
        model_path="judge-model", batch_size=8))
    run = submission.runs.get()
    with SoftLimit() as limit:
        arm_on_first_progress(monkeypatch, run_services, limit, endpoint)
        status = services.run_execute(run_id=run.pk)
        returned = time.monotonic()
    stopped_promptly(limit, returned)
    run.refresh_from_db()
    kept = PairScore.objects.filter(run=run).count()
    assert status == "FAILED" and kept == 8  # the first chunk (8 pairs) was stored before the limit
    assert run.error == (f"Stopped by the time limit ({LIMIT} s) at 8 of 30; what was done is kept: retry to continue "
                         "from there.")

    monkeypatch.undo()
    endpoint.armed.clear()
    answered_before = set(endpoint.answered)
    job_retry(user=researcher, job=run)
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED"
    assert PairScore.objects.filter(run=run).count() == 30
    # The 8 stored pairs (16 verdicts) were not asked again; nothing answered before was paid twice.
    assert not answered_before & set(endpoint.answered[len(answered_before):])
    assert len(endpoint.answered) == len(set(endpoint.answered)) == 30 * 2
    assert EvaluationRun.objects.get(pk=run.pk).metrics["accuracy"] == 0.0  # always "A": one order each


def policy_answers(body):
    return text([f"Sampled answer {i} about painting, {sum(map(ord, json.dumps(body)))}, long enough to be graded."
                 for i in range(body.get("n") or 1)])


@pytest.mark.parametrize("concurrency", [1, 4])
def test_policy_sampling_stops_at_the_time_limit_and_resumes(researcher, staff_user, fake_openai, tmp_path,
                                                            monkeypatch, concurrency):
    from pipeline import downstream

    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=6)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_concurrency=concurrency, timeout_seconds=30, max_retries=4)
    # One item answered, then every request hangs: with 4 requests in flight the other answers
    # could otherwise all arrive before the first progress report arms the limit.
    endpoint = HangAfterArmed(policy_answers, hang_after=1)
    fake_openai.responder = endpoint
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=judge,
                                                model="m", n=2)
    with SoftLimit() as limit:
        arm_on_first_progress(monkeypatch, downstream, limit, endpoint)
        status = samples_generate(sample_set=sample_set)
        returned = time.monotonic()
    stopped_promptly(limit, returned)
    sample_set.refresh_from_db()
    kept = PolicySample.objects.filter(sample_set=sample_set).values("item").distinct().count()
    assert status == "FAILED" and kept == 1
    assert sample_set.error.startswith(f"Stopped by the time limit ({LIMIT} s) at 1 of 6;")

    monkeypatch.undo()
    endpoint.armed.clear()
    endpoint.hang_after = None
    job_retry(user=staff_user, job=sample_set)  # sample sets are staff-only
    assert downstream.samples_execute(sample_set_id=sample_set.pk) == "SUCCEEDED"
    assert PolicySample.objects.filter(sample_set=sample_set).count() == 6 * 2
    assert len(endpoint.answered) == len(set(endpoint.answered))  # no answered request paid twice


@pytest.mark.parametrize("concurrency", [1, 4])
def test_best_of_n_judging_stops_at_the_time_limit_and_resumes(researcher, fake_openai, tmp_path, monkeypatch,
                                                              concurrency):
    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=6)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_concurrency=concurrency, timeout_seconds=30, max_retries=4)
    fake_openai.responder = policy_answers
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=judge,
                                                model="m", n=4)
    assert samples_generate(sample_set=sample_set) == "SUCCEEDED"
    endpoint = HangAfterArmed(grade)
    fake_openai.responder = endpoint
    run = BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=judge, judge_model="grader")
    with SoftLimit() as limit:
        # Progress counts the 6 items scored by the RM, then each judged pick: arm after the first pick.
        arm_on_first_progress(monkeypatch, outcome_services, limit, endpoint, after=6 + 1)
        status = services.bon_run_execute(run_id=run.pk)
        returned = time.monotonic()
    stopped_promptly(limit, returned)
    run.refresh_from_db()
    judged = BestOfNSample.objects.filter(run=run, judged=True).count()
    assert status == "FAILED" and judged >= 1 and BestOfNSample.objects.filter(run=run).count() == 6 * 4
    assert run.error.startswith(f"Stopped by the time limit ({LIMIT} s) at ") and "retry to continue" in run.error

    monkeypatch.undo()
    endpoint.armed.clear()
    job_retry(user=researcher, job=run)
    assert services.bon_run_execute(run_id=run.pk) == "SUCCEEDED"
    assert BestOfNSample.objects.filter(run=run, judged=True).count() > judged
    assert len(endpoint.answered) == len(set(endpoint.answered))  # no judged sample paid for twice
