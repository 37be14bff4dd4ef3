"""Every model preset through a real Celery worker (issue 30): one submission per preset, all queued at
once, run by one worker process; accuracies as fixed by hand in preset_cases, and each in its RM type's
group of the paper table. (The per-preset checks of prompts and parameters: test_presets.py.)"""

import pytest
from django.conf import settings

from leaderboard.models import EvaluationRun, RunStatus
from leaderboard.paper import paper_table
from prblib.rewards import presets
from tests.conftest import WORKER_TEST_TIMEOUT, wait_for
from tests.leaderboard import preset_cases as cases
from tests.leaderboard.test_presets import ALL_PRESETS, submit_preset, world  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(WORKER_TEST_TIMEOUT)]


def test_a_worker_runs_every_preset(world, celery_worker_process):  # noqa: F811
    submissions = {name: submit_preset(world, name) for name in ALL_PRESETS}
    runs = EvaluationRun.objects.filter(submission__in=submissions.values())

    def done():
        statuses = list(runs.values_list("status", flat=True))
        return all(s in (RunStatus.SUCCEEDED, RunStatus.FAILED) for s in statuses) and statuses

    wait_for(done, timeout=240, worker=celery_worker_process, what="every preset's run to finish",
             progress=lambda: (sorted(runs.values_list("status", "progress_done")),
                               "ready." in celery_worker_process.log_tail(100_000)))
    for name, submission in submissions.items():
        run = submission.runs.get()
        assert run.status == RunStatus.SUCCEEDED, (name, run.error)
        assert run.metrics["n"] == 12 and run.metrics["manifest"]["options"]["model_preset"] == name
        if name in cases.JUDGE_CASES:
            assert run.metrics["accuracy"] == pytest.approx(cases.JUDGE_EXPECTED["all"]), name
        else:
            items = submission.benchmark.items.order_by("position")
            reference = cases.reference_scalar_scores(settings.MODELS_ROOT / f"tiny-{name}",
                                                      [(i.source_id, i.question, (i.chosen, i.rejected)) for i in items])
            assert run.metrics["accuracy"] == pytest.approx(sum(d > 0 for d in reference.values()) / 12), name
        submission.published = True
        submission.save(update_fields=["published"])
    table = paper_table(benchmark="presets")
    grouped = {r["preset"]: g["rm_type"] for g in table["groups"] for r in g["rows"]}
    assert grouped == {name: presets.preset(name).rm_type for name in ALL_PRESETS}
