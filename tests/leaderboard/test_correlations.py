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
    assert text[0] == "outcome best_of_n@16 for policy Qwen2.5-0.5B-Instruct (5 reward models in profile)"
    assert text[1].split()[:3] == ["sample", "profile", "n=5"] and f"spearman={spearman:.3f}" in text[1]
    assert set(api["curves"]) == set(RMS) and [p["k"] for p in api["curves"]["rm-a"]] == [1, 16]
    page = client.get("/correlations/")
    assert page.status_code == 200 and b'id="chart-scatter"' in page.content and b'id="chart-curves"' in page.content
    csv_body = b"".join(client.get("/correlations.csv").streaming_content).decode().splitlines()
    assert csv_body[0].startswith("benchmark,setting,n,spearman") and csv_body[1].startswith("sample,profile,5,")


def test_without_outcomes_the_page_explains_how_to_import_them(client):
    page = client.get("/correlations/")
    assert page.status_code == 200 and b"import_outcomes" in page.content


# --- identity and settings ----------------------------------------------------------------------

def submit(user, bench, name, wrong, setting="profile"):
    """A finished scores submission that gets `wrong` of the first pairs wrong."""
    ids = list(bench.items.order_by("position").values_list("source_id", flat=True))
    submission = services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=name, benchmark=bench.name, kind="scores", settings=(setting,),
        scores_file=scores_upload(bench, wrong=set(ids[:wrong]), name=f"{name}-{setting}.jsonl")))
    services.run_execute(run_id=submission.runs.get().pk)
    services.submission_publish(user=user, submission=submission)  # correlations use public results
    return submission


def test_two_owners_naming_a_model_alike_stay_two_rms_and_a_name_only_import_is_refused(researcher, tmp_path):
    from tests.factories import UserFactory

    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    other = UserFactory(roles=["researcher"])
    mine, theirs = submit(researcher, bench, "rm-a", 0), submit(other, bench, "rm-a", 12)
    rest = [submit(researcher, bench, name, wrong) for name, wrong in (("rm-b", 3), ("rm-c", 6), ("rm-d", 9))]
    by_name = write_outcomes(tmp_path, [("rm-a", "all", 1.5, 30, "", "best_of_n", 16)])
    with pytest.raises(CommandError, match=rf"line 2, field 'rm': 'rm-a' is ambiguous: #{mine.pk} "
                                           rf"\({researcher.username}/rm-a\), #{theirs.pk} \({other.username}/rm-a\)"):
        call_command("import_outcomes", str(by_name))
    assert not DownstreamOutcome.objects.exists()

    path = tmp_path / "outcomes.json"
    values = {mine.pk: 1.6, theirs.pk: 1.0, rest[0].pk: 1.5, rest[1].pk: 1.3, rest[2].pk: 1.2}
    path.write_text(json.dumps([{"submission": pk, "outcome": v, "n": 30, "k": 16, "kind": "best_of_n"}
                                for pk, v in values.items()]))
    call_command("import_outcomes", str(path))
    # A private submission's result and outcome stay out of the public report altogether.
    private = services.submission_create(user=other, request=services.SubmissionRequest(
        display_name="rm-z", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=scores_upload(bench, wrong=set(bench.items.values_list("source_id", flat=True)[:20]),
                                  name="z.jsonl")))
    services.run_execute(run_id=private.runs.get().pk)
    services.outcome_store(submission=private, rm_name="rm-z", source="prbench", kind="best_of_n",
                           policy="Qwen2.5-0.5B-Instruct", setting="profile", domain="", k=16, outcome=1.9, n=30)
    row = correlation_report(kind="best_of_n", k=16)["correlations"][0]
    assert row["n"] == 5 and row["dropped"] == {}
    points = {p["rm"]: (p["key"], p["accuracy"], p["outcome"]) for p in row["points"]}
    assert points[f"{researcher.username}/rm-a"] == (f"submission:{mine.pk}", 1.0, 1.6)
    assert points[f"{other.username}/rm-a"] == (f"submission:{theirs.pk}", 0.6, 1.0)
    assert points["rm-b"] == (f"submission:{rest[0].pk}", 0.9, 1.5)
    # Accuracy and outcome order the five RMs identically.
    assert row["spearman"]["value"] == pytest.approx(1.0) and row["rbo"]["value"] == pytest.approx(1.0)


def test_an_external_model_is_its_source_and_name_and_an_unknown_bare_name_is_refused(tmp_path, evaluated):
    path = tmp_path / "ext.json"
    path.write_text(json.dumps([{"benchmark": "RewardBench", "rm": "rm-a", "source": "paper", "accuracy": 0.7},
                                {"benchmark": "RewardBench", "rm": "rm-a", "accuracy": 0.8}]))
    call_command("import_benchmark_scores", str(path))
    external, ours = ExternalBenchmarkScore.objects.order_by("source")
    assert (external.submission, external.source, external.rm_name) == (None, "paper", "rm-a")
    assert ours.submission.display_name == "rm-a" and ours.source == "prbench"
    path.write_text(json.dumps([{"benchmark": "RewardBench", "rm": "nobody", "accuracy": 0.8}]))
    with pytest.raises(CommandError, match="line 1, field 'rm': no submission named 'nobody'; give 'submission'"):
        call_command("import_benchmark_scores", str(path))


def test_outcomes_of_two_settings_are_kept_apart_and_each_setting_uses_its_own(researcher, tmp_path):
    """The fault: a no_profile Best-of-N outcome overwrote the profile one (0.958 -> 1.0)."""
    from leaderboard.models import OutcomeKind

    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    for setting, wrongs in (("profile", (0, 3, 6)), ("no_profile", (9, 3, 0))):
        for name, wrong in zip(("rm-a", "rm-b", "rm-c"), wrongs):
            sub = submit(researcher, bench, f"{name} {setting}", wrong, setting=setting)
            for policy in ("p1", "p2"):
                services.outcome_store(submission=sub, rm_name=sub.display_name, source="prbench",
                                       kind=OutcomeKind.BEST_OF_N, policy=policy, setting=setting, domain="",
                                       k=16, outcome={"rm-a": 1.9, "rm-b": 1.5, "rm-c": 1.1}[name], n=30)
    services.outcome_store(submission=None, rm_name="x", source="s", kind="best_of_n", policy="p1",
                           setting="profile", domain="", k=16, outcome=0.958, n=3)
    services.outcome_store(submission=None, rm_name="x", source="s", kind="best_of_n", policy="p1",
                           setting="no_profile", domain="", k=16, outcome=1.0, n=3)
    assert sorted(DownstreamOutcome.objects.filter(rm_name="x").values_list("setting", "outcome")) == [
        ("no_profile", 1.0), ("profile", 0.958)]
    rows = {r["setting"]: r for r in correlation_report(kind="best_of_n", k=16, policy="p1")["correlations"]}
    assert rows["profile"]["outcome_setting"] == "profile" and rows["no_profile"]["outcome_setting"] == "no_profile"
    # profile: accuracy order a > b > c like the outcomes; no_profile: reversed.
    assert rows["profile"]["spearman"]["value"] == pytest.approx(1.0)
    assert rows["no_profile"]["spearman"]["value"] == pytest.approx(-1.0)
    assert rows["profile"]["n"] == rows["no_profile"]["n"] == 3
    assert "only 3 RMs" in rows["profile"]["warning"] and rows["profile"]["spearman"]["ci_low"] is None


def test_the_page_shows_the_small_sample_warning_and_p_values_never_read_0(client, researcher, tmp_path):
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    subs = [submit(researcher, bench, name, wrong) for name, wrong in (("a", 0), ("b", 3), ("c", 6))]
    path = tmp_path / "o.json"
    path.write_text(json.dumps([{"submission": s.pk, "outcome": v, "n": 30, "k": 16, "kind": "best_of_n"}
                                for s, v in zip(subs, (1.8, 1.4, 1.1))]))
    call_command("import_outcomes", str(path))
    html = client.get("/correlations/").content.decode()
    assert 'class="notice notice-warning small-sample"' in html and "only 3 RMs" in html
    # Three RMs in perfect order: the t-approximation said "< 1e-16"; exactly, 2 of the 3! = 6
    # orderings are as extreme (rho = 1 or -1), so p = 1/3, and the method is named beside it.
    assert "[1.00, 1.00]" not in html and "&lt; 1e-16" not in html
    assert '0.33 <span class="muted p-method">(exact, all 6 orderings)</span>' in html
    api = APIClient().get("/api/correlations/").json()
    row = api["correlations"][0]
    assert row["spearman"]["ci_low"] is None and row["spearman"]["p_value"] == pytest.approx(1 / 3)
    assert row["spearman"]["p_display"] == "0.33" and row["spearman"]["p_method"] == "exact, all 6 orderings"
    # The CSV names the method beside each p and gives what a random ordering of the 3 RMs gives:
    # rho over the 6 orderings is 1, .5, .5, -.5, -.5, -1: mean 0, sd sqrt(1 / (n - 1)) = sqrt(1/2).
    import csv
    import io
    import math
    body = b"".join(client.get("/correlations.csv").streaming_content).decode()
    csv_row = next(csv.DictReader(io.StringIO(body)))
    assert csv_row["spearman_p_method"] == "exact, all 6 orderings" and float(csv_row["spearman_p"]) == pytest.approx(1 / 3)
    assert float(csv_row["spearman_chance_mean"]) == pytest.approx(0, abs=1e-12)
    assert float(csv_row["spearman_chance_sd"]) == pytest.approx(math.sqrt(1 / 2))
    assert csv_row["chance_method"] == "exact, all 6 orderings"
    assert set(api["definitions"]) >= {"spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted",
                                       "rbo", "ci"}
    assert APIClient().get("/api/correlations/", {"rbo_p": "2"}).status_code == 400
    assert client.get("/correlations/", {"ndcg_k": "x"}).status_code == 400


def test_correlate_json_has_every_metric_with_its_ci_and_definitions(evaluated, tmp_path, capsys):
    rows = [(rm, "all", value, 30, "prbench", "best_of_n", 16) for rm, value in OUTCOMES.items()]
    call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    call_command("correlate", "--format", "json", "--ndcg-k", "3", "--rbo-p", "0.8")
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = report["correlations"][0]
    assert (row["benchmark"], row["setting"], row["n"], row["ndcg_k"], row["rbo_p"]) == ("sample", "profile", 5, 3, 0.8)
    for name in ("spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo"):
        assert {"value", "ci_low", "ci_high"} <= set(row[name]) and row[name]["ci_low"] is not None, name
    assert "p = 0.8" in report["definitions"]["rbo"] and "@3" in report["definitions"]["ndcg"]
    call_command("correlate")
    assert "weighted_tau=" in capsys.readouterr().out


# --- the worked example of the README: 5 RMs, two settings, two policies --------------------------

EXAMPLE_WRONG = {"profile": {"A": 2, "B": 5, "C": 8, "D": 11, "E": 14},
                 "no_profile": {"A": 9, "B": 6, "C": 10, "D": 12, "E": 13}}
EXAMPLE_OUTCOME = {  # Best-of-16, judged rubric score 0-2
    ("Qwen2.5-0.5B-Instruct", "profile"): {"A": 1.62, "B": 1.55, "C": 1.31, "D": 1.35, "E": 1.02},
    ("Qwen2.5-0.5B-Instruct", "no_profile"): {"A": 1.40, "B": 1.48, "C": 1.12, "D": 1.18, "E": 1.05},
    ("Llama-3.2-1B-Instruct", "profile"): {"A": 1.71, "B": 1.48, "C": 1.52, "D": 1.20, "E": 1.33},
    ("Llama-3.2-1B-Instruct", "no_profile"): {"A": 1.45, "B": 1.38, "C": 1.30, "D": 1.25, "E": 1.28},
}


def test_worked_example_five_rms_two_settings_two_policies(researcher, tmp_path, capsys):
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    subs = {(setting, rm): submit(researcher, bench, f"RM-{rm} {setting}", wrong, setting=setting)
            for setting, table in EXAMPLE_WRONG.items() for rm, wrong in table.items()}
    path = tmp_path / "outcomes.json"
    path.write_text(json.dumps([
        {"submission": subs[(setting, rm)].pk, "kind": "best_of_n", "k": 16, "policy": policy, "setting": setting,
         "outcome": value, "n": 30} for (policy, setting), table in EXAMPLE_OUTCOME.items()
        for rm, value in table.items()]))
    call_command("import_outcomes", str(path))
    figures, lines, pvals = {}, [], []
    for policy in ("Qwen2.5-0.5B-Instruct", "Llama-3.2-1B-Instruct"):
        call_command("correlate", "--format", "json", "--policy", policy)
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        for row in report["correlations"]:
            pvals.append((policy, row["setting"], row["spearman"]["p_value"], row["kendall"]["p_value"]))
            figures[(policy, row["setting"])] = {m: row[m]["value"] for m in (
                "spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo")}
            shown = [f"{m}={row[m]['value']:.3f}[{row[m]['ci_low']:.3f},{row[m]['ci_high']:.3f}]" for m in (
                "spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo")]
            lines.append(f"{policy:<22} {row['setting']:<10} n={row['n']} " + " ".join(shown)
                         + f" p(rho)={row['spearman']['p_display']} p(tau)={row['kendall']['p_display']}")
            assert row["n"] == 5 and row["warning"] is None and row["outcome_setting"] == row["setting"]
    with capsys.disabled():
        print("\nworked example\n" + "\n".join(lines))
    # Accuracy orders profile A > B > C > D > E and no_profile B > A > C > D > E. One adjacent swap
    # of ten pairs gives tau-b 0.8 and rho 0.9; two disjoint adjacent swaps give 0.6 and 0.8.
    expected = {("Qwen2.5-0.5B-Instruct", "profile"): (0.9, 0.8),      # outcome A B D C E
                ("Qwen2.5-0.5B-Instruct", "no_profile"): (0.9, 0.8),   # outcome B A D C E
                ("Llama-3.2-1B-Instruct", "profile"): (0.8, 0.6),      # outcome A C B E D
                ("Llama-3.2-1B-Instruct", "no_profile"): (0.8, 0.6)}   # outcome A B C E D
    for key, (rho, tau) in expected.items():
        assert figures[key]["spearman"] == pytest.approx(rho) and figures[key]["kendall"] == pytest.approx(tau), key
    assert figures[("Qwen2.5-0.5B-Instruct", "profile")]["weighted_tau"] == pytest.approx(0.8722627737, abs=1e-9)
    assert figures[("Qwen2.5-0.5B-Instruct", "profile")]["rbo"] == pytest.approx(0.973, abs=1e-9)
    # Exact permutation p over the 5! = 120 orderings (the README's example): one adjacent swap, rho 0.9
    # and tau 0.8 are reached by 5 orderings each way: 10/120 (the t-approximation said 0.037 for rho);
    # two disjoint swaps: rho >= 0.8 by 1 + 4 + 3 = 8 orderings, 16/120; tau >= 0.6 (at most 2
    # inversions) by 1 + 4 + 9 = 14, 28/120.
    p_values = {(policy, setting): (p_rho, p_tau) for policy, setting, p_rho, p_tau in pvals}
    assert p_values[("Qwen2.5-0.5B-Instruct", "profile")] == (pytest.approx(10 / 120), pytest.approx(10 / 120))
    assert p_values[("Llama-3.2-1B-Instruct", "no_profile")] == (pytest.approx(16 / 120), pytest.approx(28 / 120))


def test_with_too_few_rms_the_page_says_why_there_are_no_figures_and_what_to_run(client, researcher, tmp_path):
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    subs = [submit(researcher, bench, name, wrong) for name, wrong in (("a", 0), ("b", 3))]
    path = tmp_path / "o.json"
    path.write_text(json.dumps([{"submission": s.pk, "outcome": v, "n": 30, "k": 16, "kind": "best_of_n"}
                                for s, v in zip(subs, (1.8, 1.4))]))
    call_command("import_outcomes", str(path))
    html = client.get("/correlations/").content.decode()
    assert ('<p class="notice notice-warning no-figures" role="status"><strong>sample · with profile:</strong> no figures: '
            "need at least 3 RMs with both a benchmark score and an outcome, got 2.") in html
    assert "manage.py import_outcomes FILE" in html and "small-sample" not in html


def test_a_figure_and_its_interval_share_one_precision():
    from django.template.loader import render_to_string

    e = {"value": 0.998, "ci_low": 0.9951, "ci_high": 1.0}
    three = render_to_string("leaderboard/_metric.html", {"e": e, "digits": 3})
    assert three == '0.998 <span class="muted">[0.995, 1.000]</span>\n'  # was 0.998 [1.00, 1.00]
    assert render_to_string("leaderboard/_metric.html", {"e": e}) == '1.00 <span class="muted">[1.00, 1.00]</span>\n'


def test_the_page_names_settings_by_their_labels_and_counts_made_up_outcomes(client, evaluated, tmp_path):
    import re

    from leaderboard.models import DownstreamOutcome

    rows = [(rm, "all", value, 30, "prbench", "best_of_n", 16) for rm, value in OUTCOMES.items()]
    call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    DownstreamOutcome.objects.update(source="synthetic demo (seed_demo)", synthetic=True)  # as seed_demo marks them
    html = client.get("/correlations/").content.decode()
    row = re.search(r'<tr data-benchmark="sample" data-setting="profile">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r"<td>([^<]*)</td>", row)[:2] == ["With profile", "With profile"]  # setting, outcomes' setting
    assert '<option value="">Same as the row (others: with profile)</option>' in html
    note = html.split('id="synthetic-note"')[1].split("</p>")[0]
    assert "The outcomes of 5 reward models here are made up for the demo" in note and "synthetic demo (" not in note
    cells = re.findall(r'<td class="num">(-?\d\.\d+) <span class="muted">\[(-?\d\.\d+), (-?\d\.\d+)\]', row)
    assert len(cells) == 7 and len(cells[4][0]) == len("0.998")  # every metric with a CI; NDCG with 3 decimals
    for cell in cells:
        assert len({len(x.split(".")[1]) for x in cell}) == 1, cell  # value and CI: one precision
    assert '<script id="setting-labels" type="application/json">{"no_profile": "Without profile"' in html


def test_an_outcome_kind_without_outcomes_draws_no_empty_charts(client, evaluated, tmp_path):
    """Best-of-N outcomes exist (made up, as seed_demo's), but none of PPO: the PPO view says why
    there are no figures and draws no axes without points, loads no plotly and does not warn that
    the outcomes shown are made up (none are shown)."""
    from leaderboard.models import DownstreamOutcome

    rows = [(rm, "all", value, 30, "prbench", "best_of_n", 16) for rm, value in OUTCOMES.items()]
    call_command("import_outcomes", str(write_outcomes(tmp_path, rows)))
    DownstreamOutcome.objects.update(source="synthetic demo (seed_demo)", synthetic=True)  # as seed_demo marks them
    shown = client.get("/correlations/").content.decode()
    assert 'id="chart-scatter"' in shown and 'id="chart-bars"' in shown and 'id="synthetic-note"' in shown
    html = client.get("/correlations/", {"outcome": "ppo"}).content.decode()
    assert 'class="notice notice-warning no-figures"' in html and 'id="correlation-table"' in html
    for absent in ('id="chart-scatter"', 'id="chart-bars"', 'id="chart-curves"', "plotly", 'id="synthetic-note"'):
        assert absent not in html, absent
