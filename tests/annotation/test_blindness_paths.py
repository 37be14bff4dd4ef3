"""Blindness on every path (hostile review of the blindness fixes, F1, F9, F10).

F1. Someone shown the answer key after a pair was leased to them (a model's predictions: every
    pair; a benchmark item page: that pair) may not submit that lease, renew it, get it back
    from `next`, undo its skip, revise a rating of it or save a draft on it: 403 with the same
    reason `next` gives for a new pair, the lease released.
F9. The campaigns API names a campaign's assignees to staff only.
F10. A token of another campaign is refused before anything changes; removed assignees can
    neither revise nor save drafts; a re-annotation request names each pair once; too many form
    fields get a sentence, not a bare 400.
"""

import json

import pytest
from django.test import Client
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

from annotation.models import Assignment, CampaignPair, Rating
from annotation.services.campaigns import campaign_create, campaign_set_assignees, campaign_set_open
from annotation.services.errors import NOT_ASSIGNED
from leaderboard.services import health as health_service
from tests.annotation.test_blindness import _client, world  # noqa: F401 (a fixture)
from tests.factories import UserFactory
from tests.leaderboard.test_health import stored  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

DIMS = ("factuality", "relevance", "helpfulness", "personal_rubrics")
FULL = dict.fromkeys(DIMS, 3)


def _lease(client, campaign) -> Assignment:
    response = client.get(f"/api/annotation/next/?campaign={campaign.pk}")
    assert response.status_code == 200, response.content
    return Assignment.objects.select_related("pair__item").get(token=response.json()["assignment"])


def _submit(client, token):
    return client.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL}},
                       content_type="application/json")


def _revise(client, campaign, token, value=5):
    fields = {f"r{r}-{d}": value for r in ("1", "2") for d in DIMS}
    return client.post(f"/annotate/{campaign.pk}/history/{token}/", {**fields, "comment": "changed"},
                       HTTP_ACCEPT="application/json")


def _whole_read_reason(name="sample", what="model predictions"):
    return (f"You were shown per-pair results of benchmark '{name}' ({what}, {timezone.now():%Y-%m-%d}), which "
            "hold the pairs of this campaign, so you cannot rate them blind; staff can point you to another "
            "campaign.")


def _pair_read_reason():
    return ("You were shown this pair with its answer key (benchmark item page of benchmark 'sample', "
            f"{timezone.now():%Y-%m-%d}), so you cannot rate it blind; it is not offered to you again.")


def _close_read_reopen(campaign, client, url):
    campaign_set_open(campaign=campaign, is_open=False)
    assert client.get(url).status_code == 200  # public while no campaign on it is open (and logged)
    campaign_set_open(campaign=campaign, is_open=True)


# --- F1: a read of every pair (a model's predictions) ---------------------------------------------

def test_after_reading_predictions_a_held_lease_a_skip_a_rating_and_a_draft_are_all_refused(world):
    campaign, mallory = world["campaign"], world["attacker"]
    client = _client(mallory)
    rated = _lease(client, campaign)
    assert _submit(client, rated.token).status_code == 201  # rated blind
    skipped = _lease(client, campaign)
    assert client.post("/api/annotation/skip/", {"assignment": skipped.token, "reason": "unsure"},
                       content_type="application/json").status_code == 200
    held = _lease(client, campaign)

    _close_read_reopen(campaign, client, f"/models/{world['submissions'][0].pk}/predictions.csv")

    reason = _whole_read_reason()
    submitted = _submit(client, held.token)
    assert (submitted.status_code, submitted.json()["detail"]) == (403, reason)
    undone = client.post("/api/annotation/skip/undo/", {"assignment": skipped.token}, content_type="application/json")
    assert (undone.status_code, undone.json()["detail"]) == (403, reason)
    revised = _revise(client, campaign, rated.token)
    assert (revised.status_code, revised.json()["detail"]) == (403, reason)
    page = client.get(f"/annotate/{campaign.pk}/history/{rated.token}/")
    assert page.status_code == 403 and "you cannot rate them blind" in page.content.decode()
    draft = client.put(f"/api/annotation/drafts/{held.token}/", {"comment": "x"}, content_type="application/json")
    assert (draft.status_code, draft.json()["detail"]) == (403, reason)
    refused = client.get(f"/api/annotation/next/?campaign={campaign.pk}")
    assert (refused.status_code, refused.json()["detail"]) == (403, reason)
    # Nothing changed: one rating (as given), the skip stands, the held lease holds no slot.
    rating = Rating.objects.get(annotator=mallory)
    assert rating.chosen == FULL and rating.revised_at is None and not rating.revisions.exists()
    assert Assignment.objects.get(pk=skipped.pk).status == Assignment.Status.SKIPPED
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.EXPIRED
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 0


def test_a_live_lease_is_released_when_its_holder_is_refused_after_a_read(world):
    """Staff may read per-pair data while a campaign is open (the read is logged) and may rate:
    a lease live at the read is refused at submit and its slot freed, and so is it at `next`."""
    campaign, staff = world["campaign"], world["staff"]
    client = _client(staff)
    held = _lease(client, campaign)
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 1
    assert client.get(f"/models/{world['submissions'][0].pk}/predictions.csv").status_code == 200
    submitted = _submit(client, held.token)
    assert (submitted.status_code, submitted.json()["detail"]) == (403, _whole_read_reason())
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.EXPIRED
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 0

    other = _lease(_client(UserFactory(is_staff=True, username="sam")), campaign)
    assert CampaignPair.objects.get(pk=other.pair_id).taken == 1
    assert _client(other.annotator).get(f"/models/{world['submissions'][0].pk}/predictions.csv").status_code == 200
    assert _client(other.annotator).get(f"/api/annotation/next/?campaign={campaign.pk}").status_code == 403
    assert Assignment.objects.get(pk=other.pk).status == Assignment.Status.EXPIRED
    assert CampaignPair.objects.get(pk=other.pair_id).taken == 0


# --- F1: a read of one pair (its item page) ---------------------------------------------------

def test_a_pair_read_on_its_item_page_is_not_renewed_returned_submitted_revised_or_unskipped(world):
    campaign, mallory = world["campaign"], world["attacker"]
    client = _client(mallory)
    rated = _lease(client, campaign)
    assert _submit(client, rated.token).status_code == 201
    skipped = _lease(client, campaign)
    client.post("/api/annotation/skip/", {"assignment": skipped.token, "reason": "unsure"},
                content_type="application/json")
    held = _lease(client, campaign)
    campaign_set_open(campaign=campaign, is_open=False)
    for read in (rated, skipped, held):
        assert client.get(f"/benchmarks/sample/items/{read.pair.item_id}/").status_code == 200
    campaign_set_open(campaign=campaign, is_open=True)

    given = _lease(client, campaign)  # not the held pair renewed: another one
    assert given.token != held.token and given.pair_id not in (rated.pair_id, skipped.pair_id, held.pair_id)
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.EXPIRED
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 0
    reason = _pair_read_reason()
    submitted = _submit(client, held.token)
    assert (submitted.status_code, submitted.json()["detail"]) == (403, reason)
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 0
    undone = client.post("/api/annotation/skip/undo/", {"assignment": skipped.token}, content_type="application/json")
    assert (undone.status_code, undone.json()["detail"]) == (403, reason)
    revised = _revise(client, campaign, rated.token)
    assert (revised.status_code, revised.json()["detail"]) == (403, reason)
    # The pair they hold now was not read: it is submitted as before.
    assert _submit(client, given.token).status_code == 201


def test_a_live_lease_on_a_pair_read_since_is_released_and_another_pair_given(world):
    campaign, staff = world["campaign"], world["staff"]
    client = _client(staff)
    held = _lease(client, campaign)
    assert client.get(f"/benchmarks/sample/items/{held.pair.item_id}/").status_code == 200  # staff: shown, logged
    given = _lease(client, campaign)
    assert given.token != held.token and given.pair_id != held.pair_id
    assert Assignment.objects.get(pk=held.pk).status == Assignment.Status.EXPIRED
    assert CampaignPair.objects.get(pk=held.pair_id).taken == 0


# --- F9: assignees for staff only -------------------------------------------------------------

def test_the_campaigns_api_names_assignees_to_staff_only_and_the_schema_says_so(world):
    campaign, staff = world["campaign"], world["staff"]
    rita = UserFactory(roles=["annotator"], username="rita")
    campaign_set_assignees(campaign=campaign, annotators=[rita, world["attacker"]], groups=[])
    seen = _client(rita).get("/api/annotation/campaigns/").json()
    assert [(c["id"], c["annotators"]) for c in seen] == [(campaign.pk, None)]
    assert [(c["id"], c["annotators"]) for c in _client(staff).get("/api/annotation/campaigns/").json()] == [
        (campaign.pk, ["mallory", "rita"])]
    schema = OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True))
    field = json.loads(schema)["components"]["schemas"]["Campaign"]["properties"]["annotators"]
    assert field["nullable"] is True and field["type"] == "array" and "Staff only" in field["description"]


# --- F10 (a, b): the campaign first, the assignee rule everywhere ------------------------------

def test_a_token_of_another_campaign_undoes_and_revises_nothing(world):
    campaign, mallory = world["campaign"], world["attacker"]
    other = campaign_create(user=world["staff"], benchmark="sample", guidelines="g", name="other")
    client = _client(mallory)
    rated = _lease(client, campaign)
    _submit(client, rated.token)
    skipped = _lease(client, campaign)
    client.post("/api/annotation/skip/", {"assignment": skipped.token, "reason": "unsure"},
                content_type="application/json")
    assert client.post(f"/annotate/{other.pk}/skipped/{skipped.token}/undo/").status_code == 404
    assert Assignment.objects.get(pk=skipped.pk).status == Assignment.Status.SKIPPED
    wrong = _revise(client, other, rated.token)
    assert (wrong.status_code, wrong.json()["detail"]) == (404, "No such assignment.")
    assert Rating.objects.get(assignment=rated).revised_at is None
    assert client.get(f"/annotate/{other.pk}/history/{rated.token}/").status_code == 404
    # The right campaign still works.
    assert client.post(f"/annotate/{campaign.pk}/skipped/{skipped.token}/undo/").status_code == 302
    assert Assignment.objects.get(pk=skipped.pk).status == Assignment.Status.LEASED


def test_a_removed_assignee_can_neither_revise_nor_keep_drafts(world):
    campaign = world["campaign"]
    ann, kept = UserFactory(roles=["annotator"]), UserFactory(roles=["annotator"])
    campaign_set_assignees(campaign=campaign, annotators=[ann, kept], groups=[])
    client = _client(ann)
    rated = _lease(client, campaign)
    _submit(client, rated.token)
    held = _lease(client, campaign)
    campaign_set_assignees(campaign=campaign, annotators=[kept], groups=[])  # ends ann's lease
    revised = _revise(client, campaign, rated.token)
    assert (revised.status_code, revised.json()["detail"]) == (403, NOT_ASSIGNED)
    page = client.get(f"/annotate/{campaign.pk}/history/{rated.token}/")
    assert page.status_code == 403 and NOT_ASSIGNED in page.content.decode()
    draft = client.put(f"/api/annotation/drafts/{held.token}/", {"comment": "x"}, content_type="application/json")
    assert (draft.status_code, draft.json()["detail"]) == (403, NOT_ASSIGNED)
    assert Assignment.objects.get(pk=held.pk).draft is None
    assert Rating.objects.get(assignment=rated).revised_at is None


# --- F10 (c, d): the re-annotation request -----------------------------------------------------

def test_a_reannotation_request_names_each_pair_once(stored, staff_user):
    campaign = health_service.health_campaign_create(user=staff_user, benchmark=stored, guidelines="Look again.",
                                                     pairs=["p2", "p4", "p2", "p4", "p1"])
    assert campaign.origin["pairs"] == ["p2", "p4", "p1"]
    assert campaign.name == "health-demo re-annotation (3 pairs)"
    assert sorted(campaign.pairs.values_list("item__source_id", flat=True)) == ["p1", "p2", "p4"]


def test_too_many_ticked_pairs_get_a_sentence_not_a_bare_400(stored, staff_user):
    client = Client()
    client.force_login(staff_user)
    body = "&".join(f"pair=p{i}" for i in range(1001))
    response = client.post("/benchmarks/health-demo/health/reannotate/", body,
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert ("The form sent more than 1000 fields, more than the server reads from one request. To open a "
            "re-annotation campaign on that many pairs, choose a flag on the benchmark's health page instead of "
            "ticking each pair, or tick fewer pairs.") in response.content.decode().replace("&#x27;", "'")
