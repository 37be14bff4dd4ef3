"""Jobs that never get stuck, never half-succeed and never run twice (on PostgreSQL and Redis
with real workers where the fault is between processes):

- a QUEUED job whose message the broker lost is sent again by the sweep and runs;
- a delivery whose claim meets a database error is handed back, not acknowledged, and runs
  once the database answers (a TCP gate between the worker and PostgreSQL is closed, then opened);
- a job saved while the broker is down answers a JSON 503 and starts once the sweep can send it;
- cancel followed at once by retry never lets two executions run side by side: the new one
  waits for the old one to stop, and no answer is paid twice beyond the one in flight;
- a superseded execution writes nothing (its claim token no longer matches);
- Best-of-N and PPO runs whose judge answers 500 end FAILED with counts, store no outcome,
  and their retry asks only for the missing grades.

Each test prints a line of the table in the closing note (fault | outcome | time | units | repeats)."""

import json
import socket
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from jobs.models import JobStatus
from jobs.services import (JobDeferred, JobStopped, job_claim, job_enqueue, job_execute, job_progress,
                           job_unit_write, jobs_recover_stale)
from leaderboard import services
from leaderboard.models import BestOfNRun, BestOfNSample, DownstreamOutcome, PPOAnswer, PPORun
from pipeline.downstream import samples_enqueue, samples_generate
from pipeline.models import LLMEndpoint, PolicySample, PolicySampleSet
from tests.conftest import (WORKER_TEST_TIMEOUT, WorkerProcess, database_url_for_subprocess, progress_of, purge_broker,
                            wait_for, wait_for_job)
from tests.leaderboard.test_best_of_n import grade, tiny_world
from tests.prblib.fake_openai import status, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(WORKER_TEST_TIMEOUT)]

FAST = {"RUN_HEARTBEAT_SECONDS": "1", "RUN_STALE_SECONDS": "4", "RUN_SWEEP_SECONDS": "1"}


def table(fault: str, outcome: str, seconds: float, units: str, repeats: int) -> None:
    print(f"\nSTUCK | {fault} | {outcome} | {seconds:.1f} s | {units} | requests paid twice {repeats}")


def sample_world(researcher, fake_openai, tmp_path, *, items=4, delay=0.0):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=items)
    endpoint = LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=0,
                                          max_concurrency=1)
    in_flight, peak = [0], [0]
    lock = threading.Lock()

    def respond(body):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(delay)
            return text([f"Sample {i} of {sum(map(ord, json.dumps(body['messages'])))} in several words."
                         for i in range(body.get("n") or 1)])
        finally:
            with lock:
                in_flight[0] -= 1

    fake_openai.responder = respond
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=endpoint,
                                                model="m", n=2)
    return sample_set, peak


def paid_twice(fake_openai) -> int:
    keys = Counter(json.dumps(b["messages"], sort_keys=True) for b in fake_openai.bodies)
    return sum(c - 1 for c in keys.values())


def test_a_queued_job_whose_message_the_broker_lost_is_sent_again_and_runs(researcher, fake_openai, tmp_path):
    sample_set, _ = sample_world(researcher, fake_openai, tmp_path)
    purge_broker()
    samples_enqueue(sample_set=sample_set)  # committed and sent ...
    sample_set.refresh_from_db()
    assert sample_set.status == JobStatus.QUEUED and sample_set.sent_at is not None
    purge_broker()  # ... and lost, as when Redis restarts without persistence
    start = time.monotonic()
    worker = WorkerProcess(name="sweeper", env={**FAST, "RUN_RESEND_SECONDS": "2"}, beat=True)
    worker.start(tmp_path / "worker.log")
    try:
        wait_for_job(sample_set, worker=worker, what="the re-sent sample set to finish")
    finally:
        worker.stop()
    assert PolicySample.objects.filter(sample_set=sample_set).count() == 4 * 2
    assert "not claimed; task sent again" in worker.log_tail(100_000)
    table("message lost (broker flushed)", "SUCCEEDED", time.monotonic() - start, "8/8 samples",
          paid_twice(fake_openai))


class Gate:
    """A TCP forwarder to PostgreSQL that the test can close (every connection through it is cut
    and new ones are refused) and open again: the worker's database goes away and comes back."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.open, self.conns = target, False, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.open = False
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns = []

    def stop(self):
        self.close()
        self.server.close()


def test_a_delivery_whose_claim_meets_a_database_error_is_handed_back_and_runs_later(
        researcher, fake_openai, tmp_path, require_postgres):
    sample_set, _ = sample_world(researcher, fake_openai, tmp_path)
    from django.db import connection

    s = connection.settings_dict
    gate = Gate((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    url = database_url_for_subprocess().replace(f":{s['PORT'] or 5432}/", f":{gate.port}/")
    purge_broker()
    # No beat and a resend period far away: only the handed-back message can make the job run.
    worker = WorkerProcess(name="gated", env={**FAST, "RUN_RESEND_SECONDS": "3600", "DATABASE_URL": url})
    worker.start(tmp_path / "worker.log")
    try:
        samples_enqueue(sample_set=sample_set)  # the database is down for the worker
        wait_for(lambda: worker.log_tail(100_000).count("handed back to the queue") >= 2, timeout=120,
                 worker=worker, what="the worker to hand the message back twice",
                 progress=lambda: worker.log_tail(100_000).count("handed back to the queue"))
        assert PolicySampleSet.objects.get(pk=sample_set.pk).status == JobStatus.QUEUED
        start = time.monotonic()
        gate.open = True
        wait_for_job(sample_set, worker=worker, what="the sample set to run once the database is back",
                     timeout=180)
        elapsed = time.monotonic() - start
    finally:
        worker.stop()
        gate.stop()
    assert "the database refused the claim" in worker.log_tail(100_000)
    assert PolicySample.objects.filter(sample_set=sample_set).count() == 8
    assert PolicySampleSet.objects.get(pk=sample_set.pk).attempts == 1
    table("claim meets a database error", "SUCCEEDED after the database is back", elapsed, "8/8 samples",
          paid_twice(fake_openai))


def test_a_submission_made_while_the_broker_is_down_answers_503_and_starts_once_it_is_back(
        researcher, monkeypatch, tmp_path):
    from celery import current_app
    from rest_framework.test import APIClient

    from tests.leaderboard.test_submissions import scores_upload
    from pipeline.services import benchmark_import
    from tests.pipeline.test_formats import SAMPLE

    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    sent = []

    def broker_down(name, args=None, **kwargs):
        raise BrokerError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(current_app, "send_task", broker_down)
    client = APIClient()
    client.force_authenticate(researcher)
    response = client.post("/api/submissions/", {
        "display_name": "while down", "benchmark": "sample", "kind": "scores", "settings": ["no_profile"],
        "scores_file": scores_upload(benchmark)}, format="multipart")
    assert response.status_code == 503 and response["Content-Type"] == "application/json"
    assert response["Retry-After"] == "60"
    detail = response.json()["detail"]
    assert "is saved and queued, but the task queue is unreachable" in detail and "Nothing needs to be submitted" in detail
    run = services.EvaluationRun.objects.get(submission__display_name="while down")
    assert run.status == JobStatus.QUEUED and run.sent_at is None
    # The broker is back: the sweep (after a heartbeat's grace) sends the saved job's message.
    monkeypatch.setattr(current_app, "send_task", lambda name, args=None, **kw: sent.append((name, args)))
    services.EvaluationRun.objects.filter(pk=run.pk).update(queued_at=timezone.now() - timedelta(seconds=30))
    assert ("evaluation", run.pk) in jobs_recover_stale()
    assert sent == [("gpu.leaderboard.evaluate_run", [run.pk])]
    run.refresh_from_db()
    assert run.sent_at is not None
    assert jobs_recover_stale() == []  # sent once: the next sweep leaves it until RUN_RESEND_SECONDS


def test_the_claim_waits_for_an_earlier_execution_that_has_not_stopped(researcher, fake_openai, tmp_path):
    sample_set, _ = sample_world(researcher, fake_openai, tmp_path)
    model = PolicySampleSet
    # Another worker's execution holds the job, its heartbeat fresh; it is cancelled, then retried at once.
    model.objects.filter(pk=sample_set.pk).update(status=JobStatus.RUNNING, claim_token="a" * 32,
                                                  heartbeat_at=timezone.now(), worker="other:1")
    from jobs.services import job_cancel, job_retry

    from tests.factories import UserFactory

    staff = UserFactory(is_staff=True)
    assert job_cancel(user=staff, job=sample_set) is True
    job_retry(user=staff, job=sample_set)
    assert model.objects.get(pk=sample_set.pk).status == JobStatus.QUEUED
    with pytest.raises(JobDeferred, match="an earlier execution has not stopped yet"):
        job_claim(model, sample_set.pk)
    # Once its heartbeat is stale (the old worker died), or it released its token, the claim goes ahead.
    model.objects.filter(pk=sample_set.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=3600))
    claimed = job_claim(model, sample_set.pk)
    assert claimed is not None and claimed.status == JobStatus.RUNNING and claimed.claim_token != "a" * 32


def test_a_superseded_execution_writes_no_unit_no_progress_and_no_outcome(researcher, fake_openai, tmp_path):
    sample_set, _ = sample_world(researcher, fake_openai, tmp_path)
    model = PolicySampleSet
    job_enqueue(sample_set, send=False)
    seen = {}

    def work(job):
        job_progress(job, 1, 4)
        with job_unit_write(job):  # still ours
            seen["first"] = True
        # The sweep re-queued it and another worker claimed it: a new token.
        model.objects.filter(pk=job.pk).update(claim_token="b" * 32, worker="other:2")
        def write_unit():
            with job_unit_write(job):
                seen["second"] = True  # never reached

        for write in (lambda: job_progress(job, 2), write_unit):
            with pytest.raises(JobStopped):
                write()
        seen["stopped"] = True
        return {"failed_items": {"x": "must not be stored"}}  # and SUCCEEDED must not be written either

    assert job_execute(model, sample_set.pk, work) == JobStatus.RUNNING
    row = model.objects.get(pk=sample_set.pk)
    assert seen == {"first": True, "stopped": True}
    assert row.progress_done == 1 and row.failed_items == {} and row.claim_token == "b" * 32


def test_cancel_then_retry_at_once_never_runs_two_executions_side_by_side(researcher, fake_openai, tmp_path):
    sample_set, peak = sample_world(researcher, fake_openai, tmp_path, items=8, delay=1.5)
    purge_broker()
    env = {**FAST, "RUN_RESEND_SECONDS": "3600"}
    first = WorkerProcess(name="first", env=env).start(tmp_path / "first.log")
    second = None
    try:
        samples_enqueue(sample_set=sample_set)
        wait_for(lambda: PolicySample.objects.filter(sample_set=sample_set).count() >= 2, timeout=180,
                 worker=first, what="the first execution to store a sample",
                 progress=progress_of(PolicySampleSet, sample_set.pk, first))
        assert PolicySample.objects.filter(sample_set=sample_set).count() < 8 * 2
        # The second worker is idle and takes the retry's message at once.
        second = WorkerProcess(name="second", env=env).start(tmp_path / "second.log")
        wait_for(lambda: "ready." in second.log_tail(100_000), timeout=120, worker=second,
                 what="the second worker to be ready")
        from jobs.services import job_cancel, job_retry
        from tests.factories import UserFactory

        staff = UserFactory(is_staff=True)
        start = time.monotonic()
        assert job_cancel(user=staff, job=sample_set)
        job_retry(user=staff, job=sample_set)
        wait_for_job(sample_set, worker=second, what="the retried sample set to finish")
        elapsed = time.monotonic() - start
    finally:
        first.stop()
        if second:
            second.stop()
    assert PolicySample.objects.filter(sample_set=sample_set).count() == 8 * 2
    assert "an earlier execution has not stopped yet" in (tmp_path / "second.log").read_text(errors="replace")
    assert peak[0] == 1  # never two requests at once: never two executions at once
    repeats = paid_twice(fake_openai)
    assert repeats <= 1  # at most the request in flight when it was cancelled
    table("cancel then retry at once", "SUCCEEDED, one execution at a time", elapsed, "16/16 samples", repeats)


def failing_judge(every: int):
    """The grading judge, answering 500 to every `every`-th distinct grading prompt on its first
    asking (a retry of the run gets an answer)."""
    failed, count, lock = set(), [0], threading.Lock()

    def respond(body):
        key = json.dumps(body["messages"])
        with lock:
            count[0] += 1
            fail = count[0] % every == 0 and key not in failed
            if fail:
                failed.add(key)
        return status(500) if fail else grade(body)

    return respond, failed


def test_best_of_n_whose_judge_answers_500_fails_with_counts_and_its_retry_asks_only_for_the_missing(
        researcher, fake_openai, tmp_path):
    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=6)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_retries=0)
    fake_openai.responder = lambda body: text([f"Sampled answer {i} about painting, {sum(map(ord, json.dumps(body)))}, "
                                               "long enough to be graded." for i in range(body.get("n") or 1)])
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=judge,
                                                model="m", n=4)
    assert samples_generate(sample_set=sample_set) == "SUCCEEDED"
    respond, failed = failing_judge(every=3)
    fake_openai.responder = respond
    before = len(fake_openai.bodies)
    run = BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=judge, judge_model="grader")
    assert services.bon_run_here(run=run) == "FAILED"
    run.refresh_from_db()
    graded = BestOfNSample.objects.filter(run=run, judged=True).count()
    asked = len(fake_openai.bodies) - before
    assert len(failed) == asked // 3 and graded == asked - len(failed)
    assert run.error.startswith(f"{len(failed)} of {asked} grades missing, their judge requests failed (")
    assert "answered 500" in run.error and "Retry to ask for the missing grades only" in run.error
    assert not DownstreamOutcome.objects.filter(submission=submission).exists()
    assert not DownstreamOutcome.objects.filter(rm_name=services.RANDOM_BASELINE).exists()
    # Retry (through the lifecycle, as the Jobs page does) asks for the missing grades alone.
    from tests.factories import UserFactory

    from jobs.services import job_retry

    job_retry(user=UserFactory(is_staff=True), job=run)
    again = len(fake_openai.bodies)
    assert services.bon_run_execute(run_id=run.pk) == "SUCCEEDED"
    retried = [json.dumps(b["messages"]) for b in fake_openai.bodies[again:]]
    assert sorted(retried) == sorted(failed)  # exactly the failed ones, once each
    assert BestOfNSample.objects.filter(run=run, judged=True).count() == asked
    rows = DownstreamOutcome.objects.filter(submission=submission, domain="").order_by("k")
    assert [r.k for r in rows] == [1, 2, 4] and all(r.n == 6 for r in rows)
    table("Best-of-N judge answers 500", "FAILED, then SUCCEEDED on retry", 0.0,
          f"{graded}/{asked} grades, then {asked}/{asked}", 0)


def test_ppo_whose_judge_answers_500_fails_with_counts_and_its_retry_asks_only_for_the_missing(
        researcher, fake_openai, tmp_path):
    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=12)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_retries=0)
    respond, failed = failing_judge(every=2)
    fake_openai.responder = respond
    run = PPORun.objects.create(submission=submission, policy="tiny", policy_model="policy", judge=judge,
                                judge_model="grader", steps=2, batch_size=2, response_length=8, eval_fraction=0.4)
    assert services.ppo_run_here(run=run) == "FAILED"
    run.refresh_from_db()
    held = PPOAnswer.objects.filter(run=run).count()
    graded = PPOAnswer.objects.filter(run=run, judged=True).count()
    assert failed and graded == held - len(failed)
    assert run.error.startswith(f"{len(failed)} of {held} grades missing")
    assert not DownstreamOutcome.objects.filter(submission=submission).exists()
    from jobs.services import job_retry
    from tests.factories import UserFactory

    job_retry(user=UserFactory(is_staff=True), job=run)
    again = len(fake_openai.bodies)
    assert services.ppo_run_execute(run_id=run.pk) == "SUCCEEDED"
    assert sorted(json.dumps(b["messages"]) for b in fake_openai.bodies[again:]) == sorted(failed)
    outcome = DownstreamOutcome.objects.get(submission=submission, kind="ppo", domain="")
    assert outcome.n == held
    table("PPO judge answers 500", "FAILED, then SUCCEEDED on retry", 0.0, f"{graded}/{held} grades, then all", 0)
