"""The dpo kind through the platform: API submission (policy and reference checked like any model
folder), the worker's task body in process, the leaderboard; the reference is part of the model's identity."""

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import EvaluationRun, PairScore, RunStatus
from leaderboard.selectors import leaderboard_rows
from pipeline.services import benchmark_import
from tests.prblib.test_dpo import build_causal_lm, plain_logp
from leaderboard import identity
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def dpo_models():
    build_causal_lm(settings.MODELS_ROOT / "dpo-policy", seed=1)
    build_causal_lm(settings.MODELS_ROOT / "dpo-reference", seed=2)
    build_causal_lm(settings.MODELS_ROOT / "other-reference", seed=3)
    return settings.MODELS_ROOT


def post(client, **fields):
    body = {"display_name": "Tiny DPO", "benchmark": "sample", "kind": "dpo", "settings": ["no_profile"],
            "model_path": "dpo-policy", "batch_size": 8, **fields}
    return client.post("/api/submissions/", body, format="json")


def test_a_dpo_submission_runs_and_ranks_with_the_rewards_of_the_plain_computation(researcher, dpo_models, tmp_path,
                                                                                   one_torch_thread):
    rows = [make_row(i, chosen=f"Practise wet-on-wet washes {i} times a week.", rejected="Practise.") for i in range(6)]
    benchmark_import(path=write_jsonl(tmp_path / "small.jsonl", rows), name="sample")
    client = APIClient()
    client.force_authenticate(researcher)
    # Checked like any model folder, before anything is queued.
    missing = post(client, options={})
    assert missing.status_code == 400 and "reference" in str(missing.json())
    escaping = post(client, options={"reference": "../etc"})
    assert escaping.status_code == 400 and "relative to the models folder" in str(escaping.json())
    absent = post(client, options={"reference": "no-such-folder"})
    assert absent.status_code == 400 and "does not exist" in str(absent.json())

    response = post(client, options={"reference": "dpo-reference"})
    assert response.status_code == 201, response.content
    run_id = response.json()["runs"][0]["id"]
    assert services.run_execute(run_id=run_id) == RunStatus.SUCCEEDED
    scores = list(PairScore.objects.filter(run_id=run_id).select_related("item").order_by("item__position"))
    assert len(scores) == 6
    # Two pairs recomputed by hand: the plain forward pass of policy and reference (tests/prblib/test_dpo.py).
    worst = 0.0
    for score in scores[:2]:
        item = score.item
        prompt = f"[CLS]<|user|>\n{item.question}<|end|>\n<|assistant|>\n"
        for value, answer in ((score.chosen_score, item.chosen), (score.rejected_score, item.rejected)):
            policy, _ = plain_logp(dpo_models / "dpo-policy", prompt, f"{answer}<|end|>\n")
            reference, _ = plain_logp(dpo_models / "dpo-reference", prompt, f"{answer}<|end|>\n")
            worst = max(worst, abs(value - (policy - reference)))
    print(f"dpo submission: max |stored reward - plain| = {worst:.3g}")
    assert worst < 1e-4
    services.submission_publish(user=researcher, submission=scores[0].run.submission)
    [row] = [r for r in leaderboard_rows(benchmark="sample") if r["kind"] == "dpo"]
    assert row["accuracy"] == pytest.approx(sum(s.correct for s in scores) / 6)
    assert row["kind_label"] == "DPO implicit reward (policy vs reference)"

    # The same policy against another reference is another model; against the same one, a duplicate.
    other = post(client, display_name="Tiny DPO, other reference", options={"reference": "other-reference"})
    assert other.status_code == 201, other.content
    other_run = EvaluationRun.objects.select_related("submission__benchmark").get(pk=other.json()["runs"][0]["id"])
    identity.run_identify(other_run)  # the run's first step: hash the weights, take the fingerprint
    other_run.refresh_from_db()
    assert other_run.status != RunStatus.FAILED
    assert other_run.fingerprint != EvaluationRun.objects.get(pk=run_id).fingerprint
    again = post(client, display_name="Tiny DPO again", options={"reference": "dpo-reference"})
    assert again.status_code == 201
    assert services.run_execute(run_id=again.json()["runs"][0]["id"]) == RunStatus.FAILED
    assert "already evaluated" in EvaluationRun.objects.get(pk=again.json()["runs"][0]["id"]).error
    free = post(client, display_name="Tiny DPO, reference-free", options={"reference_free": True})
    assert free.status_code == 201, free.content
