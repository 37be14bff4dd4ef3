"""Results that never merge, override or overwrite each other (issue 28, faults 5-9): each test
builds the clash the audit found and checks both results are still there, with the right values
written in."""

import pytest
from rest_framework.test import APIClient

from leaderboard.models import DownstreamOutcome, EvaluationRun, ExternalBenchmarkScore, Submission
from leaderboard.selectors import _labels, correlation_report
from leaderboard.services import outcome_store
from prblib.downstream.bon import random_baseline_by_item
from tests.factories import BenchmarkFactory, UserFactory

pytestmark = pytest.mark.django_db


def finished(owner, bench, name, accuracy, *, published=True):
    """A published submission with one succeeded profile run of the given accuracy (no scoring)."""
    submission = Submission.objects.create(owner=owner, display_name=name, benchmark=bench, kind="scores",
                                           weights_hash=f"{owner.pk}-{name}", published=published)
    EvaluationRun.objects.create(submission=submission, setting="profile", fingerprint=f"fp-{submission.pk}",
                                 status="SUCCEEDED", metrics={"accuracy": accuracy, "n": 30})
    return submission


def outcome(submission, value, **extra):
    outcome_store(submission=submission, rm_name=submission.display_name, source="prbench", kind="best_of_n",
                  policy="p", setting="profile", domain="", k=16, outcome=value, n=30, **extra)


def test_a_model_named_b_slash_x_and_user_bs_model_x_stay_two_points():
    """Labelled by display name, user a's "b/x" and user b's "x" (qualified as "b/x" once user c
    also has an "x") were one point: n went 10 -> 9 with nothing dropped. Keyed by id: 10."""
    bench = BenchmarkFactory(name="bench")
    a, b, c = (UserFactory(username=u) for u in "abc")
    subs = [finished(a, bench, "b/x", 0.50), finished(b, bench, "x", 0.55), finished(c, bench, "x", 0.60)]
    others = UserFactory(username="d")
    subs += [finished(others, bench, f"rm{i}", 0.62 + 0.03 * i) for i in range(7)]
    for i, s in enumerate(subs):
        outcome(s, 1.0 + 0.05 * i)
    lonely = finished(others, bench, "no outcome", 0.9)  # no outcome: dropped, and listed as dropped

    row = correlation_report(kind="best_of_n", policy="p", k=16)["correlations"][0]
    assert row["n"] == 10 and len(row["points"]) == 10
    assert len({p["key"] for p in row["points"]}) == 10 and len(set(row["rms"])) == 10
    assert {p["key"] for p in row["points"]} == {f"submission:{s.pk}" for s in subs}
    b_x = {p["key"]: p for p in row["points"]}
    assert b_x[f"submission:{subs[0].pk}"]["accuracy"] == 0.50 and b_x[f"submission:{subs[1].pk}"]["accuracy"] == 0.55
    assert row["dropped"] == {"no outcome": "no downstream outcome"}
    assert row["spearman"]["value"] == pytest.approx(1.0)  # 10 RMs in the same order on both axes
    assert lonely.pk not in [int(p["key"].split(":")[1]) for p in row["points"]]


def test_labels_never_collide_even_when_names_and_qualifiers_do():
    labels = _labels({"submission:1": ("b/x", "a/b/x"), "submission:2": ("x", "b/x"), "submission:3": ("x", "c/x")})
    assert labels == {"submission:1": "b/x [submission:1]", "submission:2": "b/x [submission:2]",
                      "submission:3": "c/x"}


def test_an_imported_accuracy_is_its_own_row_and_never_replaces_the_computed_one():
    """An imported 0.10 for one of our submissions used to replace its computed 0.867 in the
    correlations while the leaderboard kept 0.867."""
    bench = BenchmarkFactory(name="sample")
    owner = UserFactory()
    subs = [finished(owner, bench, f"rm{i}", acc) for i, acc in enumerate((26 / 30, 0.7, 0.6, 0.5, 0.4))]
    for s, value in zip(subs, (1.6, 1.4, 1.3, 1.2, 1.1)):
        outcome(s, value)
    ExternalBenchmarkScore.objects.create(benchmark="sample", setting="profile", submission=subs[0], rm_name="rm0",
                                          accuracy=0.10, source="prbench")

    rows = {(r["benchmark"], r["setting"], r["origin"]): r
            for r in correlation_report(kind="best_of_n", policy="p", k=16)["correlations"]}
    computed = rows[("sample", "profile", "computed")]
    assert computed["n"] == 5
    assert {p["rm"]: p["accuracy"] for p in computed["points"]}["rm0"] == pytest.approx(0.867, abs=5e-4)
    imported = rows[("sample", "profile", "imported")]
    assert [(p["rm"], p["accuracy"]) for p in imported["points"]] == [("rm0", 0.10)]
    assert imported["n"] == 1  # the imported source has one RM: no figures, not a merge


def test_two_best_of_n_configurations_of_one_rm_coexist_and_a_correlation_names_the_one_it_uses():
    """A second Best-of-N run with another judge model and temperature overwrote the first's
    outcome. Keyed by config_key (the run's manifest without the environment), both stay."""
    bench = BenchmarkFactory(name="bench")
    owner = UserFactory()
    subs = [finished(owner, bench, f"rm{i}", 0.5 + 0.1 * i) for i in range(4)]
    first = {"judge": "j", "judge_model": "grader-a", "temperature": 1.0}
    second = {"judge": "j", "judge_model": "grader-b", "temperature": 0.7}
    from leaderboard.services.outcomes import outcome_config_key

    for i, s in enumerate(subs):
        outcome(s, 1.0 + 0.1 * i, manifest=first, config_key=outcome_config_key(first))
    outcome(subs[0], 1.9, manifest=second, config_key=outcome_config_key(second))  # the newest, for rm0 only

    rows = DownstreamOutcome.objects.filter(submission=subs[0]).order_by("created_at", "pk")
    assert [(o.outcome, o.manifest["judge_model"]) for o in rows] == [(1.0, "grader-a"), (1.9, "grader-b")]
    assert outcome_config_key(first) != outcome_config_key(second)
    # The same configuration run again updates its own row, nothing else.
    outcome(subs[0], 1.05, manifest=first, config_key=outcome_config_key({**first, "code_version": "new", "run": 9}))
    assert sorted(DownstreamOutcome.objects.filter(submission=subs[0]).values_list("outcome", flat=True)) == [1.05, 1.9]

    report = correlation_report(kind="best_of_n", policy="p", k=16)
    assert report["outcome"]["selection"] == "the most recent outcome of each RM"
    point = {p["rm"]: p for p in report["correlations"][0]["points"]}["rm0"]
    # rm0's most recent outcome is the second configuration's (first recorded after the first's)
    assert (point["outcome"], point["judge_model"], point["alternatives"]) == (1.9, "grader-b", 2)
    assert point["outcome_id"] == DownstreamOutcome.objects.get(submission=subs[0], outcome=1.9).pk


def test_a_correlation_uses_the_outcome_of_the_run_asked_for(django_user_model):
    from leaderboard.models import BestOfNRun
    from pipeline.models import LLMEndpoint, PolicySampleSet

    bench = BenchmarkFactory(name="bench")
    owner = UserFactory()
    subs = [finished(owner, bench, f"rm{i}", 0.5 + 0.1 * i) for i in range(4)]
    judge = LLMEndpoint.objects.create(name="j", base_url="http://127.0.0.1:9/v1")
    sample_set = PolicySampleSet.objects.create(benchmark=bench, policy="p", model="m", n=4)
    run_a = BestOfNRun.objects.create(submission=subs[0], sample_set=sample_set, judge=judge, judge_model="a")
    run_b = BestOfNRun.objects.create(submission=subs[0], sample_set=sample_set, judge=judge, judge_model="b")
    for i, s in enumerate(subs[1:], start=1):
        outcome(s, 1.0 + 0.1 * i, config_key="c")
    outcome(subs[0], 0.4, manifest={"judge_model": "a"}, config_key="ka", bon_run=run_a)
    outcome(subs[0], 1.8, manifest={"judge_model": "b"}, config_key="kb", bon_run=run_b)

    latest = {p["rm"]: p for p in correlation_report(kind="best_of_n", policy="p", k=16)["correlations"][0]["points"]}
    assert latest["rm0"]["outcome"] == 1.8 and latest["rm0"]["outcome_run"] == {"type": "best_of_n", "id": run_b.pk}
    api = APIClient().get("/api/correlations/", {"outcome": "best_of_n", "policy": "p", "k": 16,
                                                 "run": run_a.pk}).json()
    chosen = {p["rm"]: p for p in api["correlations"][0]["points"]}
    assert chosen["rm0"]["outcome"] == 0.4 and chosen["rm0"]["judge_model"] == "a"
    assert api["outcome"]["run"] == run_a.pk and f"run {run_a.pk}" in api["outcome"]["selection"]
    assert chosen["rm1"]["outcome"] == 1.1  # RMs the run did not score keep their most recent outcome
    assert APIClient().get("/api/correlations/", {"run": "x"}).status_code == 400


def test_the_random_baseline_is_drawn_per_item_identity_not_per_sorted_database_id():
    """Before: draws were dealt to str(pk) in sorted order ('1', '10', '11', ..., '2'), so an
    item's draw depended on which ids existed. Now each item's generator is seeded with its
    source id, whatever its key."""
    import random

    ks = (1, 2, 4, 8)
    ids = {str(pk): f"item-{pk}" for pk in range(1, 13)}
    draws = random_baseline_by_item(ids, ks=ks, seed=0)
    expected = random.Random("bon-random-baseline:0:item-2")
    assert draws["2"] == {k: expected.randrange(k) for k in ks}
    # The same items under other database ids (another database, renumbered) draw the same.
    renumbered = random_baseline_by_item({str(100 - int(pk)): sid for pk, sid in ids.items()}, ks=ks, seed=0)
    assert {ids[pk]: d for pk, d in draws.items()} == {f"item-{100 - int(pk)}": d for pk, d in renumbered.items()}
    # An item alone draws what it draws among others; k = 1 always picks the first sample.
    assert random_baseline_by_item({"x": "item-10"}, ks=ks)["x"] == draws["10"] and draws["10"][1] == 0


def test_a_second_best_of_n_run_with_another_judge_model_and_temperature_keeps_the_first(
        researcher, fake_openai, tmp_path):
    """End to end through run_best_of_n: before, the second run's outcomes overwrote the first's
    (the outcome key left out the judge model and the run's knobs)."""
    from django.core.management import call_command

    from leaderboard.models import BestOfNRun
    from pipeline.models import LLMEndpoint
    from tests.leaderboard.test_best_of_n import grade, tiny_world
    from tests.prblib.fake_openai import text

    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=3)
    LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=0)

    def respond(body):  # 13-word samples: the judge gives every aspect 2
        if "=== Answer ===" in body["messages"][-1]["content"]:
            return grade(body)
        return text([f"Sample {i}, a long enough answer about watercolour painting for the judge here."
                     for i in range(body.get("n") or 1)])

    fake_openai.responder = respond
    base = ["run_best_of_n", "--submission", str(submission.pk), "--policy-model", "m", "--policy-endpoint", "policy",
            "--judge-endpoint", "judge", "--n", "2"]
    call_command(*base, "--judge-model", "grader", "--option", "temperature=1")
    call_command(*base, "--judge-model", "grader-b", "--option", "temperature=0.7")

    assert BestOfNRun.objects.filter(status="SUCCEEDED").count() == 2
    rows = DownstreamOutcome.objects.filter(submission=submission, domain="", k=2).order_by("pk")
    assert [(r.manifest["judge_model"], r.manifest["temperature"], r.outcome) for r in rows] == [
        ("grader", 1.0, 2.0), ("grader-b", 0.7, 2.0)]
    assert len({r.config_key for r in rows}) == 2 and {r.bon_run_id for r in rows} == set(
        BestOfNRun.objects.values_list("pk", flat=True))
