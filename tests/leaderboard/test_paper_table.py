"""The paper's table (issue 30): rows grouped by RM type, setting x domain columns with "All" and "Avg",
CIs, significance marks, reported figures in rows of their own, and the same content as LaTeX
(booktabs), Markdown and CSV. The per-pair outcomes are made by hand, so every mark is known:

- alpha (scalar preset): right on all 12 pairs without and with profile;
- beta (a pairwise judge, no preset: generative): without profile right on q0-q3 only (the arts pairs),
  with profile right on all 12.
Per-domain columns hold 4 pairs: 0/4 against 4/4 is p = 2 * 0.5**4 = 0.125, never significant, so
every row there is in the top group. Column "without profile: All": alpha 12/12, beta 4/12; the 8 discordant pairs all favour alpha, exact
McNemar p = 2 * 0.5**8 = 0.0078 < 0.05, so only alpha is in the top group (dagger) and bold. Column "with
profile: All": both 12/12, both bold and dagger. beta with against without profile: 8 discordant pairs all
for "with", p = 0.0078: an up arrow on beta's "with profile: All"; per domain at most 4 discordant pairs
(p >= 0.125): no arrow there.
"""

import csv
import io

import pytest
from django.core.management import call_command
from django.urls import reverse

from leaderboard.models import EvaluationRun, PairScore, Submission
from leaderboard.paper import paper_table, table_latex, table_markdown
from pipeline.models import Benchmark, BenchmarkItem
from pipeline.services import benchmark_import
from tests.leaderboard import preset_cases as cases

pytestmark = pytest.mark.django_db
DOMAINS = ("arts_entertainment", "lifestyle_personal_development", "society_culture")


def make_result(owner, name: str, kind: str, options: dict, correct: dict[str, set[int]], *, published=True):
    """A submission with one succeeded run per setting, right exactly on the pairs `correct[setting]`."""
    submission = Submission.objects.create(owner=owner, display_name=name, benchmark_id=BENCH["id"], kind=kind,
                                           model_path=name, weights_hash=name * 4, options=options,
                                           published=published)
    items = list(BenchmarkItem.objects.filter(benchmark_id=BENCH["id"]).order_by("position"))
    for setting, right in correct.items():
        by_domain = {}
        for d in DOMAINS:
            in_domain = [i for i, item in enumerate(items) if item.domain == d]
            acc = sum(i in right for i in in_domain) / len(in_domain)
            by_domain[d] = {"accuracy": acc, "ci_low": max(acc - 0.25, 0), "ci_high": min(acc + 0.25, 1), "n": 4}
        acc = len(right) / 12
        run = EvaluationRun.objects.create(
            submission=submission, setting=setting, fingerprint=f"{name}-{setting}", status="SUCCEEDED",
            metrics={"accuracy": acc, "ci_low": max(acc - 0.1, 0), "ci_high": min(acc + 0.1, 1), "n": 12,
                     "by_domain": by_domain})
        PairScore.objects.bulk_create([PairScore(run=run, item=item, chosen_score=1.0 if i in right else 0.0,
                                                 rejected_score=0.0 if i in right else 1.0, correct=i in right)
                                       for i, item in enumerate(items)])
    return submission


BENCH = {}


@pytest.fixture
def world(researcher, tmp_path):
    benchmark_import(path=cases.benchmark_file(tmp_path), name="paper-bench")
    BENCH["id"] = Benchmark.objects.get(name="paper-bench").pk
    everything = set(range(12))
    make_result(researcher, "alpha", "scalar", {"model_preset": "skywork-reward-v2-llama"},
                {"no_profile": everything, "profile": everything})
    make_result(researcher, "beta_judge", "pairwise", {}, {"no_profile": {0, 1, 2, 3}, "profile": everything})
    make_result(researcher, "hidden", "scalar", {}, {"no_profile": everything}, published=False)
    reported = tmp_path / "table2.csv"
    reported.write_text("benchmark,rm,source,setting,domain,rm_type,accuracy\n"
                        "paper-bench,GPT-5.1,\"paper, Table 2\",no_profile,,generative,61.2\n"
                        "paper-bench,GPT-5.1,\"paper, Table 2\",no_profile,arts_entertainment,generative,70.0\n"
                        "paper-bench,=HYPERLINK(1),\"paper, Table 2\",profile,all,fine_tuned,0.5\n", encoding="utf-8")
    call_command("import_benchmark_scores", str(reported), stdout=io.StringIO())
    return researcher


def test_rows_are_grouped_by_rm_type_with_marks_and_reported_rows_apart(world):
    table = paper_table(benchmark="paper-bench")  # the public view: the unpublished result is not in it
    assert [s["name"] for s in table["settings"]] == ["no_profile", "profile"]
    assert [c["label"] for c in table["settings"][0]["columns"]] == ["Arts", "Lifestyle", "Society", "All"]
    groups = {g["rm_type"]: [r["name"] for r in g["rows"]] for g in table["groups"]}
    assert groups == {"scalar": ["alpha"], "generative": ["beta_judge", "GPT-5.1"], "fine_tuned": ["=HYPERLINK(1)"]}
    rows = {r["name"]: r for g in table["groups"] for r in g["rows"]}
    alpha, beta, gpt = rows["alpha"]["cells"], rows["beta_judge"]["cells"], rows["GPT-5.1"]
    assert alpha["no_profile"]["all"]["marks"] == ["best", "top"]
    assert beta["no_profile"]["all"]["marks"] == [] and beta["no_profile"]["all"]["accuracy"] == 4 / 12
    assert sorted(beta["profile"]["all"]["marks"]) == ["best", "top", "up"]
    assert "up" not in beta["profile"]["lifestyle_personal_development"]["marks"]
    assert rows["alpha"]["avg"] == 1.0 and rows["beta_judge"]["avg"] == pytest.approx((4 / 12 + 1) / 2)
    # Reported figures: their own row, the source named, no marks, no CI, never ranked with ours.
    assert gpt["reported"] and gpt["source"] == "paper, Table 2"
    assert gpt["cells"]["no_profile"]["all"] == {"accuracy": 0.612, "ci_low": None, "ci_high": None, "n": None,
                                                  "marks": []}
    assert gpt["cells"]["no_profile"]["arts_entertainment"]["accuracy"] == 0.70 and gpt["avg"] is None


def test_latex_markdown_and_csv_carry_the_same_figures(world, client):
    table = paper_table(benchmark="paper-bench")
    latex = table_latex(table)
    assert latex.splitlines()[3] == r"\begin{tabular}{lccccccccc}" and r"\toprule" in latex and r"\bottomrule" in latex
    assert r"\multicolumn{4}{c}{Without profile} & \multicolumn{4}{c}{With profile} & Avg \\" in latex
    assert r"\cmidrule(lr){2-5} \cmidrule(lr){6-9}" in latex
    assert r"\multicolumn{10}{l}{\textit{Scalar classifiers}} \\" in latex
    # alpha, without profile: 100.0 in every domain (CI 75-100), All with its CI 90-100, bold and dagger.
    assert (r"alpha & \textbf{100.0}$^{\dag}$ {\scriptsize[75.0, 100.0]} & \textbf{100.0}$^{\dag}$ {\scriptsize[75.0, "
            r"100.0]} & \textbf{100.0}$^{\dag}$ {\scriptsize[75.0, 100.0]} & \textbf{100.0}$^{\dag}$ {\scriptsize[90.0, "
            r"100.0]} &") in latex
    beta_line = next(line for line in latex.splitlines() if line.startswith("beta"))
    # Per domain 4 pairs: 0 of 4 against 4 of 4 is p = 0.125, so beta stays in the top group there.
    assert beta_line.startswith(r"beta\_judge & \textbf{100.0}$^{\dag}$ {\scriptsize[75.0, 100.0]} & 0.0$^{\dag}$ "
                                r"{\scriptsize[0.0, 25.0]} & 0.0$^{\dag}$ {\scriptsize[0.0, 25.0]} & 33.3 "
                                r"{\scriptsize[23.3, 43.3]} &")
    assert beta_line.endswith(r"& \textbf{100.0}$^{\dag\uparrow}$ {\scriptsize[90.0, 100.0]} & 66.7 \\")
    assert r"GPT-5.1 (reported: paper, Table 2) & 70.0 & -- & -- & 61.2 & -- & -- & -- & -- & -- \\" in latex
    assert r"=HYPERLINK(1) (reported: paper, Table 2)" in latex

    markdown = table_markdown(table)
    assert "| Model | Without profile: Arts | Without profile: Lifestyle |" in markdown
    assert "| beta\\_judge | **100.0**† [75.0, 100.0] | 0.0† [0.0, 25.0] | 0.0† [0.0, 25.0] | 33.3 [23.3, 43.3] |" in markdown
    assert "| GPT-5.1 (reported: paper, Table 2) | 70.0 | – | – | 61.2 |" in markdown

    response = client.get(reverse("leaderboard:paper-export", args=["csv"]) + "?benchmark=paper-bench")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    by_model = {r["model"]: r for r in rows}
    assert [r["model"] for r in rows] == ["alpha", "beta_judge", "GPT-5.1", "'=HYPERLINK(1)"]  # formula-safe
    assert by_model["beta_judge"]["profile:all"] == "100.0" and by_model["beta_judge"]["profile:all:ci_low"] == "90.0"
    assert set(by_model["beta_judge"]["profile:all:marks"].split()) == {"best", "top", "up"}
    assert by_model["GPT-5.1"]["reported"] == "yes" and by_model["GPT-5.1"]["source"] == "paper, Table 2"
    assert by_model["alpha"]["preset"] == "skywork-reward-v2-llama" and by_model["beta_judge"]["avg"] == "66.7"
    for fmt, kind in (("tex", "application/x-tex"), ("md", "text/markdown")):
        download = client.get(reverse("leaderboard:paper-export", args=[fmt]) + "?benchmark=paper-bench")
        assert download["Content-Type"].startswith(kind)
        assert download.content.decode() == (latex if fmt == "tex" else markdown)


def test_the_page_shows_cis_marks_and_only_what_the_viewer_may_see(world, client):
    page = client.get(reverse("leaderboard:paper") + "?benchmark=paper-bench").content.decode()
    assert "hidden" not in page and "alpha" in page and "reported: paper, Table 2" in page
    assert "[90.0, 100.0]" in page and "†" in page and "▲" in page and 'id="paper-marks"' in page
    assert r"\begin{tabular}" in page  # the LaTeX shown under the table
    client.force_login(world)  # the owner also sees their unpublished result
    assert ">hidden</a>" in client.get(reverse("leaderboard:paper") + "?benchmark=paper-bench").content.decode()


def test_import_refuses_an_unknown_domain_or_rm_type_naming_the_line(world, tmp_path):
    from django.core.management.base import CommandError

    bad = tmp_path / "bad.csv"
    bad.write_text("benchmark,rm,source,setting,domain,accuracy\npaper-bench,X,paper,no_profile,cooking,50\n")
    with pytest.raises(CommandError, match=r"bad.csv, line 2, field 'domain': 'cooking' is not one of"):
        call_command("import_benchmark_scores", str(bad))
    bad.write_text("benchmark,rm,source,setting,rm_type,accuracy\npaper-bench,X,paper,no_profile,judge,50\n")
    with pytest.raises(CommandError, match=r"line 2, field 'rm_type': 'judge' is not one of scalar, generative"):
        call_command("import_benchmark_scores", str(bad))
