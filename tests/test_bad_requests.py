"""Malformed requests at every door (issue 10, cases 4, 5 and 8): a 4xx with a one-line reason,
never a 500; exports honour ?format=csv|jsonl and write formula-safe CSV."""

import csv
import io
import json

import pytest
from rest_framework.test import APIClient

from annotation.services.campaigns import campaign_create
from leaderboard import services
from leaderboard.models import PairScore
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

FULL = {"factuality": 4, "relevance": 5, "helpfulness": 4, "personal_rubrics": 5}
LOW = {**FULL, "personal_rubrics": 2}
BIG = "1" + "0" * 399  # a 400-digit integer


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


def api(user=None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.fixture
def scored_run(researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    lines = [json.dumps({"id": i, "chosen_score": -1.5 if n == 0 else 1, "rejected_score": 0})
             for n, i in enumerate(ids)]
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("scores.jsonl", ("\n".join(lines) + "\n").encode())
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="uploaded", benchmark="sample", kind="scores", settings=("no_profile",), scores_file=upload))
    run = submission.runs.get()
    services.run_execute(run_id=run.pk)
    return run


@pytest.mark.parametrize("url", ["/?benchmark=%00", "/correlations/?k=%00", "/benchmarks/%00/",
                                 "/api/leaderboard/?setting=a%00b", "/api/correlations/?policy=%00"])
def test_a_nul_in_the_path_or_query_is_a_400_with_one_line(client, url):
    response = client.get(url)
    assert response.status_code == 400
    # One line: as JSON {"detail": ...} on the API, as plain text on pages.
    text = response.json()["detail"] + "\n" if url.startswith("/api/") else response.content.decode()
    assert text.startswith("Bad request: the ") and "contains a NUL character" in text and text.count("\n") == 1


def test_non_integer_and_huge_ids_are_404_or_400_never_500(researcher, scored_run):
    client = api(researcher)
    for action in ("cancel", "retry"):
        assert client.post(f"/api/submissions/abc/{action}/").status_code == 404
        assert client.post(f"/api/submissions/{BIG}/{action}/").status_code == 404
    sid = scored_run.submission_id
    # An export endpoint answers errors as JSON whatever the format asked for (JSONErrorsMixin).
    response = client.get(f"/api/submissions/{sid}/scores/?run=abc")
    assert response.status_code == 400 and json.loads(response.content) == {"run": ["Expected a whole number, got 'abc'."]}
    response = client.get(f"/api/submissions/{sid}/scores/?run={BIG}&format=csv")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json()["run"][0].startswith("Expected a whole number")
    response = client.get(f"/api/submissions/{sid}/scores/")
    assert json.loads(response.content) == {"run": ["This query parameter is required."]}


def test_a_5000_character_model_path_is_a_400_naming_the_field(researcher, sample):
    response = api(researcher).post("/api/submissions/", {
        "display_name": "long", "benchmark": "sample", "kind": "scalar", "settings": ["profile"],
        "model_path": "m" * 5000}, format="json")
    assert response.status_code == 400
    assert response.json()["model_path"] == ["Ensure this field has no more than 500 characters."]


def test_a_400_digit_integer_as_a_rating_time_is_a_400(sample, staff_user, annotator):
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    token = api(annotator).get(f"/api/annotation/next/?campaign={campaign.pk}").json()["assignment"]
    raw = ('{"assignment": "%s", "ratings": {"1": %s, "2": %s}, "seconds": %s}'
           % (token, json.dumps(FULL), json.dumps(LOW), BIG))
    response = api(annotator).post("/api/annotation/ratings/", raw, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"detail": "seconds must be a number from 0 to 14400 (4 hours of active time): "
                                         "a 400-digit number is out of range.", "field": "seconds"}


def test_the_scores_export_honours_format_csv_and_jsonl_and_keeps_numbers(researcher, scored_run):
    client, sid = api(researcher), scored_run.submission_id
    response = client.get(f"/api/submissions/{sid}/scores/?run={scored_run.pk}&format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(body(response).decode())))
    assert rows[0][:6] == ["id", "domain", "chosen_score", "rejected_score", "correct", "tie"]
    assert rows[0][6:] == ["manifest_code_version", "manifest_weights_hash", "manifest_benchmark_content_hash",
                           "manifest_templates", "manifest_options", "manifest_seed", "manifest"]
    assert rows[1][2:6] == ["-1.5", "0.0", "False", "False"]  # a negative number stays a number
    response = client.get(f"/api/submissions/{sid}/scores/?run={scored_run.pk}&format=jsonl")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    lines = body(response).decode().splitlines()
    assert json.loads(lines[0])["chosen_score"] == -1.5 and len(lines) == 30
    default = client.get(f"/api/submissions/{sid}/scores/?run={scored_run.pk}")
    assert default["Content-Type"] == "application/x-ndjson"
    assert client.get(f"/api/submissions/{sid}/scores/?run={scored_run.pk}&format=xml").status_code == 404


def test_ratings_export_honours_format_and_neutralises_formulas(sample, staff_user, annotator):
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1)
    token = api(annotator).get(f"/api/annotation/next/?campaign={campaign.pk}").json()["assignment"]
    response = api(annotator).post("/api/annotation/ratings/", {
        "assignment": token, "ratings": {"1": FULL, "2": LOW}, "seconds": 3,
        "comment": '=HYPERLINK("http://evil.example","x")', "flag_reason": "@SUM(1+1)"}, format="json")
    assert response.status_code == 201
    response = api(staff_user).get(f"/api/annotation/campaigns/{campaign.pk}/ratings/?format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body(response).decode())))
    assert len(rows) == 8
    assert rows[0]["comment"] == "'=HYPERLINK(\"http://evil.example\",\"x\")"
    assert rows[0]["flag_reason"] == "'@SUM(1+1)"
    assert rows[0]["value"] in {"2", "4", "5"} and rows[0]["seconds"] == "3.0"
    response = api(staff_user).get(f"/api/annotation/campaigns/{campaign.pk}/ratings/?format=jsonl")
    lines = body(response).decode().splitlines()
    assert response.status_code == 200 and len(lines) == 8
    assert json.loads(lines[0])["comment"] == '=HYPERLINK("http://evil.example","x")'  # JSON keeps the text
    assert api(annotator).get(f"/api/annotation/campaigns/{campaign.pk}/ratings/?format=csv").status_code == 403
    assert api(staff_user).get("/api/annotation/campaigns/999999/ratings/?format=csv").status_code == 404


def test_every_csv_writer_neutralises_formula_cells_and_keeps_numbers():
    from core.exports import csv_lines

    rows = [{"a": "=1+1", "b": "+1", "c": "-x", "d": "@x", "e": "\tx", "f": "\rx", "g": -2, "h": 0.5, "i": "-3"}]
    lines = list(csv_lines(rows, list("abcdefghi")))
    assert list(csv.reader(io.StringIO(lines[1])))[0] == ["'=1+1", "'+1", "'-x", "'@x", "'\tx", "'\rx", "-2", "0.5", "-3"]


def test_a_400_digit_score_in_an_uploaded_file_is_a_400_naming_line_and_field(researcher, sample):
    from django.core.files.uploadedfile import SimpleUploadedFile

    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    lines = [f'{{"id": "{i}", "chosen_score": {BIG if n == 1 else 1}, "rejected_score": 0}}' for n, i in enumerate(ids)]
    upload = SimpleUploadedFile("big.jsonl", ("\n".join(lines) + "\n").encode())
    response = api(researcher).post("/api/submissions/", {
        "display_name": "big", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": upload}, format="multipart")
    assert response.status_code == 400
    assert response.json()["scores_file"] == [
        "scores file big.jsonl, line 2, field 'chosen_score': a 400-digit number is out of range"]


PAGES = ["/", "/correlations/", "/correlations.csv", "/benchmarks/", "/benchmarks/sample/", "/submit/",
         "/annotate/", "/pipeline/builds/", "/api/leaderboard/", "/api/correlations/", "/api/benchmarks/",
         "/api/annotation/campaigns/", "/api/annotation/next/", "/api/submissions/"]
HUGE_ID_PAGES = ["/submissions/{}/", "/benchmarks/sample/items/{}/", "/pipeline/builds/{}/", "/annotate/{}/",
                 "/annotation/campaigns/{}/report/", "/api/annotation/campaigns/{}/report/",
                 "/api/annotation/next/?campaign={}", "/api/builds/{}/", "/api/submissions/{}/"]


@pytest.mark.parametrize("number", [BIG, "9223372036854775808", "-1"])
def test_huge_or_negative_ids_in_pages_and_api_are_a_4xx(client, staff_user, sample, number):
    client.force_login(staff_user)
    for url in HUGE_ID_PAGES:
        status = client.get(url.format(number)).status_code
        assert 400 <= status < 500, (url, status)


def test_arbitrary_query_strings_on_every_page_are_never_a_500(client, staff_user, sample):
    from hypothesis import HealthCheck, given, settings, strategies as st

    client.force_login(staff_user)
    keys = st.sampled_from(["benchmark", "kind", "setting", "domain", "sort", "order", "outcome", "k", "policy",
                            "page", "campaign", "run", "format", "q", "status"])
    params = st.dictionaries(keys, st.text(max_size=30) | st.integers().map(str), max_size=4)
    seen = {"requests": 0}

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(url=st.sampled_from(PAGES), query=params)
    def get(url, query):
        response = client.get(url, query)
        seen["requests"] += 1
        assert response.status_code < 500, (url, query, response.status_code)

    get()
    assert seen["requests"] == 120


def test_an_unknown_api_path_is_a_json_404_and_an_unknown_page_the_html_one(client, staff_user):
    client.force_login(staff_user)
    api_missing = client.get("/api/annotation/campaigns/1/")  # the campaign's API lives elsewhere
    assert api_missing.status_code == 404 and api_missing["Content-Type"] == "application/json"
    assert api_missing.json() == {"detail": "Not found."}
    page_missing = client.get("/no-such-page/")
    assert page_missing.status_code == 404 and page_missing["Content-Type"].startswith("text/html")


def test_the_api_404_is_json_under_a_path_prefix_too():
    from django.test import RequestFactory

    from prbench.views import not_found

    request = RequestFactory().get("/api/nope/", SCRIPT_NAME="/prbench")
    assert request.path == "/prbench/api/nope/"
    response = not_found(request)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
