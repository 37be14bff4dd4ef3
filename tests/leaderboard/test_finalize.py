"""One finaliser: `evaluate_rm` and the worker summarise the same per-pair results identically,
calibration for every kind, and P-GenRM's parse-failure rate counted over chains."""

import json

import pytest
from django.conf import settings
from django.core.management import call_command

from leaderboard import services
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import, rm_summarize
from tests.leaderboard.test_pgenrm_submissions import judge as chain_judge
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE, write_jsonl
from tests.pipeline.test_pair_history import history_row

pytestmark = pytest.mark.django_db

CLI_ONLY = ("benchmark", "model", "kind", "setting")
SAME_IN_BOTH = ("code_version", "python", "libraries", "kind", "setting", "benchmark", "benchmark_content_hash",
                "dtype", "max_length", "batch_size", "profile_k", "templates")


def same_manifest(cli: dict, worker: dict) -> None:
    """Both record what reproduces them; where they know the same thing they say the same."""
    cli_manifest, worker_manifest = cli.pop("manifest"), worker.pop("manifest")
    assert {k: cli_manifest[k] for k in SAME_IN_BOTH} == {k: worker_manifest[k] for k in SAME_IN_BOTH}
    assert len(worker_manifest["weights_hash"]) == 64 and worker_manifest["libraries"]["scipy"]


def cli_summary(capsys, *args) -> dict:
    call_command("evaluate_rm", *args, "-v", "0")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return {k: v for k, v in summary.items() if k not in CLI_ONLY}


def test_the_cli_and_the_worker_give_identical_summaries_for_a_scalar_rm(client, researcher, capsys):
    benchmark_import(path=SAMPLE, name="sample")
    build_decoder_rm(settings.MODELS_ROOT / "rm")
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="tiny", benchmark="sample", kind="scalar", settings=("profile",), model_path="rm"))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED"
    run.refresh_from_db()
    cli = cli_summary(capsys, "--benchmark", "sample", "--model", str(settings.MODELS_ROOT / "rm"), "--kind", "scalar",
                      "--setting", "profile")
    same_manifest(cli, run.metrics)
    assert cli == run.metrics
    assert cli["calibration"]["n"] == 30 and cli["calibration"]["ece"] is not None
    client.force_login(researcher)
    html = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert 'class="manifest"' in html and submission.weights_hash in html  # what reproduces it, on its page


def test_the_cli_and_the_worker_give_identical_summaries_for_pgenrm(client, researcher, fake_openai, tmp_path,
                                                                    capsys):
    rows = [history_row(i) for i in range(6)]
    call_command("import_benchmark", str(write_jsonl(tmp_path / "prism.jsonl", rows)), "--name", "prism-like")
    fake_openai.responder = chain_judge
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=1)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="P-GenRM", benchmark="prism-like", kind="pgenrm", settings=("profile",), judge_backend="judge",
        model_path="chain-model", options={"m": 2, "n": 0}))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    run.refresh_from_db()
    assert run.metrics["manifest"]["templates"] == {"chain": "pgenrm-native@v1"}
    client.force_login(researcher)
    html = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert 'class="muted templates"' in html and "chain <code>pgenrm-native@v1</code>" in html
    cli = cli_summary(capsys, "--benchmark", "prism-like", "--model", "chain-model", "--kind", "pgenrm",
                      "--setting", "profile", "--endpoint", "judge", "--option", "m=2", "--option", "n=0")
    # Usage differs only in the worker's LLM cache counters (the CLI runs without the cache).
    cache = ("cache_hits", "cache_misses")
    worker_usage, cli_usage = run.metrics.pop("usage"), cli.pop("usage")
    same_manifest(cli, run.metrics)
    assert cli == run.metrics
    assert {k: v for k, v in cli_usage.items() if k not in cache} == {
        k: v for k, v in worker_usage.items() if k not in cache}
    assert cli_usage["requests"] == 12 and worker_usage["cache_misses"] == 12
    assert {(p["m"], p["n"]) for p in cli["scaling"]} == {(1, 0), (2, 0)}
    assert cli["judge"] == {"judgments": 2 * cli["n"], "parse_failures": 0, "parse_failure_rate": 0.0,
                            "failures_by_reason": {}}


def test_pgenrm_parse_failure_rate_is_failed_chains_over_chains():
    """The fault: 33 failed of 120 chains (60 pairs, m = 2) printed 0.55 (over 2 x pairs); it is 0.275."""
    ok = {"chosen_total": 9.0, "rejected_total": 3.0, "failure": None}
    bad = {"chosen_total": None, "rejected_total": None, "failure": "no_json"}
    rows = []
    for i in range(60):
        chains = [bad if 2 * i + j < 33 else ok for j in range(2)]
        details = {"m": 2, "n": 0, "chains": chains, "neighbours": [],
                   "parse_failures": sum(c is bad for c in chains)}
        rows.append(("society_culture", True, False, details, 1.0, 0.0))
    judge = rm_summarize(rows, kind="pgenrm", options={"m": 2, "n": 0})["judge"]
    assert judge == {"judgments": 120, "parse_failures": 33, "parse_failure_rate": 0.275, "failures_by_reason": {}}


def test_judges_and_pgenrm_are_calibrated_from_their_verdict_shares():
    # Pairwise, both orders: 8 pairs 2/2 for chosen, 4 pairs split 1/1; P-GenRM: shares from chain totals.
    orders = [{"chosen_position": "A", "verdict": "A"}, {"chosen_position": "B", "verdict": "B"}]
    split = [{"chosen_position": "A", "verdict": "A"}, {"chosen_position": "B", "verdict": "A"}]
    rows = [("society_culture", True, False, {"orders": orders, "parse_failures": 0}, 2.0, 0.0)] * 8 + [
        ("society_culture", False, True, {"orders": split, "parse_failures": 0}, 1.0, 1.0)] * 4
    cal = rm_summarize(rows, kind="pairwise")["calibration"]
    # Rows (1, 1) x8, (0, 0) x8, (0.5, 1) x4, (0.5, 0) x4: Brier = 8 * 0.25 / 24; Brier skill against
    # the uninformed 0.25: 1 - (2/24) / 0.25 = 2/3. No ECE (a judge always answering "A" would get 0).
    assert cal["n"] == 12 and cal["brier"] == pytest.approx(2 / 24) and cal["ece"] is None
    assert cal["brier_skill"] == pytest.approx(2 / 3)
    assert cal["mean_share"] == pytest.approx((8 + 2) / 12)
    chains = [{"chosen_total": 9.0, "rejected_total": 3.0}, {"chosen_total": 3.0, "rejected_total": 9.0},
              {"chosen_total": 5.0, "rejected_total": 5.0}, {"chosen_total": None, "rejected_total": None}]
    from pipeline.services import verdict_share

    assert verdict_share({"chains": chains, "neighbours": []}) == pytest.approx(0.5)
    assert verdict_share({"chains": chains[:1], "neighbours": chains[2:3]}) == pytest.approx(0.75)
    assert verdict_share({"chains": chains[3:], "neighbours": []}) is None
