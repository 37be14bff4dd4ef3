"""Downstream outcomes, other benchmarks' accuracies, and the correlation figures."""

import json

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient
from scipy import stats

from leaderboard import services
from leaderboard.models import DownstreamOutcome, ExternalBenchmarkScore
from leaderboard.selectors import correlation_report
from pipeline.services import benchmark_import
from tests.leaderboard.test_submissions import scores_upload
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

# Accuracy on our benchmark will be 1 - wrong/30; outcomes are made to follow it except one swap.
RMS = {"rm-a": 0, "rm-b": 3, "rm-c": 6, "rm-d": 9, "rm-e": 12}
OUTCOMES = {"rm-a": 1.62, "rm-b": 1.55, "rm-c": 1.31, "rm-d": 1.35, "rm-e": 1.02}


def evaluate_rms(researcher):
    """The sample benchmark with one finished 'profile' run per RM in RMS."""
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    ids = list(bench.items.order_by("position").values_list("source_id", flat=True))
    for name, wrong in RMS.items():
        submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(bench, wrong=set(ids[:wrong]), name=f"{name}.jsonl")))
        services.run_execute(run_id=submission.runs.get().pk)
        services.submission_publish(user=researcher, submission=submission)  # correlations use public results
    return bench


@pytest.fixture
def evaluated(researcher):
    return evaluate_rms(researcher)


def write_outcomes(tmp_path, rows, name="outcomes.csv"):
    path = tmp_path / name
    if name.endswith(".csv"):
        header = "rm,domain,outcome,n,source,kind,k\n"
        path.write_text(header + "".join(",".join(str(v) for v in r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


def test_outcomes_import_all_or_nothing_with_the_line_named(tmp_path):
    rows = [("rm-a", "all", 1.5, 100, "paper", "best_of_n", 16), ("rm-b", "all", "high", 100, "paper", "best_of_n", 16)]
    with pytest.raises(CommandError, match=r"outcomes.csv, line 3, field 'outcome': 'high' is not a number"):
        call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    assert not DownstreamOutcome.objects.exists()
    bad_kind = [("rm-a", "all", 1.5, 100, "paper", "dpo", "")]
    with pytest.raises(CommandError, match="a PPO outcome must come from PPO"):
        call_command("import_outcomes", str(write_outcomes(tmp_path, bad_kind)))
    ok = [("rm-a", "all", 1.5, 100, "paper", "ppo", "")]
    call_command("import_outcomes", str(write_outcomes(tmp_path, ok)))
    call_command("import_outcomes", str(write_outcomes(tmp_path, ok)))  # re-import updates, never duplicates
    outcome = DownstreamOutcome.objects.get()
    assert (outcome.kind, outcome.domain, outcome.k, outcome.source) == ("ppo", "", None, "paper")


def test_correlations_equal_scipy_for_our_benchmark_and_an_imported_one(evaluated, tmp_path):
    rows = [(rm, "all", value, 30, "prbench", "best_of_n", 16) for rm, value in OUTCOMES.items()]
    call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    external = tmp_path / "rewardbench.json"
    external.write_text(json.dumps([{"benchmark": "RewardBench", "rm": rm, "accuracy": acc} for rm, acc in
                                    {"rm-a": 81.0, "rm-b": 90.5, "rm-c": 70.2, "rm-d": 88.0, "rm-e": 75.0}.items()]))
    call_command("import_benchmark_scores", str(external))
    assert ExternalBenchmarkScore.objects.get(rm_name="rm-b").accuracy == pytest.approx(0.905)

    report = correlation_report(kind="best_of_n", k=16)
    by_name = {(r["benchmark"], r["setting"]): r for r in report["correlations"]}
    ours = by_name[("sample", "profile")]
    acc = [1 - RMS[rm] / 30 for rm in sorted(RMS)]
    out = [OUTCOMES[rm] for rm in sorted(RMS)]
    assert ours["n"] == 5
    assert ours["spearman"]["value"] == pytest.approx(stats.spearmanr(acc, out).statistic)
    assert ours["kendall"]["p_value"] == pytest.approx(stats.kendalltau(acc, out).pvalue)
    assert ours["pearson"]["value"] == pytest.approx(stats.pearsonr(acc, out).statistic)
    assert ours["spearman"]["value"] > by_name[("RewardBench", "")]["spearman"]["value"]
    assert {p["rm"] for p in ours["points"]} == set(RMS)


def test_the_api_page_csv_and_command_report_the_same_figures(client, evaluated, tmp_path, capsys):
    rows = [(rm, "all", value, 30, "prbench", "best_of_n", k) for rm, value in OUTCOMES.items() for k in (1, 16)]
    call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    api = APIClient().get("/api/correlations/", {"outcome": "best_of_n", "k": 16}).json()
    call_command("correlate", "--outcome", "best_of_n", "--k", "16", "--format", "json")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == api
    call_command("correlate", "--outcome", "best_of_n", "--k", "16")  # the text output mode
    text = capsys.readouterr().out.splitlines()
    spearman = api["correlations"][0]["spearman"]["value"]
    assert text[0] == "outcome best_of_n@16 for policy Qwen2.5-0.5B-Instruct (5 reward models)"
    assert text[1].split()[:3] == ["sample", "profile", "n=5"] and f"spearman={spearman:.3f}" in text[1]
    assert set(api["curves"]) == set(RMS) and [p["k"] for p in api["curves"]["rm-a"]] == [1, 16]
    page = client.get("/correlations/")
    assert page.status_code == 200 and b'id="chart-scatter"' in page.content and b'id="chart-curves"' in page.content
    csv_body = b"".join(client.get("/correlations.csv").streaming_content).decode().splitlines()
    assert csv_body[0].startswith("benchmark,setting,n,spearman") and csv_body[1].startswith("sample,profile,5,")


def test_without_outcomes_the_page_explains_how_to_import_them(client):
    page = client.get("/correlations/")
    assert page.status_code == 200 and b"import_outcomes" in page.content
