"""Benchmark health (issue 35): the worked example's figures written by hand (and the
correlations also checked against scipy.stats.pointbiserialr), then the same example stored as
published results: page, API, CSV, cache, blindness, a re-annotation campaign on the flagged
pairs, its verdicts recorded, and the version cut without the invalid pairs.

The worked example: six pairs, five published results in `profile` (A-E) and three in
`no_profile` (A-C). 1 = right on the pair.

    profile      p1 p2 p3 p4 p5 p6   accuracy       no_profile  p1 p2 p3 p4 p5 p6
    A             1  1  0  1  1  1   5/6            A            1  0  1  1  1  1
    B             1  1  0  1  0  1   4/6            B            1  1  1  0  1  1
    C             1  1  1  0  0  1   4/6            C            0  1  1  1  0  1
    D             1  1  0  0  1  0   3/6
    E             0  1  1  0  0  0   2/6

Words (chosen/rejected): p2 150/100 (ratio 1.5), p4 60/100 (0.6), p5 100/90, the others
100/100. Median profile accuracy 4/6, so the strong results are A, B, C.

p3 by hand: c = (0,0,1,0,1); rest = ((5-0)/5, (4-0)/5, (4-1)/5, (3-0)/5, (2-1)/5) =
(1, .8, .6, .6, .2); deviations c - .4 and rest - .64 give sxy = -.48, sxx = 1.2, syy = .352,
r = -.48 / sqrt(1.2 * .352) = -0.7385. Weighted share = (4/6 + 2/6) / (5/6+4/6+4/6+3/6+2/6) = 1/3.
"""

import csv
import io
import json

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient
from scipy.stats import pointbiserialr

from annotation.models import Campaign
from annotation.services.campaigns import campaign_create, campaign_set_open
from annotation.services.leases import assignment_next
from annotation.services.ratings import rating_submit
from annotation.services.reports import campaign_record_validation
from leaderboard import health
from leaderboard.models import EvaluationRun, PairScore, RunStatus, Submission
from leaderboard.services import health as health_service
from pipeline import domains
from pipeline.models import Benchmark, PerPairRead
from pipeline.services import BenchmarkError, benchmark_without_invalid
from tests.factories import BenchmarkFactory, BenchmarkItemFactory, UserFactory

PROFILE = {"A": [1, 1, 0, 1, 1, 1], "B": [1, 1, 0, 1, 0, 1], "C": [1, 1, 1, 0, 0, 1], "D": [1, 1, 0, 0, 1, 0],
           "E": [0, 1, 1, 0, 0, 0]}
NO_PROFILE = {"A": [1, 0, 1, 1, 1, 1], "B": [1, 1, 1, 0, 1, 1], "C": [0, 1, 1, 1, 0, 1]}
WORDS = [(100, 100), (150, 100), (100, 100), (60, 100), (100, 90), (100, 100)]
DOMAINS = ["arts", "arts", "lifestyle", "lifestyle", "society", "society"]
VARIANTS = ["avoid-generic"] * 3 + ["avoid-contrary"] * 3
STORED_DOMAIN = {"arts": domains.ARTS, "lifestyle": domains.LIFESTYLE, "society": domains.SOCIETY}


def example(verdicts=None, gaps=None):
    verdicts, gaps = verdicts or {}, gaps or {}
    pairs = [health.Pair(key=i + 1, source_id=f"p{i + 1}",
                                  domain=STORED_DOMAIN[DOMAINS[i]], chosen_words=c, rejected_words=r,
                         variant=VARIANTS[i], verdict=verdicts.get(i + 1), gap=gaps.get(i + 1))
             for i, (c, r) in enumerate(WORDS)]
    results = [health.Result(key=10 + n, name=name, setting="profile",
                             correct={j + 1: bool(v) for j, v in enumerate(row)})
               for n, (name, row) in enumerate(PROFILE.items())]
    results += [health.Result(key=20 + n, name=name, setting="no_profile",
                              correct={j + 1: bool(v) for j, v in enumerate(row)})
                for n, (name, row) in enumerate(NO_PROFILE.items())]
    return pairs, results


# --- the figures, by hand ------------------------------------------------------------------------

def test_the_worked_example_per_pair_figures():
    report = health.health_report(*example(verdicts={3: False, 6: True}, gaps={5: -0.5, 6: 1.5}))
    profile = {row["id"]: row["settings"]["profile"] for row in report["pairs"]}
    # right, share, weighted share, item-rest discrimination (hand-computed; None: undefined)
    expected = {"p1": (4, 0.8, 0.8889, 0.5345), "p2": (5, 1.0, 1.0, None), "p3": (2, 0.4, 0.3333, -0.7385),
                "p4": (2, 0.4, 0.5, 0.3273), "p5": (2, 0.4, 0.4444, -0.1667), "p6": (3, 0.6, 0.7222, 0.6455)}
    for pair, (right, share, weighted, r) in expected.items():
        got = profile[pair]
        assert (got["n"], got["right"], got["share"], got["weighted_share"], got["discrimination"]) == (
            5, right, share, weighted, r), pair
    assert [profile[p]["strong_wrong"] for p in sorted(profile)] == [0, 0, 2, 1, 2, 0]
    no_profile = {row["id"]: row["settings"]["no_profile"] for row in report["pairs"]}
    assert [no_profile[p]["right"] for p in sorted(no_profile)] == [2, 2, 3, 2, 2, 3]
    assert no_profile["p2"]["discrimination"] == -0.866  # rest (.8, .8, .6) against c (0, 1, 1): -sqrt(3)/2
    assert no_profile["p1"]["discrimination"] is None  # every rest score is .8
    rows = {row["id"]: row for row in report["pairs"]}
    assert [rows[p]["length_ratio"] for p in sorted(rows)] == [1.0, 1.5, 1.0, 0.6, 1.1111, 1.0]
    assert (rows["p3"]["verdict"], rows["p6"]["verdict"], rows["p1"]["verdict"]) == (False, True, None)
    assert (rows["p5"]["gap"], rows["p6"]["gap"], rows["p1"]["gap"]) == (-0.5, 1.5, None)


def test_the_discrimination_index_equals_scipys_point_biserial_on_the_rest_scores():
    report = health.health_report(*example())
    rows = list(PROFILE.values())
    for i, row in enumerate(report["pairs"]):
        c = [r[i] for r in rows]
        rest = [(sum(r) - r[i]) / 5 for r in rows]
        if len(set(c)) > 1:
            assert row["settings"]["profile"]["discrimination"] == pytest.approx(pointbiserialr(c, rest)[0], abs=1e-4)


def test_the_worked_example_flags_and_where_they_hold():
    report = health.health_report(*example(verdicts={3: False, 6: True}, gaps={5: -0.5, 6: 1.5}))
    flags = {row["id"]: row["flag_settings"] for row in report["pairs"]}
    assert flags == {
        "p1": {},
        "p2": {"length_decides": ["profile", "no_profile"]},  # chosen 1.5x longer, most results right
        "p3": {"strong_wrong": ["profile"], "negative_discrimination": ["profile"], "humans_disagree": []},
        "p4": {"length_decides": ["profile"]},  # rejected longer, 3 of 5 not right (no_profile: 1 of 3)
        "p5": {"strong_wrong": ["profile"], "humans_disagree": []},  # r = -0.1667 is above -0.2; gap -0.5
        "p6": {},
    }
    assert [row["flags"] for row in report["pairs"]][2] == ["strong_wrong", "negative_discrimination",
                                                          "humans_disagree"]


def test_the_worked_example_summary():
    summary = health.health_report(*example(verdicts={3: False}, gaps={5: -0.5}))["summary"]
    assert (summary["pairs"], summary["flagged"]) == (6, 4)
    assert summary["by_flag"] == {"strong_wrong": 2, "negative_discrimination": 1, "humans_disagree": 2,
                                  "length_decides": 2}
    # accuracies 5/6, 4/6, 4/6, 3/6, 2/6: mean .6, population sd sqrt(.14444/5) = .17;
    # 5/6, 5/6, 4/6: mean .7778, sd sqrt((2 x .05556^2 + .11111^2) / 3) = .0786
    assert summary["spread"]["profile"] == {"results": 5, "min": 0.3333, "max": 0.8333, "mean": 0.6, "sd": 0.17}
    assert summary["spread"]["no_profile"] == {"results": 3, "min": 0.6667, "max": 0.8333, "mean": 0.7778,
                                               "sd": 0.0786}
    assert {d: (g["pairs"], g["flagged"], g["share"]) for d, g in summary["by_domain"].items()} == {
        domains.ARTS: (2, 1, 0.5), domains.LIFESTYLE: (2, 2, 1.0), domains.SOCIETY: (2, 1, 0.5)}
    assert {v: (g["flagged"], g["by_flag"]["length_decides"]) for v, g in summary["by_variant"].items()} == {
        "avoid-contrary": (2, 1), "avoid-generic": (2, 1)}


def test_the_leaderboard_without_flagged_pairs_shows_rank_changes():
    without = health.health_report(*example(verdicts={3: False}, gaps={5: -0.5}))["summary"]["without"]
    # Without any flagged pair (p2-p5 out): A, B, C right on p1 and p6, D on one, E on none.
    rows = [(r["name"], r["accuracy"], r["rank"], r["accuracy_without"], r["rank_without"], r["rank_change"])
            for r in without["any"]["settings"]["profile"]]
    assert without["any"]["dropped"] == 4
    assert rows == [("A", 0.8333, 1, 1.0, 1, 0), ("B", 0.6667, 2, 1.0, 1, 1), ("C", 0.6667, 2, 1.0, 1, 1),
                    ("D", 0.5, 4, 0.5, 4, 0), ("E", 0.3333, 5, 0.0, 5, 0)]
    # Without "most strong RMs wrong" (p3, p5): B 4/4 ties A, C 3/4 falls behind.
    rows = [(r["name"], r["accuracy_without"], r["rank_without"], r["rank_change"])
            for r in without["strong_wrong"]["settings"]["profile"]]
    assert rows == [("A", 1.0, 1, 0), ("B", 1.0, 1, 1), ("C", 0.75, 3, -1), ("D", 0.5, 4, 0), ("E", 0.25, 5, 0)]


def test_fewer_than_three_results_leave_discrimination_undefined_and_nothing_breaks_without_results():
    pairs, results = example()
    report = health.health_report(pairs, [r for r in results if r.name in ("A", "B")])
    assert {row["settings"]["profile"]["discrimination"] for row in report["pairs"]} == {None}
    empty = health.health_report(pairs, [])
    assert empty["settings"] == [] and empty["summary"]["spread"] == {}
    assert [row["flags"] for row in empty["pairs"]] == [[]] * 6


# --- stored results: page, API, CSV, cache, re-annotation, version ------------------------------

@pytest.fixture
def stored(db, staff_user):
    """The worked example as a benchmark with published results (scores files need none: rows
    are written as a finished run would leave them)."""
    bench = BenchmarkFactory(name="health-demo", frozen_at="2026-12-01T00:00:00Z")
    items = [BenchmarkItemFactory(benchmark=bench, position=i, source_id=f"p{i + 1}",
                                  domain=STORED_DOMAIN[DOMAINS[i]],
                                  chosen=" ".join(["yes"] * c), rejected=" ".join(["no"] * r))
             for i, (c, r) in enumerate(WORDS)]
    bench.item_count = len(items)
    bench.save(update_fields=["item_count"])
    for setting, table in (("profile", PROFILE), ("no_profile", NO_PROFILE)):
        for name, row in table.items():
            submission = Submission.objects.filter(display_name=name, benchmark=bench).first() or \
                Submission.objects.create(owner=staff_user, display_name=name, benchmark=bench, kind="scores",
                                          weights_hash=f"hash-{name}", published=True)
            run = EvaluationRun.objects.create(submission=submission, setting=setting, status=RunStatus.SUCCEEDED,
                                               fingerprint=f"fp-{name}")
            PairScore.objects.bulk_create([PairScore(run=run, item=item, chosen_score=float(v), rejected_score=0.5,
                                                     correct=bool(v)) for item, v in zip(items, row)])
    # An unpublished result is not part of health.
    hidden = Submission.objects.create(owner=staff_user, display_name="private", benchmark=bench, kind="scores",
                                       weights_hash="hash-private")
    run = EvaluationRun.objects.create(submission=hidden, setting="profile", status=RunStatus.SUCCEEDED,
                                       fingerprint="fp-private")
    PairScore.objects.bulk_create([PairScore(run=run, item=item, correct=False) for item in items])
    return bench


def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_stored_results_give_the_worked_examples_figures_and_the_second_visit_is_cached(stored,
                                                                                          django_assert_max_num_queries):
    first = health_service.benchmark_health(benchmark=stored)
    assert first["cached"] is False and first["settings"] == ["no_profile", "profile"]
    rows = {row["id"]: row for row in first["pairs"]}
    assert (rows["p3"]["settings"]["profile"]["right"], rows["p3"]["settings"]["profile"]["discrimination"]) == (
        2, -0.7385)
    assert rows["p3"]["flags"] == ["strong_wrong", "negative_discrimination"]
    assert [r["name"] for r in first["results"]["profile"]] == ["A", "B", "C", "D", "E"]  # not "private"
    with django_assert_max_num_queries(6):
        second = health_service.benchmark_health(benchmark=stored)
    assert second["cached"] is True and second["pairs"] == first["pairs"]


def test_the_page_csv_and_api_show_the_figures_to_researchers(stored, client):
    researcher = UserFactory(roles=["researcher"])
    client.force_login(researcher)
    assert 'id="health-link"' in client.get("/benchmarks/health-demo/").content.decode()
    page = client.get("/benchmarks/health-demo/health/")
    assert page.status_code == 200
    body = page.content.decode()
    for text in ("most strong RMs wrong", "negatively discriminating", "length decides it",
                 "humans disagree with the label", "Leaderboard without flagged pairs", "▲ 1", "-0.74"):
        assert text in body, text
    assert "reannotate-form" not in body  # staff only
    # A read of every pair, logged: whoever saw these results cannot later rate the benchmark blind.
    assert PerPairRead.objects.filter(user_id=researcher.pk, benchmark=stored, pair_key="").exists()
    page = client.get("/benchmarks/health-demo/health/?flag=strong_wrong&without=strong_wrong")
    assert page.content.decode().count('data-pair="') == 2 and "▼ 1" in page.content.decode()
    lines = list(csv.DictReader(io.StringIO(b"".join(client.get("/benchmarks/health-demo/health.csv")
                                                      .streaming_content).decode())))
    p3 = next(row for row in lines if row["id"] == "p3")
    assert (p3["profile_right"], p3["profile_n"], p3["profile_weighted_share"], p3["profile_discrimination"],
            p3["flags"]) == ("2", "5", "0.3333", "-0.7385", "strong_wrong negative_discrimination")
    answer = api(researcher).get("/api/benchmarks/health-demo/health/", {"flag": "length_decides"}).json()
    assert (answer["count"], [p["id"] for p in answer["pairs"]]) == (2, ["p2", "p4"])
    assert answer["flags"]["length_decides"]["label"] == "length decides it"
    assert api(researcher).get("/api/benchmarks/health-demo/health/", {"flag": "nope"}).status_code == 400
    assert api(researcher).get("/api/benchmarks/missing/health/").status_code == 404


def test_health_is_per_pair_data_withheld_from_raters_while_a_campaign_is_open(stored, client, staff_user):
    rater = UserFactory(roles=["researcher", "annotator"])
    campaign_create(user=staff_user, benchmark="health-demo", guidelines="Rate.", overlap=1)
    client.force_login(rater)
    response = client.get("/benchmarks/health-demo/health/")
    assert response.status_code == 403 and "withheld" in response.content.decode()
    assert client.get("/benchmarks/health-demo/health.csv").status_code == 403
    assert api(rater).get("/api/benchmarks/health-demo/health/").status_code == 403
    assert APIClient().get("/api/benchmarks/health-demo/health/").status_code in (401, 403)
    client.logout()
    assert client.get("/benchmarks/health-demo/health/").status_code == 302  # to the login page


def rate(campaign, user, values):
    """Rate every pair `user` is offered: values[source id] = (chosen rubric, rejected rubric)."""
    while (lease := assignment_next(user=user, campaign_id=campaign.pk)) is not None:
        source_id = lease.assignment.pair.item.source_id
        chosen_rubric, rejected_rubric = values[source_id]
        chosen = {"factuality": 4, "relevance": 4, "helpfulness": 4, "personal_rubrics": chosen_rubric}
        rejected = {"factuality": 4, "relevance": 4, "helpfulness": 4, "personal_rubrics": rejected_rubric}
        shown = {"1": chosen, "2": rejected} if lease.assignment.chosen_first else {"1": rejected, "2": chosen}
        rating_submit(user=user, token=lease.assignment.token, ratings=shown, seconds=30)


def test_reannotation_from_flagged_pairs_then_verdicts_then_a_version_without_the_invalid_ones(stored, staff_user,
                                                                                             tmp_path):
    researcher = UserFactory(roles=["researcher"])
    refused = api(researcher).post("/api/benchmarks/health-demo/health/campaigns/",
                                   {"flag": "strong_wrong", "guidelines": "Rate."}, format="json")
    assert refused.status_code == 403
    answer = api(staff_user).post("/api/benchmarks/health-demo/health/campaigns/",
                                  {"flag": "strong_wrong", "guidelines": "Rate again.", "overlap": 2}, format="json")
    assert answer.status_code == 201, answer.content
    campaign = Campaign.objects.get(pk=answer.json()["id"])
    assert sorted(campaign.pairs.values_list("item__source_id", flat=True)) == ["p3", "p5"]
    assert campaign.origin == {"from": "benchmark health", "benchmark": "health-demo", "flag": "strong_wrong",
                               "pairs": ["p3", "p5"], "selected_by": staff_user.username,
                               "health_key": answer.json()["origin"]["health_key"]}
    assert campaign.overlap == 2 and campaign.guidelines == "Rate again."
    first, second = UserFactory(roles=["annotator"]), UserFactory(roles=["annotator"])
    rate(campaign, first, {"p3": (2, 4), "p5": (3, 4)})
    rate(campaign, second, {"p3": (2, 4), "p5": (4, 4)})
    assert campaign_record_validation(campaign=campaign) == {"valid": 0, "invalid": 2}
    campaign_set_open(campaign=campaign, is_open=False)

    report = health_service.benchmark_health(benchmark=stored)
    assert report["cached"] is False  # the verdicts and ratings changed what it reads
    rows = {row["id"]: row for row in report["pairs"]}
    assert (rows["p3"]["verdict"], rows["p3"]["gap"], rows["p5"]["verdict"], rows["p5"]["gap"]) == (
        False, -2.0, False, -0.5)
    assert "humans_disagree" in rows["p3"]["flags"] and "humans_disagree" in rows["p5"]["flags"]

    out = tmp_path / "without.jsonl"
    call_command("export_benchmark", name="health-demo", out=str(out), without_invalid=True)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p1", "p2", "p4", "p6"]
    answer = api(staff_user).post("/api/benchmarks/health-demo/health/versions/", {"name": "health-demo-v2"},
                                  format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json() == {"name": "health-demo-v2", "item_count": 4, "derived_from": "health-demo",
                             "dropped_invalid": ["p3", "p5"]}
    version = Benchmark.objects.get(name="health-demo-v2")
    assert version.is_frozen and version.metadata["derived_from"] == "health-demo"
    assert sorted(version.items.values_list("source_id", flat=True)) == ["p1", "p2", "p4", "p6"]
    assert health_service.benchmark_health(benchmark=stored)["lineage"]["derived"] == ["health-demo-v2"]
    assert health_service.benchmark_health(benchmark=version)["lineage"] == {
        "derived_from": "health-demo", "dropped_invalid": ["p3", "p5"], "derived": []}
    with pytest.raises(BenchmarkError, match="already exists"):
        benchmark_without_invalid(source="health-demo", name="health-demo-v2")
    with pytest.raises(BenchmarkError, match="no human validation"):
        benchmark_without_invalid(source="health-demo-v2", name="health-demo-v3")


def test_the_page_opens_a_campaign_on_the_ticked_pairs_for_staff(stored, client, staff_user):
    client.force_login(staff_user)
    page = client.get("/benchmarks/health-demo/health/").content.decode()
    assert 'id="reannotate-form"' in page and 'id="cut-form"' in page
    step = client.post("/benchmarks/health-demo/health/reannotate/", {"pair": ["p2", "p4"]})
    assert step.status_code == 200 and "2 pairs of health-demo" in step.content.decode()
    done = client.post("/benchmarks/health-demo/health/reannotate/",
                       {"pair": ["p2", "p4"], "confirm": "1", "guidelines": "Look again.", "overlap": 3,
                        "lease_minutes": 30, "rubric_min_diff": 2, "other_max_diff": 1})
    assert done.status_code == 302
    campaign = Campaign.objects.get(origin__from="benchmark health")
    assert sorted(campaign.pairs.values_list("item__source_id", flat=True)) == ["p2", "p4"]
    assert campaign.origin["flag"] is None and campaign.origin["pairs"] == ["p2", "p4"]
    nothing = client.post("/benchmarks/health-demo/health/reannotate/", {})
    assert nothing.status_code == 400 and "Tick pairs" in nothing.content.decode()
    unknown = client.post("/benchmarks/health-demo/health/reannotate/",
                          {"pair": ["zz"], "confirm": "1", "guidelines": "x", "overlap": 1, "lease_minutes": 30,
                           "rubric_min_diff": 2, "other_max_diff": 1})
    assert unknown.status_code == 400 and "Pairs not in health-demo: zz" in unknown.content.decode()
    researcher = UserFactory(roles=["researcher"])
    client.force_login(researcher)
    assert client.post("/benchmarks/health-demo/health/reannotate/", {"pair": ["p2"]}).status_code == 403
    assert client.post("/benchmarks/health-demo/health/cut/", {"name": "x"}).status_code == 403


def test_the_demo_sample_has_flagged_pairs_and_a_button_that_opens_their_campaign(client, staff_user):
    """seed_demo's references (its two baselines and three flipped-overlap results) on the sample."""
    from django.core.management.base import OutputWrapper

    from pipeline.services import benchmark_import
    from prbench.management.commands.seed_demo import SAMPLE_NAME, SAMPLE_PATH, Command

    bench = benchmark_import(path=SAMPLE_PATH, name=SAMPLE_NAME).benchmark
    seed, out = Command(), io.StringIO()
    seed.stdout = OutputWrapper(out)
    seed._baseline_evaluations(bench, UserFactory(roles=["researcher"]))
    seed._flipped_references(bench, staff_user)
    seed._health(bench)
    assert "benchmark health: /benchmarks/prb-sample/health/" in out.getvalue()
    report = health_service.benchmark_health(benchmark=bench)
    flagged = [row["id"] for row in report["pairs"] if row["flags"]]
    assert flagged and len(report["results"]["profile"]) == 5
    client.force_login(staff_user)
    page = client.get("/benchmarks/prb-sample/health/").content.decode()
    assert 'id="reannotate-flag"' in page
    step = client.post("/benchmarks/prb-sample/health/reannotate/", {"by_flag": "1", "flag": "any"})
    assert f"{len(flagged)} pair" in step.content.decode()
    client.post("/benchmarks/prb-sample/health/reannotate/",
                {"by_flag": "1", "flag": "any", "confirm": "1", "guidelines": "Rate again.", "overlap": 2,
                 "lease_minutes": 30, "rubric_min_diff": 2, "other_max_diff": 1})
    campaign = Campaign.objects.get(origin__from="benchmark health")
    assert sorted(campaign.pairs.values_list("item__source_id", flat=True)) == sorted(flagged)
