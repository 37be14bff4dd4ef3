"""Token auth, the OpenAPI schema, and the read-only benchmark API."""

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from tests.factories import PASSWORD, BenchmarkFactory, BenchmarkItemFactory

pytestmark = pytest.mark.django_db


def test_a_token_is_issued_for_valid_credentials_only(researcher):
    client = APIClient()
    ok = client.post("/api/auth/token/", {"username": researcher.username, "password": PASSWORD}, format="json")
    assert ok.status_code == 200 and len(ok.json()["token"]) == 40
    bad = client.post("/api/auth/token/", {"username": researcher.username, "password": "wrong"}, format="json")
    assert bad.status_code == 400 and "token" not in bad.json()


def test_the_token_authenticates_api_calls(researcher):
    BenchmarkFactory(name="alpha")
    client = APIClient()
    token = client.post("/api/auth/token/", {"username": researcher.username, "password": PASSWORD}).json()["token"]
    assert client.get("/api/benchmarks/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.get("/api/benchmarks/")
    assert response.status_code == 200
    assert [b["name"] for b in response.json()["results"]] == ["alpha"]


def test_annotators_cannot_read_benchmark_items_which_hold_the_answer_key(annotator):
    BenchmarkItemFactory(benchmark=BenchmarkFactory(name="alpha"))
    client = APIClient()
    client.force_authenticate(annotator)
    assert client.get("/api/benchmarks/").status_code == 403
    assert client.get("/api/benchmarks/alpha/items/").status_code == 403


def test_researchers_list_items_filtered_by_domain(researcher):
    bench = BenchmarkFactory(name="alpha")
    BenchmarkItemFactory.create_batch(2, benchmark=bench)
    BenchmarkItemFactory(benchmark=bench, domain="society_culture", source_id="soc-1")
    client = APIClient()
    client.force_authenticate(researcher)
    response = client.get("/api/benchmarks/alpha/items/", {"domain": "society_culture"})
    assert response.status_code == 200
    assert [i["id"] for i in response.json()["results"]] == ["soc-1"]
    assert client.get("/api/benchmarks/alpha/").json()["name"] == "alpha"
    assert client.get("/api/benchmarks/nope/items/").status_code == 404


def test_the_openapi_schema_and_its_docs_page_are_served_offline(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    body = schema.content.decode()
    assert "openapi: 3" in body and "/api/auth/token/" in body
    docs = client.get(reverse("api-docs"))
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html and "cdn" not in html.lower()


def test_healthz_reports_the_database_is_reachable(client):
    assert client.get("/healthz/").json() == {"status": "ok"}


@pytest.mark.django_db
@pytest.mark.parametrize("error, code, detail", [
    ("database", 503, "The database is unavailable right now; nothing was changed. Try again in a minute."),
    ("broker", 503, "The task queue is unreachable right now. Try again in a minute."),
    ("bug", 500, "Something went wrong on our side; it has been logged."),
])
def test_an_outage_or_a_bug_answers_json_on_the_api_and_a_page_elsewhere(monkeypatch, researcher, error, code,
                                                                           detail):
    from django.db import OperationalError
    from django.test import Client
    from kombu.exceptions import OperationalError as BrokerError

    from leaderboard import selectors

    raised = {"database": OperationalError("server closed the connection unexpectedly"),
              "broker": BrokerError("Error 111 connecting to 127.0.0.1:6379"), "bug": KeyError("x")}[error]

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(selectors, "leaderboard_tables", fail)
    client = Client(raise_request_exception=False)
    client.force_login(researcher)
    response = client.get("/api/leaderboard/")
    assert response.status_code == code and response["Content-Type"] == "application/json"
    assert response.json() == {"detail": detail}
    assert (response.get("Retry-After") == "60") is (code == 503)
    page = client.get("/")
    assert page.status_code == code and page["Content-Type"].startswith("text/html")
    assert detail in page.content.decode() and "Traceback" not in page.content.decode()
