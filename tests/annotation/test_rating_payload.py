"""Issue 32: one typed rating payload (annotation.services.ratings.RatingPayload, pydantic),
validated once inside the service, for the rating API, the revision page's form and drafts:
a bad value gets one sentence naming the field, the same on every door."""

import html
import json

import pytest
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from rest_framework.test import APIClient

from annotation.models import Assignment, Rating
from annotation.services.campaigns import campaign_create
from annotation.services.errors import AnnotationError
from annotation.services.ratings import Draft, RatingPayload, form_payload, rating_submit
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE

DIMS = ["factuality", "relevance", "helpfulness", "personal_rubrics"]
FULL = dict.fromkeys(DIMS, 4)
RELEVANCE_9 = "ratings.1.relevance: must be a whole number from 1 to 5."


def refusal(model, data, **kw) -> tuple[str, str]:
    with pytest.raises(AnnotationError) as caught:
        model.check(data, dimensions=DIMS, **kw)
    assert caught.value.status == 400
    return str(caught.value), caught.value.field


@pytest.mark.parametrize("data,message,field", [
    ({"ratings": {"1": {**FULL, "relevance": 9}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": {**FULL, "relevance": 0}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": {**FULL, "relevance": "4"}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": {**FULL, "relevance": True}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": {**FULL, "relevance": 4.0}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": {k: 4 for k in DIMS if k != "relevance"}, "2": FULL}}, RELEVANCE_9, "ratings.1.relevance"),
    ({"ratings": {"1": FULL}}, "ratings.2: rate response 2.", "ratings.2"),
    ({"ratings": {"1": 4, "2": FULL}}, "ratings.1 must be an object {dimension: 1-5}.", "ratings.1"),
    ({"ratings": {"1": {**FULL, "tone": 3}, "2": FULL}}, "ratings.1: unknown dimension(s) tone.", "ratings.1"),
    ({"ratings": {"1": FULL, "2": FULL, "3": FULL, "0": FULL}}, "ratings: unknown response key(s) 0, 3.", "ratings"),
    ({"ratings": None}, 'ratings must be an object keyed by response "1" and "2".', "ratings"),
    ({"ratings": {"1": FULL, "2": FULL}, "seconds": -1},
     "seconds must be a number from 0 to 14400 (4 hours of active time): must be at least 0.", "seconds"),
    ({"ratings": {"1": FULL, "2": FULL}, "comment": "x" * 5001},
     "comment: 5001 characters, more than the 5000 this field holds.", "comment"),
    ({"ratings": {"1": FULL, "2": FULL}, "flag_reason": 3}, "flag_reason: expected a string, got a number.",
     "flag_reason"),
    ({"ratings": {"1": FULL, "2": FULL}, "comment": "a\x00b"},
     "comment: contains a NUL character (at character 2), which cannot be stored.", "comment"),
])
def test_a_bad_value_gets_one_sentence_naming_the_field(data, message, field):
    assert refusal(RatingPayload, data) == (message, field)


def test_a_draft_is_the_same_payload_any_subset_named_under_draft():
    assert Draft.check({"ratings": {"1": {"relevance": 2}}, "flag": True}, dimensions=DIMS).ratings == {
        "1": {"relevance": 2}}
    assert refusal(Draft, {"ratings": {"1": {"relevance": 9}}}, prefix="draft.") == (
        "draft." + RELEVANCE_9, "draft.ratings.1.relevance")
    assert refusal(Draft, {"flag": "yes"}, prefix="draft.") == ("draft.flag must be true or false.", "draft.flag")
    assert refusal(Draft, {"colour": "red", "size": 1}, prefix="draft.") == (
        "draft: unknown key(s) colour, size.", "draft")


def test_the_revision_form_is_read_into_the_same_payload():
    post = {**{f"r1-{d}": "4" for d in DIMS}, "r2-relevance": "9", "r2-factuality": "", "comment": "ok"}
    assert form_payload(post, DIMS) == {"ratings": {"1": FULL, "2": {"relevance": 9, "factuality": ""}},
                                        "comment": "ok"}


@pytest.fixture
def leased(db, staff_user, annotator):
    benchmark_import(path=SAMPLE, name="sample")
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    client = APIClient()
    client.force_authenticate(annotator)
    token = client.get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
    return campaign, client, token


def test_the_api_the_page_and_drafts_give_the_same_message(client, leased, annotator):
    campaign, api, token = leased
    bad = {"1": {**FULL, "relevance": 9}, "2": FULL}
    response = api.post("/api/annotation/ratings/", {"assignment": token, "ratings": bad}, format="json")
    assert response.status_code == 400 and response.json() == {"detail": RELEVANCE_9, "field": "ratings.1.relevance"}
    draft = api.put(f"/api/annotation/drafts/{token}/", {"ratings": bad}, format="json")
    assert draft.status_code == 400 and draft.json() == {"detail": "draft." + RELEVANCE_9,
                                                        "field": "draft.ratings.1.relevance"}
    assert api.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL}},
                    format="json").status_code == 201
    client.force_login(annotator)
    url = f"/annotate/{campaign.pk}/history/{token}/"
    form = {f"r{r}-{d}": "4" for r in "12" for d in DIMS} | {"r1-relevance": "9"}
    page = client.post(url, form)
    assert page.status_code == 400 and RELEVANCE_9 in html.unescape(page.content.decode())
    screen = client.post(url, form, HTTP_ACCEPT="application/json")  # the rating screen's own request
    assert screen.status_code == 400 and screen.json() == {"detail": RELEVANCE_9, "field": "ratings.1.relevance"}
    missing = client.post(url, {k: v for k, v in form.items() if k != "r2-helpfulness"} | {"r1-relevance": "3"},
                          HTTP_ACCEPT="application/json")
    assert missing.json() == {"detail": "ratings.2.helpfulness: must be a whole number from 1 to 5.",
                              "field": "ratings.2.helpfulness"}
    assert Rating.objects.get().chosen == FULL  # nothing was revised


def test_an_overlong_comment_is_refused_not_cut_and_a_nul_on_the_page_is_a_400(client, leased, annotator):
    campaign, api, token = leased
    long = api.post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": FULL, "2": FULL},
                                                 "comment": "x" * 5001}, format="json")
    assert long.status_code == 400 and long.json()["field"] == "comment"
    assert not Rating.objects.exists() and Assignment.objects.get(token=token).status == Assignment.Status.LEASED
    rating_submit(user=annotator, token=token, ratings={"1": FULL, "2": FULL}, comment="x" * 5000)
    client.force_login(annotator)
    form = {f"r{r}-{d}": "3" for r in "12" for d in DIMS}
    page = client.post(f"/annotate/{campaign.pk}/history/{token}/", form | {"comment": "a\x00b"},
                       HTTP_ACCEPT="application/json")
    assert page.status_code == 400 and page.json()["field"] == "comment"
    assert Rating.objects.get().comment == "x" * 5000


def test_the_api_documents_the_payload_from_the_model():
    document = SchemaGenerator().get_schema(request=None, public=True)
    schema = json.loads(OpenApiJsonRenderer().render(document))["components"]["schemas"]
    body = schema["RatingInRequest"]
    scores = {"type": "object", "description": "{dimension: a whole number from 1 to 5}.",
              "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 5}}
    assert body["properties"]["ratings"]["properties"] == {"1": scores, "2": scores}
    assert body["properties"]["ratings"]["required"] == ["1", "2"]
    assert body["properties"]["comment"]["maxLength"] == 5000 and body["required"] == ["ratings", "assignment"]
    assert "required" not in schema["DraftRequest"] and schema["DraftRequest"]["properties"]["flag"] == {
        "type": "boolean", "default": False}
    assert schema["SavedDraft"]["required"] == ["saved_at"]
