"""Recovery of every kind of long work after `kill -9` of its worker: a second worker picks
the job up (stale sweep), and it finishes with each unit done exactly once; for LLM work no
request is paid twice beyond the one in flight when the worker died (endpoints limited to
one request at a time). Evaluation runs: tests/leaderboard/test_worker.py.

The worker is killed from inside the fake OpenAI endpoint when the K-th request arrives, so
the moment of the kill is the same on every run. Each test prints one line of the recovery
table: kind, units, killed at (units done), finished, duplicates."""

import json
import signal
import threading
from collections import Counter

import pytest
from django.conf import settings

from jobs.services import job_enqueue
from leaderboard import services
from leaderboard.models import BestOfNRun, BestOfNSample, PPOAnswer, PPORun
from pipeline.build import build_enqueue
from pipeline.downstream import samples_enqueue, samples_generate
from pipeline.models import LLMEndpoint, PolicySample, PolicySampleSet
from tests.conftest import WORKER_TEST_TIMEOUT, WorkerProcess, progress_of, purge_broker, wait_for, wait_for_job
from tests.leaderboard.test_best_of_n import grade, tiny_world
from tests.prblib.fake_openai import text
from tests.pipeline.test_build import answer, lamp_folder, new_build  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(WORKER_TEST_TIMEOUT)]

# Short heartbeat and stale periods so a dead worker is noticed within seconds.
ENV = {"RUN_HEARTBEAT_SECONDS": "1", "RUN_STALE_SECONDS": "3", "RUN_SWEEP_SECONDS": "1", "RUN_CHUNK_PAIRS": "2"}


class KillAt:
    """A fake-endpoint responder that SIGKILLs the worker when the `at`-th request arrives (that
    request is the one in flight), then answers with `respond`."""

    def __init__(self, respond, at: int):
        self.respond, self.at, self.count, self.worker = respond, at, 0, None
        self._lock = threading.Lock()

    def __call__(self, body):
        with self._lock:
            self.count += 1
            kill = self.count == self.at and self.worker is not None
        if kill:
            self.worker.proc.send_signal(signal.SIGKILL)
        return self.respond(body)


def kill_and_recover(job, start, killer: KillAt, tmp_path) -> tuple[int, int]:
    """Run the job on a worker that gets killed, then on a second one. Returns (units done
    when the first worker died, units in all)."""
    purge_broker()
    first = WorkerProcess(name="doomed", env=ENV).start(tmp_path / "first.log")
    killer.worker, second = first, None
    try:
        start()
        wait_for(lambda: first.proc.poll() is not None, timeout=240, what=f"the {job.job_type} worker to be killed",
                 progress=progress_of(type(job), job.pk, first))
        assert first.proc.returncode == -signal.SIGKILL, first.log_tail()
        job.refresh_from_db()
        assert job.status == "RUNNING", (job.status, job.error)
        killed_at = job.progress_done
        second = WorkerProcess(name="rescuer", env=ENV, beat=True).start(tmp_path / "second.log")
        wait_for_job(job, worker=second, what=f"the recovered {job.job_type} job to finish",
                     until=("SUCCEEDED", "FAILED"))
    finally:
        first.stop()
        if second:
            second.stop()
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", job.error
    assert job.attempts == 2  # claimed by the killed worker, then by the rescuer
    return killed_at, job.progress_total


def repeated_requests(fake_openai) -> Counter:
    """Requests sent more than once (same messages, seed and n), with their counts."""
    keys = Counter(json.dumps({k: b.get(k) for k in ("messages", "seed", "n", "model")}, sort_keys=True)
                   for b in fake_openai.bodies)
    return Counter({k: c for k, c in keys.items() if c > 1})


def report(kind: str, units: int, killed_at: tuple[int, int], repeats: int) -> None:
    """One row of the recovery table; duplicates are 0 by the unique keys the tests check."""
    print(f"\nRECOVERY | {kind} | units {units} | killed at {killed_at[0]}/{killed_at[1]} | SUCCEEDED | "
          f"duplicates 0 | requests repeated {repeats}")


def test_policy_sampling_recovers_after_its_worker_is_killed(researcher, fake_openai, tmp_path):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=8)
    endpoint = LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=0,
                                          max_concurrency=1)
    killer = KillAt(lambda body: f"Sample {sum(map(ord, json.dumps(body)))} with several words in it.", at=5)
    fake_openai.responder = killer
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=endpoint,
                                                model="m", n=2)
    killed = kill_and_recover(sample_set, lambda: samples_enqueue(sample_set=sample_set), killer, tmp_path)
    assert 0 < killed[0] < 8
    assert PolicySample.objects.filter(sample_set=sample_set).count() == 8 * 2
    repeated = repeated_requests(fake_openai)
    assert sum(c - 1 for c in repeated.values()) <= 1  # only the request in flight when the worker died
    report("policy sampling", 8, killed, sum(c - 1 for c in repeated.values()))


def test_best_of_n_recovers_after_its_worker_is_killed(researcher, fake_openai, tmp_path):
    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=6)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_concurrency=1)
    fake_openai.responder = lambda body: text([f"Sampled answer {i} about painting, {sum(map(ord, json.dumps(body)))}, "
                                               "long enough to be graded." for i in range(body.get("n") or 1)])
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="p", endpoint=judge,
                                                model="m", n=4)
    assert samples_generate(sample_set=sample_set) == "SUCCEEDED"
    before = len(fake_openai.requests)
    killer = KillAt(grade, at=4)
    fake_openai.responder = killer
    run = BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=judge, judge_model="grader")
    killed = kill_and_recover(run, lambda: job_enqueue(run), killer, tmp_path)
    units = BestOfNSample.objects.filter(run=run)
    assert units.count() == 6 * 4  # every sample scored once (unique per run, item, index)
    judged = units.filter(judged=True).count()
    prompts = Counter(json.dumps(b["messages"]) for b in fake_openai.bodies[before:])
    assert len(prompts) == judged  # every picked sample judged, each with its own prompt
    repeats = sum(prompts.values()) - len(prompts)
    assert repeats <= 1  # only the request in flight when the worker died
    assert run.results["rm"].keys() == {"1", "2", "4"}
    report("Best-of-N", units.count() + judged, killed, repeats)


def test_ppo_recovers_after_its_worker_is_killed_without_training_again(researcher, fake_openai, tmp_path):
    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=12)
    LLMEndpoint.objects.filter(pk=judge.pk).update(max_concurrency=1)
    killer = KillAt(grade, at=2)
    fake_openai.responder = killer
    run = PPORun.objects.create(submission=submission, policy="tiny", policy_model="policy", judge=judge,
                                judge_model="grader", steps=2, batch_size=2, response_length=8, eval_fraction=0.4)
    killed = kill_and_recover(run, lambda: job_enqueue(run), killer, tmp_path)
    answers = PPOAnswer.objects.filter(run=run)
    held = answers.count()
    assert held >= 3 and answers.filter(judged=True).count() == held
    prompts = Counter(json.dumps(b["messages"]) for b in fake_openai.bodies)
    repeats = sum(prompts.values()) - len(prompts)
    assert repeats <= 1  # only the request in flight when the worker died
    # Trained once, by the first worker: the rescuer reused the policy in the run's own folder
    # (named by id and creation time, so folders left in VAR_DIR by earlier sessions never match).
    key = services.ppo_run_key(run)
    out_dirs = sorted(p.name for p in (settings.VAR_DIR / "ppo").glob(f"*{key}*"))
    assert out_dirs == [f"{key}-policy"] and run.results["training"]["out_dir"].endswith(out_dirs[0])
    assert "reusing the policy trained earlier" in (tmp_path / "second.log").read_text(errors="replace")
    report("PPO", 1 + 2 * held, killed, repeats)


def test_a_build_recovers_after_its_worker_is_killed(staff_user, lamp_folder, fake_openai, tmp_path):  # noqa: F811
    from pipeline.models import BuildRun

    killer = KillAt(answer, at=5)
    fake_openai.responder = killer
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=0, max_concurrency=1)
    build = new_build(staff_user, name="recovered-v1", planner="", planner_model="")
    killed = kill_and_recover(build, lambda: build_enqueue(build=build), killer, tmp_path)
    build = BuildRun.objects.get(pk=build.pk)
    assert build.benchmark.item_count == 6 and build.counts["generated"] == 6
    repeated = repeated_requests(fake_openai)
    assert sum(c - 1 for c in repeated.values()) <= 1  # only the request in flight when the worker died
    report("build", 6 * 2, killed, sum(c - 1 for c in repeated.values()))
