"""Campaigns, assignment with leases, blind payloads, ratings, roles and exports."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from annotation.models import Assignment, Campaign, CampaignPair, Rating
from annotation.services.campaigns import campaign_create
from annotation.services.leases import assignment_next, chosen_first, leases_reclaim
from annotation.services.ratings import rating_submit
from pipeline.models import BenchmarkItem
from pipeline.services import benchmark_import
from tests.concurrency import race
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

FULL = {"factuality": 4, "relevance": 5, "helpfulness": 4, "personal_rubrics": 5}


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture
def campaign(sample, staff_user):
    return campaign_create(user=staff_user, benchmark="sample", guidelines="Rate carefully.", overlap=2)


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def rate(client, token, first=FULL, second=None, **extra):
    second = second or {k: 2 if k == "personal_rubrics" else v for k, v in FULL.items()}
    return client.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": first, "2": second},
                                                    "seconds": 12.5, **extra}, format="json")


def test_staff_create_campaigns_through_the_api_and_others_cannot(sample, staff_user, annotator, researcher):
    body = {"benchmark": "sample", "overlap": 3, "guidelines": "# Guidelines\nBe fair."}
    assert client_for(annotator).post("/api/annotation/campaigns/", body, format="json").status_code == 403
    assert client_for(researcher).post("/api/annotation/campaigns/", body, format="json").status_code == 403
    response = client_for(staff_user).post("/api/annotation/campaigns/", body, format="json")
    assert response.status_code == 201 and response.json()["id"]
    campaign = Campaign.objects.get(pk=response.json()["id"])
    assert campaign.pairs.count() == 30 and campaign.overlap == 3
    assert [d["key"] for d in campaign.dimensions] == ["factuality", "relevance", "helpfulness", "personal_rubrics"]
    sample.refresh_from_db()
    assert sample.is_frozen
    listed = client_for(annotator).get("/api/annotation/campaigns/")
    assert listed.status_code == 200 and [c["id"] for c in listed.json()] == [campaign.pk]


def test_next_returns_a_blind_payload_and_the_same_pair_on_reload(campaign, annotator):
    client = client_for(annotator)
    first = client.get("/api/annotation/next/", {"campaign": campaign.pk})
    assert first.status_code == 200
    body = first.json()
    assert set(body) >= {"assignment", "question", "profile", "rubric", "responses", "progress"}
    assert [r["key"] for r in body["responses"]] == ["1", "2"]
    assert all(set(p) == {"text"} for p in body["profile"]) and all(set(a) == {"aspect"} for a in body["rubric"])
    assert body["progress"] == {"done": 0, "target": 30}
    again = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert again == body


def test_the_order_is_a_stable_hash_of_annotator_and_pair():
    orders = {chosen_first(campaign_id=1, annotator_id=a, item_id=i) for a in range(20) for i in range(20)}
    assert orders == {True, False}  # both orders occur
    assert chosen_first(campaign_id=1, annotator_id=3, item_id=7) == \
        chosen_first(campaign_id=1, annotator_id=3, item_id=7)


def test_ratings_are_stored_by_role_and_a_repeat_submit_is_idempotent(campaign, annotator):
    client = client_for(annotator)
    body = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    first = rate(client, body["assignment"])
    assert first.status_code == 201 and first.json()["progress"]["done"] == 1
    assert rate(client, body["assignment"]).status_code == 200
    assert Rating.objects.count() == 1
    rating = Rating.objects.get()
    assignment = Assignment.objects.get(token=body["assignment"])
    shown_first = rating.chosen if assignment.chosen_first else rating.rejected
    assert shown_first == FULL
    item = rating.item
    chosen_text = body["responses"][0 if assignment.chosen_first else 1]["text"]
    assert chosen_text == item.chosen


@pytest.mark.parametrize("ratings,field", [
    ({"1": FULL}, "ratings.2"),
    ({"1": FULL, "2": {**FULL, "helpfulness": 6}}, "ratings.2.helpfulness"),
    ({"1": {**FULL, "relevance": 0}, "2": FULL}, "ratings.1.relevance"),
    ({"1": {k: v for k, v in FULL.items() if k != "factuality"}, "2": FULL}, "ratings.1.factuality"),
    ({"1": {**FULL, "factuality": True}, "2": FULL}, "ratings.1.factuality"),
    ({"1": {**FULL, "factuality": "4"}, "2": FULL}, "ratings.1.factuality"),
    ({"1": FULL, "2": FULL, "3": FULL}, "ratings"),
])
def test_invalid_ratings_get_a_400_naming_the_field(campaign, annotator, ratings, field):
    client = client_for(annotator)
    token = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    response = client.post("/api/annotation/ratings/", {"assignment": token, "ratings": ratings}, format="json")
    assert response.status_code == 400 and response.json()["field"] == field
    assert field in response.json()["detail"]
    assert not Rating.objects.exists()


def test_no_pair_is_offered_twice_and_no_work_left_is_a_204(sample, staff_user, annotator):
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1,
                               target_per_annotator=3)
    client = client_for(annotator)
    seen = set()
    for _ in range(3):
        body = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
        assert body["question"] not in seen
        seen.add(body["question"])
        assert rate(client, body["assignment"]).status_code == 201
    assert client.get("/api/annotation/next/", {"campaign": campaign.pk}).status_code == 204


def test_skipped_pairs_are_not_offered_again_and_free_their_slot(campaign, annotator):
    client = client_for(annotator)
    body = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert client.post("/api/annotation/skip/", {"assignment": body["assignment"], "reason": "unclear question",
                                                 "flag": True}, format="json").status_code == 200
    pair = Assignment.objects.get(token=body["assignment"]).pair
    assert pair.taken == 0
    nxt = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert nxt["assignment"] != body["assignment"] and nxt["question"] != body["question"]
    assert rate(client, body["assignment"]).status_code == 409


def test_pairs_closest_to_completion_are_offered_first(campaign):
    a, b = UserFactory(roles=["annotator"]), UserFactory(roles=["annotator"])
    first = client_for(a).get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert rate(client_for(a), first["assignment"]).status_code == 201
    # b gets the pair that a already rated: it needs one more rating to be complete.
    second = client_for(b).get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert second["question"] == first["question"]


def test_expired_leases_are_reclaimed_and_a_late_submit_is_accepted_while_there_is_room(campaign):
    a, b, c = (UserFactory(roles=["annotator"]) for _ in range(3))
    token = client_for(a).get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    Assignment.objects.filter(token=token).update(expires_at=timezone.now() - timedelta(minutes=1))
    assert leases_reclaim() == 1
    assert Assignment.objects.get(token=token).status == Assignment.Status.EXPIRED
    assert rate(client_for(a), token).status_code == 201  # room left: accepted late

    # Now fill the pair (overlap 2) while another annotator's lease has expired: 409, nothing stored.
    pair = Assignment.objects.get(token=token).pair
    late = Assignment.objects.create(token="late-token", campaign=campaign, pair=pair, annotator=c, chosen_first=True,
                                     status=Assignment.Status.EXPIRED, expires_at=timezone.now())
    body_b = client_for(b).get("/api/annotation/next/", {"campaign": campaign.pk}).json()
    assert Assignment.objects.get(token=body_b["assignment"]).pair == pair
    assert rate(client_for(b), body_b["assignment"]).status_code == 201
    response = rate(client_for(c), late.token)
    assert response.status_code == 409 and "draft is kept" in response.json()["detail"]
    assert Rating.objects.filter(annotator=c).count() == 0
    pair.refresh_from_db()
    assert pair.taken == 2 == Rating.objects.filter(assignment__pair=pair).count()


def test_only_annotators_annotate_and_nobody_reads_anothers_assignment(campaign, researcher, annotator):
    assert client_for(researcher).get("/api/annotation/next/", {"campaign": campaign.pk}).status_code == 403
    token = client_for(annotator).get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    other = UserFactory(roles=["annotator"])
    assert rate(client_for(other), token).status_code == 404
    assert client_for(annotator).get(f"/api/annotation/campaigns/{campaign.pk}/report/").status_code == 403
    assert client_for(annotator).get(f"/api/annotation/campaigns/{campaign.pk}/ratings/").status_code == 403


def test_the_database_allows_one_rating_per_annotator_and_pair(campaign, annotator):
    from django.db import IntegrityError, transaction

    token = client_for(annotator).get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    rate(client_for(annotator), token)
    rating = Rating.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Rating.objects.create(assignment=Assignment.objects.create(
            token="x", campaign=campaign, pair=CampaignPair.objects.exclude(pk=rating.assignment.pair_id).first(), annotator=annotator,
            chosen_first=True, expires_at=timezone.now()), campaign=campaign, item=rating.item, annotator=annotator,
            chosen=FULL, rejected=FULL)


def test_staff_export_ratings_in_long_format(client, campaign, annotator, staff_user):
    token = client_for(annotator).get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    rate(client_for(annotator), token)
    client.force_login(staff_user)
    csv_lines = b"".join(client.get(f"/annotation/campaigns/{campaign.pk}/ratings.csv").streaming_content) \
        .decode().splitlines()
    assert csv_lines[0].startswith("annotator,pair,domain,role,dimension,value")
    assert len(csv_lines) == 1 + 8
    rows = [json.loads(line) for line in b"".join(
        client.get(f"/annotation/campaigns/{campaign.pk}/ratings.jsonl").streaming_content).decode().splitlines()]
    assert {(r["role"], r["dimension"]) for r in rows} == {(role, d) for role in ("chosen", "rejected") for d in FULL}


def test_every_payload_an_annotator_can_receive_leaks_nothing(client, campaign, annotator):
    """Gather every page and API answer an annotator can get and look for the answer key:
    which response is chosen, role words, item and source ids."""
    api = client_for(annotator)
    client.force_login(annotator)
    payloads = [client.get("/annotate/").content.decode(),
                client.get(f"/annotate/{campaign.pk}/").content.decode(),
                json.dumps(api.get("/api/annotation/campaigns/").json())]
    items = []
    for _ in range(4):
        body = api.get("/api/annotation/next/", {"campaign": campaign.pk})
        payloads.append(body.content.decode())
        items.append(Assignment.objects.get(token=body.json()["assignment"]))
        payloads.append(rate(api, body.json()["assignment"]).content.decode())
    payloads.append(api.post("/api/annotation/ratings/", {"assignment": "nope", "ratings": {}},
                             format="json").content.decode())
    text = "\n".join(payloads)
    from django.conf import settings

    text += (settings.BASE_DIR / "static" / "js" / "annotate.js").read_text()  # the screen's own script
    # The texts annotators are meant to read may use these words in plain English ("narrative
    # books"); look for the words everywhere else.
    for assignment in items:
        item = assignment.pair.item
        shown = [item.question, item.chosen, item.rejected] + [str(a.get("aspect", "")) for a in item.rubric_aspects] \
            + [str(p.get("text", "")) for p in item.profile]
        for piece in shown:
            text = text.replace(json.dumps(piece)[1:-1], "")
    for word in ("chosen", "rejected", "narrative", "evidence", "source_id", "is_gold"):
        assert word not in text.lower(), word
    for assignment in items:
        item = assignment.pair.item
        assert item.source_id not in text
        assert f"/items/{item.pk}" not in text
        assert item.narrative not in text
    # The pair payloads carry no identifier but the opaque token (the campaign's own id aside).
    for raw in payloads:
        body = json.loads(raw) if raw.startswith("{") else {}
        if "question" in body:
            assert set(body) - {"campaign"} == {"assignment", "question", "profile", "rubric", "responses",
                                                 "dimensions", "expires_at", "progress"}
            assert not any(key in {"id", "pk", "item", "pair"} for key in body)
    # Response order is not a hint either: both orders occur across annotators.
    firsts = {chosen_first(campaign_id=campaign.pk, annotator_id=u, item_id=items[0].pair.item_id)
     for u in range(1, 40)}
    assert firsts == {True, False}


def test_no_pair_ever_exceeds_the_overlap_under_concurrent_annotators(transactional_db, sample, staff_user,
                                                                      require_postgres):
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)
    annotators = [UserFactory(roles=["annotator"]) for _ in range(12)]

    def work(i):
        user = annotators[i]
        for _ in range(6):
            lease = assignment_next(user=user, campaign_id=campaign.pk)
            if lease is None:
                return
            first = {k: 3 for k in FULL}
            rating_submit(user=user, token=lease.assignment.token, ratings={"1": first, "2": first},
                          seconds=1)

    errors = [o for o in race(len(annotators), work) if isinstance(o, Exception)]
    assert not errors, errors
    per_pair = {}
    for pair_id in Rating.objects.values_list("assignment__pair_id", flat=True):
        per_pair[pair_id] = per_pair.get(pair_id, 0) + 1
    assert max(per_pair.values()) <= 2
    assert sum(per_pair.values()) == 12 * 5  # 30 pairs x overlap 2 = 60 slots for 72 requests
    for pair in CampaignPair.objects.filter(campaign=campaign):
        live = pair.assignments.filter(status__in=["leased", "submitted"]).count()
        assert pair.taken == live <= 2
    assert BenchmarkItem.objects.count() == 30
