"""Blindness, round two (issue 33, hostile review of fault 2).

(a) Reads are remembered: a user served per-pair data of a benchmark is not leased its pairs.
(b) Withholding is keyed on the pairs' content, not on a benchmark id: a copy under another name
    (other ids, reworded questions, answers re-spaced and re-cased) is withheld too.
(c) A calibration's per-bin reliability tables are withheld like other per-pair data.
(d) A staff member's username is never shown as the owner of a published submission.
(g) The benchmark browser's item list (ids, questions) is withheld too.
"""

import dataclasses
import hashlib

import pytest
from django.utils import timezone

from annotation.services.campaigns import campaign_set_open
from leaderboard import services
from pipeline.models import PerPairRead, pair_key
from pipeline.services import benchmark_create, benchmark_records
from tests.annotation.test_blindness import WITHHELD, _body, _client, _scores, world  # noqa: F401 (a fixture)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

def _next(user, campaign):
    return _client(user).get(f"/api/annotation/next/?campaign={campaign.pk}")


def _rate_all(user, campaign) -> list[str]:
    """Take and rate every pair the rating API hands `user`; the items' source ids, in order."""
    from annotation.models import Assignment

    client, shown = _client(user), []
    while True:
        response = client.get(f"/api/annotation/next/?campaign={campaign.pk}")
        if response.status_code == 204:
            return shown
        assert response.status_code == 200, response.content
        payload = response.json()
        shown.append(Assignment.objects.get(token=payload["assignment"]).pair.item.source_id)
        ratings = {key: {d["key"]: 3 for d in payload["dimensions"]} for key in ("1", "2")}
        stored = client.post("/api/annotation/ratings/", {"assignment": payload["assignment"], "ratings": ratings},
                             content_type="application/json")
        assert stored.status_code == 201, stored.content


# --- (a) reads are logged and checked at lease time -------------------------------------------


def test_someone_shown_a_models_predictions_is_refused_the_campaign_on_those_pairs(world):
    campaign, attacker = world["campaign"], world["attacker"]
    length = world["submissions"][0]
    campaign_set_open(campaign=campaign, is_open=False)
    assert _client(attacker).get(f"/models/{length.pk}/predictions.csv").status_code == 200  # public meanwhile
    campaign_set_open(campaign=campaign, is_open=True)

    response = _next(attacker, campaign)
    assert response.status_code == 403
    assert response.json()["detail"] == (
        f"You were shown per-pair results of benchmark 'sample' (model predictions, {timezone.now():%Y-%m-%d}), "
        "which hold the pairs of this campaign, so you cannot rate them blind; staff can point you to another "
        "campaign.")
    # Someone who read nothing rates as before.
    rater = UserFactory(roles=["annotator"])
    assert _next(rater, campaign).status_code == 200


def test_each_per_pair_view_logs_what_it_served_and_withheld_answers_log_nothing(world):
    campaign, attacker, other = world["campaign"], world["attacker"], world["other"]
    length, another = world["submissions"]
    run = length.runs.get()
    item = world["bench"].items.order_by("position").first()
    urls = {f"/models/{length.pk}/pairs/": "model pair page",
            f"/models/{length.pk}/predictions.jsonl": "model predictions",
            f"/models/{length.pk}/compare/?with={another.pk}": "model comparison",
            f"/submissions/{length.pk}/runs/{run.pk}/scores.csv": "run scores export",
            f"/api/submissions/{length.pk}/scores/?run={run.pk}": "submission scores API",
            "/api/benchmarks/sample/items/": "benchmark items API",
            f"/benchmarks/sample/items/{item.pk}/": "benchmark item page"}
    for url in urls:  # the attacker may rate: 403, and nothing is logged
        assert _client(attacker).get(url).status_code == 403
    assert not PerPairRead.objects.filter(user=attacker).exists()
    for url, what in urls.items():  # another researcher reads them all
        assert _client(other).get(url).status_code == 200, url
    reads = set(PerPairRead.objects.filter(user=other, benchmark=world["bench"]).values_list("what", "pair_key"))
    assert reads == {("model pair page", ""), ("benchmark item page", item.pair_key)}  # the first of each scope
    assert PerPairRead.objects.filter(user=other).count() == 2
    # That researcher, given an assignment later, is refused the campaign.
    from annotation.models import Assignment

    Assignment.objects.create(token="r" * 32, campaign=campaign, pair=campaign.pairs.first(), annotator=other,
                              chosen_first=True, status="SUBMITTED", expires_at=timezone.now())
    other.groups.add(*UserFactory(roles=["annotator"]).groups.all())
    assert _next(other, campaign).status_code == 403


def test_one_item_page_read_keeps_that_one_pair_from_the_reader(world):
    campaign, attacker = world["campaign"], world["attacker"]
    item = world["bench"].items.order_by("position")[3]
    campaign_set_open(campaign=campaign, is_open=False)
    assert _client(attacker).get(f"/benchmarks/sample/items/{item.pk}/").status_code == 200
    campaign_set_open(campaign=campaign, is_open=True)

    shown = _rate_all(attacker, campaign)
    assert len(shown) == 29 and item.source_id not in shown  # every pair but the one they read
    assert len(_rate_all(UserFactory(roles=["annotator"]), campaign)) == 30


# --- (b) content keys -------------------------------------------------------------------------


def test_the_pair_key_is_the_unordered_normalised_answers():
    def by_hand(a, b):
        first, second = sorted((" ".join(a.casefold().split()), " ".join(b.casefold().split())))
        return hashlib.sha256(f"{len(first)}:{first}\n{second}".encode()).hexdigest()

    assert pair_key("Use a pan.", "Boil it") == by_hand("use a pan.", "boil it")
    assert pair_key("Use a pan.", "Boil it") == pair_key("  boil\n IT ", "USE A PAN.")  # swapped, re-spaced, re-cased
    assert pair_key("ﬁne", "x") == pair_key("fine", "x")  # NFKC: the ligature is "fi"
    assert pair_key("Use a pan.", "Boil it") != pair_key("Use a pan.", "Boil it twice")
    assert len(pair_key("a", "b")) == 64


def _copy(world, name):
    """The sample's pairs under another name: other ids, reworded questions, answers re-cased
    and re-spaced, chosen and rejected swapped on every other pair."""
    records = []
    for i, r in enumerate(benchmark_records(benchmark=world["bench"])):
        chosen, rejected = (r.chosen, r.rejected) if i % 2 else (r.rejected, r.chosen)
        records.append(dataclasses.replace(r, source_id=f"copy-{r.source_id}", source_id_is_int=False,
                                           question="Reworded: " + r.question, chosen=" " + chosen.upper(),
                                           rejected=rejected + "  "))
    return benchmark_create(name=name, records=records)


def test_the_same_pairs_under_another_benchmark_are_withheld_while_the_original_is_rated(world):
    copy = _copy(world, "sample-reworded")
    assert set(copy.items.values_list("pair_key", flat=True)) == set(
        world["bench"].items.values_list("pair_key", flat=True))
    other = world["other"]
    published = services.submission_create(user=other, request=services.SubmissionRequest(
        display_name="length on the copy", benchmark="sample-reworded", kind="scores", settings=("no_profile",),
        scores_file=_scores(copy, lambda text: len(text.split())), options={}))
    services.run_execute(run_id=published.runs.get().pk)
    services.submission_publish(user=other, submission=published)

    expected = ("Per-pair results of benchmark 'sample-reworded' are withheld while a blind rating campaign on "
                "benchmark 'sample', which holds the same pairs, is open")
    for url in (f"/models/{published.pk}/predictions.csv", f"/models/{published.pk}/pairs/",
                "/api/benchmarks/sample-reworded/items/"):
        response = _client(world["attacker"]).get(url)
        assert response.status_code == 403 and expected in _body(response), url
        assert _client(other).get(url).status_code == 200  # not a rater
    # A benchmark sharing no pair with a rated one is not withheld.
    unrelated = benchmark_create(name="unrelated", records=[
        dataclasses.replace(r, chosen=r.chosen + " (edited)") for r in benchmark_records(benchmark=world["bench"])])
    assert _client(world["attacker"]).get(f"/api/benchmarks/{unrelated.name}/items/").status_code == 200
    # A read of the copy counts against the original's campaign.
    campaign_set_open(campaign=world["campaign"], is_open=False)
    assert _client(world["attacker"]).get(f"/models/{published.pk}/predictions.csv").status_code == 200
    campaign_set_open(campaign=world["campaign"], is_open=True)
    refused = _next(world["attacker"], world["campaign"])
    assert refused.status_code == 403
    assert refused.json()["detail"].startswith("You were shown per-pair results of benchmark 'sample-reworded' "
                                               "(model predictions, ")


# --- (c) calibration bins ---------------------------------------------------------------------


def test_calibration_bins_are_withheld_with_the_per_pair_data(world):
    length = world["submissions"][0]
    url = f"/api/submissions/{length.pk}/"

    def calibration(user):
        return _client(user).get(url).json()["runs"][0]["metrics"]["calibration"]

    withheld = calibration(world["attacker"])  # the owner, who may rate
    assert withheld["reliability"] is None and withheld["raw"]["reliability"] is None
    assert withheld["withheld"].startswith(WITHHELD)
    assert isinstance(withheld["ece"], float)  # the summary figures stay
    shown = calibration(world["other"])
    assert isinstance(shown["reliability"], list) and shown["reliability"] and "withheld" not in shown
    assert sum(b["count"] for b in shown["reliability"]) == 60  # 30 pairs, each read both ways (2n rows)
    campaign_set_open(campaign=world["campaign"], is_open=False)
    assert isinstance(calibration(world["attacker"])["reliability"], list)


# --- (d) staff owners -------------------------------------------------------------------------


def test_a_staff_members_submission_is_owned_by_prbench_staff_for_everyone_else(world):
    staff = world["staff"]
    bench = world["bench"]
    made = services.submission_create(user=staff, request=services.SubmissionRequest(
        display_name="reference", benchmark="sample", kind="scores", settings=("no_profile",),
        scores_file=_scores(bench, lambda text: len(text)), options={}))
    services.run_execute(run_id=made.runs.get().pk)
    services.submission_publish(user=staff, submission=made)
    username = staff.get_username()
    for user in (None, world["other"]):
        page = _body(_client(user).get(f"/models/{made.pk}/"))
        assert "prbench staff" in page and username not in page
        assert _client(user).get(f"/api/submissions/{made.pk}/").json()["owner"] == "prbench staff"
        board = _client(user).get("/api/leaderboard/?benchmark=sample").json()
        rows = board["results"] if isinstance(board, dict) else board
        row = next(r for r in rows if r["display_name"] == "reference")
        assert (row["owner"], row["rm"]) == ("prbench staff", "prbench staff/reference")
        assert username not in _body(_client(user).get("/"))
    assert _client(staff).get(f"/api/submissions/{made.pk}/").json()["owner"] == username
    assert username in _body(_client(staff).get(f"/models/{made.pk}/"))
    # A researcher's own name is shown as before.
    assert _client(None).get(f"/api/submissions/{world['submissions'][1].pk}/").json()["owner"] == "olivia"


# --- (g) the item list ------------------------------------------------------------------------


def test_the_benchmark_item_list_is_withheld_from_raters(world):
    ids = list(world["bench"].items.values_list("source_id", flat=True))
    page = _client(world["attacker"]).get("/benchmarks/sample/?q=the")
    assert page.status_code == 200
    body = _body(page)
    assert 'id="items-withheld"' in body and WITHHELD in body
    assert not any(f'<code class="source-id">{i}</code>' in body for i in ids)
    shown = _body(_client(world["other"]).get("/benchmarks/sample/"))
    assert f'<code class="source-id">{ids[0]}</code>' in shown and 'id="items-withheld"' not in shown
