"""The OpenAPI schema and the API agree (issue 33, fault 8; the correlation bounds of fault 5):
one test per disagreement the schemathesis runs found, each with the schema's exact words and
the API's exact answer. tests/test_api_fuzz.py keeps looking for new ones."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from rest_framework.test import APIClient

from annotation.services.campaigns import campaign_create
from leaderboard import selectors, services
from leaderboard.forms import SubmissionForm
from pipeline.services import benchmark_import, correlation_defaults
from core.schema import NO_NUL, NO_NUL_NOT_ONLY_WHITESPACE
from core.validation import LINK_PATTERN
from tests.factories import PASSWORD
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
LINK_REFUSED = ('Enter an http:// or https:// address with a host name, and no spaces or any of '
                '< > " { } | \\ ^ ` in it.')


@pytest.fixture(scope="module")
def schema():
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document))


def parameter(schema, path, name, method="get"):
    return next(p for p in schema["paths"][path][method]["parameters"] if p["name"] == name)


def api(user=None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture
def published(researcher, sample):
    """A published submission with a finished run and no judge backend."""
    ids = sample.items.order_by("position").values_list("source_id", flat=True)
    lines = "".join(json.dumps({"id": i, "chosen_score": 1, "rejected_score": 0}) + "\n" for i in ids)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="uploaded", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=SimpleUploadedFile("scores.jsonl", lines.encode())))
    services.run_execute(run_id=submission.runs.get().pk)
    services.submission_publish(user=researcher, submission=submission)
    return submission


# --- responses the schema did not allow -----------------------------------------------------------

def test_judge_backend_is_documented_nullable_and_answers_null(schema, published):
    assert schema["components"]["schemas"]["Submission"]["properties"]["judge_backend"] == {
        "type": "string", "nullable": True, "pattern": NO_NUL}
    assert api().get(f"/api/submissions/{published.pk}/").json()["judge_backend"] is None


def test_a_builds_missing_benchmark_and_endpoints_are_documented_nullable(schema):
    properties = schema["components"]["schemas"]["Build"]["properties"]
    for name in ("benchmark", "generator", "planner"):
        assert properties[name] == {"type": "string", "nullable": True, "pattern": NO_NUL}, name


def test_leaderboard_figures_a_run_may_lack_are_documented_nullable(schema):
    properties = schema["components"]["schemas"]["LeaderboardRow"]["properties"]
    for name in ("accuracy", "ci_low", "ci_high", "tie_rate", "n", "finished_at", "rank", "parameters"):
        assert properties[name]["nullable"] is True, name


def test_the_tables_answer_is_documented_beside_the_rows_answer(schema, published):
    assert schema["paths"]["/api/leaderboard/"]["get"]["responses"]["200"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/LeaderboardAnswer"}}}
    assert schema["components"]["schemas"]["LeaderboardAnswer"] == {"anyOf": [
        {"title": "rows (default)", "type": "array", "items": {"$ref": "#/components/schemas/LeaderboardRow"}},
        {"title": "tables (?tables=true)", "type": "array",
         "items": {"$ref": "#/components/schemas/LeaderboardTable"}}]}
    assert set(schema["components"]["schemas"]["LeaderboardTable"]["required"]) == {"benchmark", "setting", "protocol", "rows"}
    (table,) = api().get("/api/leaderboard/", {"tables": "true"}).json()
    assert (table["benchmark"], table["setting"], table["protocol"], [r["display_name"] for r in table["rows"]]) == (
        "sample", "profile", "prbench", ["uploaded"])
    assert api().get("/api/leaderboard/", {"tables": "false"}).json()[0]["display_name"] == "uploaded"


def test_the_correlations_answer_is_documented_with_its_keys(schema, published):
    documented = schema["paths"]["/api/correlations/"]["get"]["responses"]["200"]["content"]["application/json"]
    assert documented["schema"]["required"] == ["outcome", "policies", "settings", "definitions", "correlations",
                                                "curves", "stability", "synthetic"]
    report = api().get("/api/correlations/").json()
    assert list(report) == documented["schema"]["required"] and report["stability"] is None
    assert report["correlations"][0]["benchmark"] == "sample"


def test_tables_takes_a_boolean_and_refuses_anything_else(schema):
    assert parameter(schema, "/api/leaderboard/", "tables")["schema"] == {"type": "boolean"}
    response = api().get("/api/leaderboard/", {"tables": "null"})
    assert response.status_code == 400
    assert response.json() == {"tables": ["Expected true or false (or 1 or 0), got 'null'."]}


# --- requests the API refused that the schema allowed ---------------------------------------------

def test_rbo_p_is_one_of_a_short_list_on_the_api_and_the_page_without_computing(schema, client, monkeypatch):
    assert parameter(schema, "/api/correlations/", "rbo_p")["schema"] == {
        "type": "number", "enum": [0.5, 0.8, 0.9, 0.95, 0.98, 0.99]}
    assert correlation_defaults()["rbo_p"] in selectors.RBO_P_CHOICES
    monkeypatch.setattr(selectors, "correlation_report", lambda **kw: pytest.fail("a refused value was computed"))
    for value in ("0.123", "0", "1", "nan", "0.9x"):
        response = api().get("/api/correlations/", {"rbo_p": value})
        assert response.status_code == 400, value
        assert response.json() == {"rbo_p": ["must be one of 0.5, 0.8, 0.9, 0.95, 0.98, 0.99"]}
    page = client.get("/correlations/", {"rbo_p": "0.123"})
    assert page.status_code == 400 and page.content.decode() == "rbo_p: must be one of 0.5, 0.8, 0.9, 0.95, 0.98, 0.99"
    assert client.get("/correlations.csv", {"rbo_p": "0.123"}).status_code == 400


def test_ndcg_k_and_k_are_bounded_whole_numbers_on_the_api_and_the_page(schema, client):
    assert parameter(schema, "/api/correlations/", "ndcg_k")["schema"] == {"type": "integer", "minimum": 1,
                                                                            "maximum": 20}
    assert parameter(schema, "/api/correlations/", "k")["schema"] == {"type": "integer", "minimum": 1, "maximum": 32767}
    for value in ("0", "21", "-1", "2.5", "x", "9" * 400):
        response = api().get("/api/correlations/", {"ndcg_k": value})
        assert response.status_code == 400, value
        assert response.json() == {"ndcg_k": ["must be a whole number between 1 and 20"]}
    assert api().get("/api/correlations/", {"k": "0"}).json() == {"k": ["must be a whole number between 1 and 32767"]}
    page = client.get("/correlations/", {"ndcg_k": "21"})
    assert page.status_code == 400 and page.content.decode() == "ndcg_k: must be a whole number between 1 and 20"
    ok = api().get("/api/correlations/", {"ndcg_k": "20", "rbo_p": "0.95", "k": "4"})
    assert ok.status_code == 200 and "persistence p = 0.95" in ok.json()["definitions"]["rbo"]


def test_unknown_outcome_and_domain_are_refused_not_replaced_by_the_default(schema):
    assert parameter(schema, "/api/correlations/", "outcome")["schema"]["enum"] == ["best_of_n", "grpo", "ppo", "rloo"]
    assert api().get("/api/correlations/", {"outcome": "zz"}).json() == {
        "outcome": ["must be one of best_of_n, ppo, grpo, rloo"]}
    assert api().get("/api/correlations/", {"domain": "zz"}).json() == {"domain": [
        "must be one of arts_entertainment, lifestyle_personal_development, society_culture, prism, chatbot_arena"]}


def test_run_is_documented_as_the_id_range_the_api_takes(schema, published):
    assert parameter(schema, "/api/submissions/{id}/scores/", "run")["schema"] == {
        "type": "integer", "minimum": 1, "maximum": 9223372036854775807}
    response = api().get(f"/api/submissions/{published.pk}/scores/", {"run": "0"})
    assert response.status_code == 400 and response.json() == {"run": ["Must be between 1 and 9223372036854775807."]}


def test_job_type_and_status_are_enums_as_the_api_enforces(schema, researcher):
    assert parameter(schema, "/api/jobs/", "type")["schema"]["enum"] == ["best_of_n", "build", "evaluation", "ppo",
                                                                         "sampling"]
    assert parameter(schema, "/api/jobs/", "status")["schema"]["enum"] == ["CANCELLED", "FAILED", "PENDING", "QUEUED",
                                                                           "RUNNING", "SUCCEEDED"]
    assert parameter(schema, "/api/jobs/{job_type}/{id}/cancel/", "job_type", "post")["schema"]["enum"] == [
        "best_of_n", "build", "evaluation", "ppo", "sampling"]
    response = api(researcher).get("/api/jobs/", {"type": "zz"})
    assert response.status_code == 400
    assert response.json() == {"detail": "no job type 'zz' (types: best_of_n, build, evaluation, ppo, sampling)"}


def test_leaderboard_sort_order_and_filters_are_refused_outside_their_enums(schema):
    assert parameter(schema, "/api/leaderboard/", "order")["schema"] == {"type": "string", "enum": ["asc", "desc"]}
    assert parameter(schema, "/api/leaderboard/", "sort")["schema"]["enum"] == [
        "accuracy", "date", "domain:arts_entertainment", "domain:chatbot_arena",
        "domain:lifestyle_personal_development", "domain:prism", "domain:society_culture", "name", "parameters"]
    assert api().get("/api/leaderboard/", {"order": "up"}).json() == {"order": ["Must be one of: desc, asc."]}
    assert api().get("/api/leaderboard/", {"setting": "zz"}).json() == {
        "setting": ["Must be one of: no_profile, profile, plan."]}
    assert api().get("/api/leaderboard/", {"sort": "zz"}).status_code == 400


def test_text_fields_that_refuse_blanks_say_so(schema, researcher):
    components = schema["components"]["schemas"]
    assert components["AuthTokenRequest"] == {"type": "object", "required": ["password", "username"], "properties": {
        "username": {"type": "string", "writeOnly": True, "minLength": 1, "pattern": NO_NUL_NOT_ONLY_WHITESPACE},
        "password": {"type": "string", "writeOnly": True, "minLength": 1, "pattern": NO_NUL}}}
    assert components["RatingInRequest"]["properties"]["assignment"] == {
        "type": "string", "minLength": 1, "pattern": NO_NUL_NOT_ONLY_WHITESPACE}
    assert components["SubmissionCreateRequest"]["properties"]["display_name"]["minLength"] == 1
    assert api().post("/api/auth/token/", {"username": " \u3000", "password": "x"}, format="json").json() == {
        "username": ["This field may not be blank."]}
    # A blank assignment is no token: refused as an unknown one is, naming the field (the rating payload
    # itself is checked once the campaign it is for is known: annotation.services.ratings).
    response = api(researcher).post("/api/annotation/ratings/", {"assignment": "", "ratings": {}}, format="json")
    assert response.status_code == 404
    assert response.json() == {"detail": "No such assignment.", "field": "assignment"}


def test_settings_needs_one_setting_as_documented(schema, researcher, sample):
    settings = schema["components"]["schemas"]["SubmissionCreateRequest"]["properties"]["settings"]
    assert (settings["minItems"], settings["maxItems"]) == (1, 3)
    response = api(researcher).post("/api/submissions/", {"display_name": "x", "benchmark": "sample", "kind": "scores"})
    assert response.status_code == 400 and response.json() == {"settings": ["This field is required."]}


def test_bodies_with_objects_are_read_as_json_only_and_a_form_is_a_documented_415(schema, annotator, staff_user):
    for path in ("/api/annotation/ratings/", "/api/annotation/campaigns/"):
        operation = schema["paths"][path]["post"]
        assert list(operation["requestBody"]["content"]) == ["application/json"], path
        assert operation["responses"]["415"]["content"] == ERROR_CONTENT, path
    assert "415" not in schema["paths"]["/api/leaderboard/"]["get"]["responses"]  # no body, no 415
    response = api(annotator).post("/api/annotation/ratings/", {"assignment": "a", "ratings": "{}"})
    assert response.status_code == 415 and response.json() == {
        "detail": 'Unsupported media type "multipart/form-data; boundary=BoUnDaRyStRiNg; charset=utf-8" in request.'}
    response = api(staff_user).post("/api/annotation/campaigns/", "benchmark=sample&guidelines=g",
                                    content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415


def test_a_rating_documents_its_ratings_object_and_its_optional_seconds(schema, annotator, staff_user, sample):
    properties = schema["components"]["schemas"]["RatingInRequest"]["properties"]
    assert (properties["ratings"]["type"], properties["ratings"]["required"]) == ("object", ["1", "2"])
    assert {k: properties["seconds"][k] for k in ("type", "minimum", "maximum", "nullable")} == {
        "type": "number", "minimum": 0, "maximum": 14400, "nullable": True}
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    token = api(annotator).get(f"/api/annotation/next/?campaign={campaign.pk}").json()["assignment"]
    refused = api(annotator).post("/api/annotation/ratings/", {"assignment": token, "ratings": None}, format="json")
    assert refused.status_code == 400 and refused.json() == {
        "detail": 'ratings must be an object keyed by response "1" and "2".', "field": "ratings"}
    full = {"factuality": 4, "relevance": 5, "helpfulness": 4, "personal_rubrics": 5}
    stored = api(annotator).post("/api/annotation/ratings/", {"assignment": token, "ratings": {"1": full, "2": full},
                                                              "seconds": None}, format="json")
    assert stored.status_code == 201, stored.content


def test_a_nul_anywhere_in_a_text_value_is_documented_and_refused(schema, annotator):
    assert parameter(schema, "/api/leaderboard/", "q")["schema"]["pattern"] == NO_NUL
    assert parameter(schema, "/api/benchmarks/{benchmark_name}/items/", "benchmark_name")["schema"]["pattern"] == NO_NUL
    response = api(annotator).post("/api/annotation/skip/", {"assignment": "a\x00", "reason": "r"}, format="json")
    # The JSON body parser refuses it before any serializer, naming the field (core.validation.JSONBodyParser).
    assert response.status_code == 400 and response.json()["detail"] == (
        "Request body field assignment: contains a NUL character (at character 2), which cannot be stored.")


def test_the_link_is_an_http_address_without_characters_a_uri_cannot_hold(schema, researcher, sample):
    link = schema["components"]["schemas"]["SubmissionCreateRequest"]["properties"]["link"]
    assert link == {"oneOf": [{"type": "string", "default": "", "pattern": LINK_PATTERN, "maxLength": 200},
                              {"type": "string", "maxLength": 0}]}
    for value in ("https://example.org/<script>", "https://example.org/a>b", 'https://example.org/"x"',
                  "javascript:alert(1)", "https://example.org/a b", "ftp://example.org/m"):
        response = api(researcher).post("/api/submissions/", {
            "display_name": "linked", "benchmark": "sample", "kind": "scalar", "settings": ["profile"],
            "link": value}, format="json")
        assert response.status_code == 400 and response.json() == {"link": [LINK_REFUSED]}, value
    form = SubmissionForm(data={"link": "https://example.org/<b>"})
    form.is_valid()
    assert form.errors["link"] == [LINK_REFUSED]
    assert SubmissionForm().fields["link"].clean("huggingface.co/org/model") == "https://huggingface.co/org/model"


def test_optional_query_parameters_document_that_an_empty_value_means_absent(schema, researcher):
    assert parameter(schema, "/api/submissions/", "kind")["allowEmptyValue"] is True
    assert parameter(schema, "/api/correlations/", "ndcg_k")["allowEmptyValue"] is True
    assert "allowEmptyValue" not in parameter(schema, "/api/submissions/{id}/scores/", "run")
    assert api(researcher).get("/api/submissions/", {"kind": ""}).status_code == 200
    assert api().get("/api/correlations/", {"ndcg_k": "", "rbo_p": "", "k": ""}).status_code == 200


# --- answers the schema did not document ----------------------------------------------------------

def test_the_token_endpoint_documents_its_429_and_answers_it_as_json(schema, researcher, monkeypatch):
    assert schema["paths"]["/api/auth/token/"]["post"]["responses"]["429"] == {
        "description": "Too many attempts: `detail` and Retry-After say how many seconds to wait.",
        "headers": {"Retry-After": {"description": "Seconds to wait before the next attempt.", "required": True,
                                    "schema": {"type": "integer", "minimum": 1}}},
        "content": ERROR_CONTENT}
    assert "429" not in schema["paths"]["/api/leaderboard/"]["get"]["responses"]  # no throttle there
    # One instant for every attempt: on a loaded machine eleven password checks can outlast the
    # throttle's window, and the eleventh would be a plain 400.
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(SimpleRateThrottle, "timer", staticmethod(lambda: 1_000_000.0))
    client = APIClient()
    for _ in range(10):
        client.post("/api/auth/token/", {"username": researcher.username, "password": "wrong"})
    response = client.post("/api/auth/token/", {"username": researcher.username, "password": "wrong"})
    assert response.status_code == 429 and response["Content-Type"] == "application/json"
    assert int(response["Retry-After"]) >= 1 and response.json()["detail"].startswith("Request was throttled.")


def test_every_documented_error_has_a_json_body(schema):
    assert schema["paths"]["/api/annotation/next/"]["get"]["responses"]["409"] == {
        "description": "The campaign is closed.", "content": ERROR_CONTENT}
    assert schema["paths"]["/api/submissions/"]["post"]["responses"]["413"]["content"] == ERROR_CONTENT
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for code in ("400", "401", "403", "404"):
                assert operation["responses"][code]["content"] == ERROR_CONTENT, (method, path, code)


def test_the_nul_guard_answers_json_on_the_api_and_one_line_on_pages(client):
    response = client.get("/api/leaderboard/", {"q": "a\x00"})
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Bad request: the query parameter 'q' contains a NUL character (at character "
                                         "2), which cannot be stored."}
    page = client.get("/", {"q": "a\x00"})
    assert page.status_code == 400 and page["Content-Type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize("debug", [False, True])
def test_a_path_no_api_route_matches_is_a_json_404_also_with_debug_on(client, settings, debug):
    settings.DEBUG = debug
    response = client.get("/api/submissions/not-a-number/")
    assert response.status_code == 404 and response.json() == {"detail": "Not found."}
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    assert b"Page not found" in page.content


@pytest.mark.parametrize("debug", [False, True])
def test_a_body_past_django_limits_is_a_json_400_on_the_api(annotator, settings, debug):
    settings.DEBUG = debug
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    client = api(annotator)
    response = client.post("/api/annotation/skip/", {"assignment": "a", "reason": "r" * 500}, format="multipart")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Bad request: Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE."}


def test_a_host_the_site_does_not_serve_is_a_json_400_on_the_api(client):
    response = client.get("/api/leaderboard/", HTTP_HOST="evil.example")
    assert response.status_code == 400 and response.json() == {
        "detail": "Bad request: the Host header names a site this server does not serve (ALLOWED_HOSTS)."}
    assert client.get("/", HTTP_HOST="evil.example")["Content-Type"].startswith("text/html")


def test_a_csrf_failure_on_the_api_is_a_json_403(annotator, staff_user, sample):
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=annotator.username, password=PASSWORD)
    assert client.get(f"/api/annotation/next/?campaign={campaign.pk}").status_code == 200  # reading needs no token
    response = client.post("/api/annotation/skip/", {"assignment": "a", "reason": "r"})
    assert response.status_code == 403 and response.json() == {"detail": "CSRF Failed: CSRF cookie not set."}
