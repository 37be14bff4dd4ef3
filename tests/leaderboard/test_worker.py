"""Evaluations through the configured broker on real worker processes (under CI: Redis and
PostgreSQL), including a worker killed with SIGKILL in the middle of a run."""

import json
import signal

import pytest
from django.conf import settings

from leaderboard import services
from leaderboard.models import EvaluationRun, PairScore, RunStatus
from pipeline.services import benchmark_import, reward_model_get, rm_score_items
from tests.conftest import WORKER_TEST_TIMEOUT, WorkerProcess, progress_of, purge_broker, wait_for, wait_for_job
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE, make_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(WORKER_TEST_TIMEOUT)]


def tiny_rm(name: str = "tiny-rm", **kwargs) -> str:
    build_decoder_rm(settings.MODELS_ROOT / name, **kwargs)
    return name


def submit_scalar(user, benchmark_name: str, model: str, settings_=("no_profile",), batch_size=4):
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=f"{model} on {benchmark_name}", benchmark=benchmark_name, kind="scalar", settings=settings_,
        model_path=model, batch_size=batch_size, max_length=2048))


def in_process_scores(run: EvaluationRun) -> dict[str, tuple[float, float]]:
    """The same model scored in this process, uninterrupted, for comparison."""
    model = reward_model_get(services.model_spec_for(run.submission))
    scores = {}

    def keep(results):
        scores.update({item.source_id: (r.chosen_score, r.rejected_score) for item, r in results})

    rm_score_items(model=model, items=run.submission.benchmark.items.order_by("position"), setting=run.setting,
                   on_chunk=keep)
    return scores


def test_a_worker_evaluates_a_scalar_submission_end_to_end(celery_worker_process, researcher):
    benchmark_import(path=SAMPLE, name="sample")
    submission = submit_scalar(researcher, "sample", tiny_rm(), settings_=("no_profile", "profile"))

    def all_done():
        statuses = set(submission.runs.values_list("status", flat=True))
        return statuses <= {RunStatus.SUCCEEDED, RunStatus.FAILED} and statuses

    wait_for(all_done, timeout=180, worker=celery_worker_process, what="both runs to finish",
             progress=lambda: (list(submission.runs.values_list("status", "progress_done")),
                               "ready." in celery_worker_process.log_tail(100_000)))
    runs = {run.setting: run for run in submission.runs.all()}
    for run in runs.values():
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert PairScore.objects.filter(run=run).count() == 30 == run.progress_done
        assert 0 <= run.metrics["accuracy"] <= 1 and run.metrics["n"] == 30
    # The worker computed exactly what the same code computes in-process.
    expected = in_process_scores(runs["profile"])
    for source_id, chosen, rejected in PairScore.objects.filter(run=runs["profile"]).values_list(
            "item__source_id", "chosen_score", "rejected_score"):
        assert chosen == pytest.approx(expected[source_id][0], abs=1e-5)
        assert rejected == pytest.approx(expected[source_id][1], abs=1e-5)


def test_a_worker_killed_mid_run_is_recovered_and_every_pair_is_scored_once(transactional_db, researcher, tmp_path):
    rows = [make_row(i, profile=[{"id": f"{i}-{j}", "text": "I hike every weekend and keep notes. " * 12,
                                  "category": "Lifestyle_and_Personal_Development"} for j in range(6)])
            for i in range(64)]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    benchmark_import(path=data, name="long")
    model = tiny_rm("slow-rm", hidden=128, layers=4)
    # Short heartbeat/stale periods and small chunks so the test sees a mid-run state quickly.
    env = {"RUN_HEARTBEAT_SECONDS": "1", "RUN_STALE_SECONDS": "3", "RUN_SWEEP_SECONDS": "1", "RUN_CHUNK_PAIRS": "8"}
    purge_broker()
    first = WorkerProcess(name="doomed", env=env).start(tmp_path / "first.log")
    second = None
    try:
        submission = submit_scalar(researcher, "long", model, settings_=("profile",), batch_size=1)
        run = submission.runs.get()
        wait_for(lambda: EvaluationRun.objects.get(pk=run.pk).progress_done >= 16, timeout=180, interval=0.05,
                 worker=first, what="the first worker to score some pairs",
                 progress=progress_of(EvaluationRun, run.pk, first))
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and 16 <= run.progress_done < 64
        killed_at = run.progress_done
        scored_before = dict(PairScore.objects.filter(run=run).values_list("item_id", "chosen_score"))
        assert len(scored_before) >= 16

        second = WorkerProcess(name="rescuer", env=env, beat=True).start(tmp_path / "second.log")
        wait_for_job(run, worker=second, what="the recovered run to finish",
                     until=(RunStatus.SUCCEEDED, RunStatus.FAILED))
    finally:
        first.stop()
        if second:
            second.stop()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.attempts == 2
    assert PairScore.objects.filter(run=run).count() == 64 == run.metrics["n"]
    # Pairs scored before the kill were kept, not scored again.
    after = dict(PairScore.objects.filter(run=run, item_id__in=scored_before).values_list("item_id", "chosen_score"))
    assert after == scored_before
    # Same accuracy as an uninterrupted run of the same model.
    expected = in_process_scores(run)
    uninterrupted = sum(c > r for c, r in expected.values()) / len(expected)
    assert run.metrics["accuracy"] == pytest.approx(uninterrupted)
    assert "re-queued" in second.log_tail(50000) or "re-queue" in second.log_tail(50000)
    print(f"\nRECOVERY | evaluation | units 64 | killed at {killed_at}/64 | SUCCEEDED | duplicates 0 | "
          "requests repeated 0 (a local model)")
