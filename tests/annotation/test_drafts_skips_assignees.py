"""Issue 31 (annotators and staff): drafts kept on the server, skips undone and exported,
campaigns assigned to annotators or groups, guidelines from a template or another campaign with
a preview, the pair view's rubric and previous/next, the revise page's JSON answers, and where
annotators land after login."""

import html
import json

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from annotation.models import Assignment, Campaign
from annotation.services.campaigns import campaign_create, campaign_set_assignees, campaign_set_open
from annotation.services.errors import AnnotationError
from pipeline.models import BenchmarkItem
from pipeline.services import benchmark_import
from tests.factories import PASSWORD, UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

DIMS = ("factuality", "relevance", "helpfulness", "personal_rubrics")
FULL = dict.fromkeys(DIMS, 3)


@pytest.fixture
def campaign(staff_user):
    benchmark_import(path=SAMPLE, name="sample")
    return campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def lease(client, campaign) -> str:
    response = client.get("/api/annotation/next/", {"campaign": campaign.pk})
    assert response.status_code == 200, response.content
    return response.json()["assignment"]


# --- drafts --------------------------------------------------------------------------------------

def test_a_draft_is_kept_on_the_server_by_position_and_cleared_by_the_submit(campaign, annotator):
    client = api_for(annotator)
    token = lease(client, campaign)
    url = f"/api/annotation/drafts/{token}/"
    assert client.get(url).status_code == 204  # nothing yet
    draft = {"ratings": {"1": {"factuality": 4, "relevance": 2}, "2": {}}, "comment": "half done",
             "flag": False, "flag_reason": "", "seconds": 12.5}
    saved = client.put(url, draft, format="json")
    assert saved.status_code == 200
    # Another browser (another client of the same person) reads it back, positions as sent.
    again = api_for(annotator).get(url).json()
    assert {k: again[k] for k in draft} == draft and again["saved_at"]
    assert "chosen" not in json.dumps(again) and "rejected" not in json.dumps(again)
    # Someone else's token looks like a missing one.
    assert api_for(UserFactory(roles=["annotator"])).get(url).status_code == 404
    # Bad drafts: one line naming the field.
    bad = client.put(url, {"ratings": {"1": {"factuality": 7}}}, format="json")
    assert bad.status_code == 400 and bad.json() == {
        "detail": "draft.ratings.1.factuality: must be a whole number from 1 to 5.", "field": "draft.ratings.1.factuality"}
    assert client.put(url, {"ratings": {"3": {}}}, format="json").json()["field"] == "draft.ratings"
    assert client.put(url, {"comment": "x" * 5001}, format="json").json()["field"] == "draft.comment"
    assert client.put(url, {"seconds": -1}, format="json").json()["field"] == "draft.seconds"
    assert client.put(url, {"colour": "red"}, format="json").json()["field"] == "draft"
    # The submit clears it; a late autosave is refused.
    assert client.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL}},
                       format="json").status_code == 201
    assignment = Assignment.objects.get(token=token)
    assert assignment.draft is None and assignment.draft_saved_at is None
    assert client.get(url).status_code == 204
    late = client.put(url, draft, format="json")
    assert late.status_code == 409 and "already rated or skipped" in late.json()["detail"]


def test_a_skip_clears_the_draft(campaign, annotator):
    client = api_for(annotator)
    token = lease(client, campaign)
    client.put(f"/api/annotation/drafts/{token}/", {"ratings": {"1": {"factuality": 1}}}, format="json")
    assert client.post("/api/annotation/skip/", {"assignment": token, "reason": "unclear"},
                       format="json").status_code == 200
    assert Assignment.objects.get(token=token).draft is None


# --- skips: undo and export ------------------------------------------------------------------------

def test_a_skip_is_undone_while_the_campaign_is_open_and_its_pair_comes_next(campaign, annotator, client):
    api = api_for(annotator)
    skipped = lease(api, campaign)
    api.post("/api/annotation/skip/", {"assignment": skipped, "reason": "cut off", "flag": True}, format="json")
    held = lease(api, campaign)
    api.put(f"/api/annotation/drafts/{held}/", {"ratings": {"2": {"relevance": 5}}}, format="json")
    client.force_login(annotator)
    page = client.get(f"/annotate/{campaign.pk}/history/").content.decode()
    assert "cut off" in page and f"/annotate/{campaign.pk}/skipped/{skipped}/undo/" in page
    assert "chosen" not in page.lower() and "rejected" not in page.lower()

    response = client.post(f"/annotate/{campaign.pk}/skipped/{skipped}/undo/")
    assert response.status_code == 302 and response["Location"] == f"/annotate/{campaign.pk}/history/"
    back = Assignment.objects.get(token=skipped)
    assert (back.status, back.skip_reason, back.flagged) == (Assignment.Status.LEASED, "", False)
    # It is what the rating screen shows next; the pair held meanwhile waits, its draft kept.
    assert lease(api, campaign) == skipped
    other = Assignment.objects.get(token=held)
    assert other.status == Assignment.Status.EXPIRED and other.draft["ratings"]["2"] == {"relevance": 5}
    assert back.pair.taken == 1 and other.pair.taken == 0  # slots follow the leases
    again = api.post("/api/annotation/skip/undo/", {"assignment": skipped}, format="json")
    assert again.status_code == 409 and again.json()["detail"] == "This pair is not skipped."


def test_an_undo_is_refused_when_the_pair_filled_up_or_the_campaign_closed(campaign, annotator):
    api = api_for(annotator)
    token = lease(api, campaign)
    api.post("/api/annotation/skip/", {"assignment": token, "reason": "unsure"}, format="json")
    assignment = Assignment.objects.get(token=token)
    type(assignment.pair).objects.filter(pk=assignment.pair_id).update(taken=2)  # two others hold it
    full = api.post("/api/annotation/skip/undo/", {"assignment": token}, format="json")
    assert full.status_code == 409 and "Enough people have rated this pair" in full.json()["detail"]
    assert Assignment.objects.get(token=token).status == Assignment.Status.SKIPPED  # nothing changed
    campaign_set_open(campaign=campaign, is_open=False)
    closed = api.post("/api/annotation/skip/undo/", {"assignment": token}, format="json")
    assert closed.status_code == 409 and "closed" in closed.json()["detail"]
    assert api_for(UserFactory(roles=["annotator"])).post(
        "/api/annotation/skip/undo/", {"assignment": token}, format="json").status_code == 404


def test_skips_are_exported_with_their_reasons_for_staff(campaign, annotator, staff_user, client):
    api = api_for(annotator)
    token = lease(api, campaign)
    api.post("/api/annotation/skip/", {"assignment": token, "reason": "=SUM(A1)", "flag": True}, format="json")
    source_id = Assignment.objects.get(token=token).pair.item.source_id
    client.force_login(annotator)
    assert client.get(f"/annotation/campaigns/{campaign.pk}/skips.csv").status_code == 403
    client.force_login(staff_user)
    lines = b"".join(client.get(f"/annotation/campaigns/{campaign.pk}/skips.csv").streaming_content) \
        .decode().splitlines()
    assert lines[0] == "annotator,pair,domain,reason,flagged,leased_at,skipped_at"
    assert len(lines) == 2 and lines[1].startswith(f"{annotator.username},{source_id},")
    assert ",'=SUM(A1),True," in lines[1]  # formula-safe
    (row,) = [json.loads(line) for line in b"".join(client.get(
        f"/api/annotation/campaigns/{campaign.pk}/skips/?format=jsonl").streaming_content).decode().splitlines()]
    assert (row["reason"], row["flagged"], row["pair"]) == ("=SUM(A1)", True, source_id) and row["skipped_at"]


# --- assignees -----------------------------------------------------------------------------------------

def test_a_campaign_with_assignees_is_seen_and_leased_only_by_them(campaign, staff_user, client):
    alice, bob, carol = (UserFactory(username=n, roles=["annotator"]) for n in ("alice", "bob", "carol"))
    team = Group.objects.create(name="team-b")
    carol.groups.add(team)
    mine = campaign_create(user=staff_user, benchmark="sample", guidelines="g", name="Alice's",
                           annotators=["alice"], groups=[team])
    for user, sees in ((alice, True), (bob, False), (carol, True)):
        client.force_login(user)
        assert ("Alice&#x27;s" in client.get("/annotate/").content.decode()) is sees, user
        names = {c["name"] for c in api_for(user).get("/api/annotation/campaigns/").json()}
        assert names == ({"Alice's", campaign.name} if sees else {campaign.name})
        response = api_for(user).get("/api/annotation/next/", {"campaign": mine.pk})
        assert response.status_code == (200 if sees else 403)
        assert client.get(f"/annotate/{mine.pk}/").status_code == (200 if sees else 403)
    assert api_for(bob).get("/api/annotation/next/", {"campaign": mine.pk}).json() == {
        "detail": "This campaign is assigned to other annotators."}
    assert api_for(bob).get("/api/annotation/next/", {"campaign": campaign.pk}).status_code == 200  # none: all
    body = api_for(staff_user).get("/api/annotation/campaigns/").json()
    assert {c["name"]: (c["annotators"], c["groups"]) for c in body}["Alice's"] == (["alice"], ["team-b"])

    # Taking alice off ends her live lease; her submit is then refused.
    token = Assignment.objects.get(annotator=alice, campaign=mine).token
    result = campaign_set_assignees(campaign=mine, annotators=[], groups=[team])
    assert result == {"annotators": 0, "groups": 1, "leases_ended": 1}
    assert Assignment.objects.get(token=token).status == Assignment.Status.EXPIRED
    refused = api_for(alice).post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL}},
                                  format="json")
    assert refused.status_code == 403
    assert Assignment.objects.get(annotator=carol, campaign=mine).status == Assignment.Status.LEASED


def test_assignees_are_checked_and_the_api_takes_them(campaign, staff_user, researcher):
    with pytest.raises(AnnotationError) as unknown:
        campaign_create(user=staff_user, benchmark="sample", guidelines="g", annotators=["nobody"])
    assert unknown.value.field == "annotators" and str(unknown.value) == "annotators: no user named 'nobody'."
    with pytest.raises(AnnotationError) as not_one:
        campaign_create(user=staff_user, benchmark="sample", guidelines="g",
                        annotators=[researcher.username])
    assert str(not_one.value) == f"annotators: '{researcher.username}' does not have the annotator role."
    UserFactory(username="dana", roles=["annotator"])
    created = api_for(staff_user).post("/api/annotation/campaigns/", {
        "benchmark": "sample", "guidelines": "g", "annotators": ["dana"]}, format="json")
    assert created.status_code == 201 and created.json()["annotators"] == ["dana"]
    bad = api_for(staff_user).post("/api/annotation/campaigns/", {
        "benchmark": "sample", "guidelines": "g", "groups": ["no-such-team"]}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "groups"


def test_staff_assign_annotators_on_a_page(campaign, staff_user, client):
    erin = UserFactory(username="erin", roles=["annotator"])
    client.force_login(staff_user)
    page = client.get(f"/annotation/campaigns/{campaign.pk}/annotators/").content.decode()
    assert "erin" in page
    response = client.post(f"/annotation/campaigns/{campaign.pk}/annotators/", {"annotators": [erin.pk]})
    assert response.status_code == 302
    assert list(Campaign.objects.get(pk=campaign.pk).assignees.values_list("username", flat=True)) == ["erin"]
    assert "Rated by erin only" in client.get("/annotation/campaigns/").content.decode()


# --- guidelines: template, copy, preview ------------------------------------------------------------------

def test_new_campaigns_start_from_the_template_or_a_campaigns_guidelines_with_a_preview(campaign, staff_user, client):
    Campaign.objects.filter(pk=campaign.pk).update(guidelines="## Pilot rules\n\nRead **twice**.")
    client.force_login(staff_user)
    page = client.get("/annotation/campaigns/new/").content.decode()
    assert "# How to rate" in page  # the template, not an empty box
    assert f'<option value="{campaign.pk}">Copy from {campaign.name} (sample)</option>' in page
    copied = client.get(f"/annotation/campaigns/new/?from={campaign.pk}").content.decode()
    assert "## Pilot rules" in copied
    preview = client.post("/annotation/campaigns/new/", {"benchmark": "sample", "guidelines": "Read **twice**.",
                                                         "preview": "1", "overlap": "3", "lease_minutes": "30",
                                                         "rubric_min_diff": "2", "other_max_diff": "1"})
    html = preview.content.decode()
    assert preview.status_code == 200 and "Preview: what annotators see" in html
    assert "<p>Read <strong>twice</strong>.</p>" in html
    assert Campaign.objects.count() == 1  # a preview creates nothing
    edit = client.get(f"/annotation/campaigns/{campaign.pk}/guidelines/?from=template").content.decode()
    assert "# How to rate" in edit
    shown = client.post(f"/annotation/campaigns/{campaign.pk}/guidelines/", {"guidelines": "<script>x</script>Hi",
                                                                             "preview": "1"}).content.decode()
    assert "<script>x</script>" not in shown and "Preview: what annotators see" in shown  # sanitised
    assert Campaign.objects.get(pk=campaign.pk).guidelines == "## Pilot rules\n\nRead **twice**."  # not saved


# --- the pair view ------------------------------------------------------------------------------------------

def test_the_pair_view_shows_the_rubric_and_links_the_neighbouring_pairs(campaign, staff_user, client):
    items = list(BenchmarkItem.objects.filter(benchmark=campaign.benchmark).order_by("position"))
    client.force_login(staff_user)
    first = html.unescape(client.get(f"/annotation/campaigns/{campaign.pk}/pairs/{items[0].source_id}/")
                          .content.decode())
    aspect = items[0].rubric_aspects[0]
    assert aspect["aspect"] in first and aspect["evidence"] in first
    assert "Pair 1 of 30 in benchmark order" in first
    assert f'href="/annotation/campaigns/{campaign.pk}/pairs/{items[1].source_id}/"' in first
    assert 'rel="prev"' not in first
    middle = client.get(f"/annotation/campaigns/{campaign.pk}/pairs/{items[1].source_id}/").content.decode()
    assert f'rel="prev" href="/annotation/campaigns/{campaign.pk}/pairs/{items[0].source_id}/"' in middle
    last = client.get(f"/annotation/campaigns/{campaign.pk}/pairs/{items[-1].source_id}/").content.decode()
    assert "Pair 30 of 30" in last and 'rel="next"' not in last


# --- revise (the rating screen) and login -------------------------------------------------------------------

def test_the_revise_screen_answers_json_to_the_rating_screen(campaign, annotator, client):
    api = api_for(annotator)
    token = lease(api, campaign)
    api.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL}}, format="json")
    client.force_login(annotator)
    url = f"/annotate/{campaign.pk}/history/{token}/"
    page = client.get(url).content.decode()
    assert 'data-mode="revise"' in page and 'id="revise-data"' in page and "chosen" not in page.lower()
    form = {f"r{r}-{d}": "4" for r in "12" for d in DIMS}
    bad = client.post(url, {**form, "r2-helpfulness": "0"}, HTTP_ACCEPT="application/json")
    assert bad.status_code == 400 and bad.json() == {
        "detail": "ratings.2.helpfulness: must be a whole number from 1 to 5.", "field": "ratings.2.helpfulness"}
    good = client.post(url, {**form, "comment": "again"}, HTTP_ACCEPT="application/json")
    assert good.status_code == 200 and good.json() == {"next": f"/annotate/{campaign.pk}/history/"}
    assert Assignment.objects.get(token=token).rating.comment == "again"


def test_annotators_land_on_their_queue_after_login_and_others_on_the_leaderboard(annotator, researcher, client):
    for user, where in ((annotator, "/annotate/"), (researcher, "/")):
        response = client.post("/accounts/login/", {"username": user.username, "password": PASSWORD})
        assert response.status_code == 302 and response["Location"] == where, user
        client.logout()
    both = UserFactory(roles=["annotator", "researcher"])
    assert client.post("/accounts/login/", {"username": both.username, "password": PASSWORD})["Location"] == "/"
    client.logout()
    # An explicit ?next= still wins.
    response = client.post("/accounts/login/?next=/benchmarks/", {"username": annotator.username,
                                                                  "password": PASSWORD})
    assert response["Location"] == "/benchmarks/"
