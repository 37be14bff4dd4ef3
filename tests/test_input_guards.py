"""Input guards (issue 33, fault 6): every JSON the server parses (request bodies on every API
route that takes one, form fields, uploaded scores files, model-folder files and safetensors
headers, chat templates) is read within one set of limits (prblib.rows.load_json), upload
names of any length are fine, and every number a form or serializer takes fits its column.
Each bad input gets a 4xx with one line naming the limit, JSON on the API, never a 500 (the
clients below run with DEBUG off and return a 500 instead of raising it)."""

import json
import shutil
import struct
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import Submission
from prblib.rows import (MAX_JSON_DEPTH, MAX_JSON_NUMBER_CHARS, JSONSyntaxError, RowError, json_limit_reason,
                              load_json)
from pipeline.services import benchmark_import
from tests.factories import PASSWORD, UserFactory
from tests.pipeline.test_formats import SAMPLE

DEEP = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a": ' * 50_000 + "1" + "}" * 50_000
LONG_NUMBER = '{"display_name": 1' + "0" * 4999 + "}"  # 5,000 digits
BIG = 10**30
NAME_400_BYTES = "ж" * 197 + ".jsonl"  # 400 bytes of UTF-8; file systems hold 255 per name


@pytest.fixture(autouse=True)
def _debug_off(settings):
    settings.DEBUG = False


def api(user=None) -> APIClient:
    client = APIClient(raise_request_exception=False)  # a 500 comes back as a response
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def sample(db):
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture
def everyone(db):
    """Staff with both roles: every route's permission lets the body reach the view."""
    return UserFactory(is_staff=True, is_superuser=True, roles=["researcher", "annotator"])


def scores_lines(benchmark, *, replace: dict[int, str] | None = None) -> bytes:
    ids = list(benchmark.items.order_by("position").values_list("source_id", flat=True))
    lines = [json.dumps({"id": i, "chosen_score": 1, "rejected_score": 0}) for i in ids]
    for index, line in (replace or {}).items():
        lines[index] = line
    return ("\n".join(lines) + "\n").encode()


# --- the guard itself ---------------------------------------------------------------------------

def test_the_limits_are_exact_and_brackets_or_digits_inside_strings_do_not_count():
    assert load_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(RowError) as too_deep:
        load_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), file="f.json", line=3)
    assert str(too_deep.value) == "f.json, line 3: JSON nested deeper than 64 levels"
    assert load_json(json.dumps({"a": "[{" * 1000, "b\\\"[": "1" * 5000})) == {"a": "[{" * 1000, "b\\\"[": "1" * 5000}
    assert load_json("1" * MAX_JSON_NUMBER_CHARS) == int("1" * MAX_JSON_NUMBER_CHARS)
    with pytest.raises(RowError, match=r"^a number 1001 characters long \(at most 1000\)$"):
        load_json("[-" + "1" * 1000 + "]")
    with pytest.raises(RowError, match="^NaN is not a JSON number$"):
        load_json('{"a": NaN}')
    with pytest.raises(RowError, match="^the number 1e999 is out of range$"):
        load_json('{"a": 1e999}')
    assert repr(load_json("[NaN, 1e999]", constants=True)) == "[nan, inf]"
    with pytest.raises(JSONSyntaxError) as syntax:
        load_json('{"a": }', field="options")
    assert str(syntax.value) == "field 'options': invalid JSON (Expecting value at column 7)"
    assert syntax.value.detail == "Expecting value at column 7"
    with pytest.raises(RowError, match=r"^invalid UTF-8 \(byte 2\)$"):
        load_json(b'"\xff"')


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT, "[" * 50_000, "[" * 50_000 + "}" * 50_000])
def test_50000_deep_json_is_refused_quickly_without_recursing(text):
    start = time.perf_counter()
    assert json_limit_reason(text) == "JSON nested deeper than 64 levels"
    assert time.perf_counter() - start < 1.0  # about 0.02 s; json.loads would raise RecursionError


# --- request bodies on every API route that takes one -------------------------------------------

def api_write_routes() -> set[tuple[str, str]]:
    """(URL name, method) of every POST/PUT/PATCH route under /api/, read from the URLconf."""
    def walk(patterns, prefix=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern), p

    routes = set()
    for route, pattern in walk(get_resolver().url_patterns):
        cls = getattr(pattern.callback, "cls", None)
        if not route.lstrip("^").startswith("api/") or cls is None:
            continue
        actions = getattr(pattern.callback, "actions", None)
        methods = set(actions) if actions else {m for m in cls.http_method_names if hasattr(cls, m)}
        routes |= {(pattern.name, m) for m in methods & {"post", "put", "patch"}}
    return routes


# Routes whose view reads the body: the parser answers before anything else happens.
READS_BODY = {("api-token", "post"), ("submission-list", "post"), ("build-list", "post"), ("build-resume", "post"),
              ("api-campaigns", "post"), ("api-annotation-ratings", "post"), ("api-annotation-skip", "post"),
              ("api-annotation-skip-undo", "post"), ("api-annotation-draft", "put"),
              ("api-benchmark-health-campaigns", "post"), ("api-benchmark-health-versions", "post")}
# Routes whose view never reads the body: a bad one changes nothing (the answer with an empty object).
IGNORES_BODY = {("submission-cancel", "post"): 200, ("submission-retry", "post"): 200,
                ("submission-publish", "post"): 200, ("api-job-cancel", "post"): 200, ("api-job-retry", "post"): 200}
BODIES = {
    "deep array": (DEEP, "Request body: JSON nested deeper than 64 levels."),
    "deep object": (DEEP_OBJECT, "Request body: JSON nested deeper than 64 levels."),
    "5,000-digit number": (LONG_NUMBER, "Request body: a number 5000 characters long (at most 1000)."),
    "list": ("[1, 2]", "Request body: must be a JSON object, not a list."),
    "string": ('"me"', "Request body: must be a JSON object, not a string."),
    "number": ("7", "Request body: must be a JSON object, not a number."),
    "NaN": ('{"username": NaN}', "Request body: NaN is not a JSON number."),
    "overflowing float": ('{"username": 1e999}', "Request body: the number 1e999 is out of range."),
    "not JSON": ('{"username": ', "Request body: invalid JSON (Expecting value at column 14)."),
    # Valid JSON, but text no database column can hold (psycopg and sqlite3 raise on it: a 500).
    "lone surrogate": ('{"username": "\\ud800x"}', "Request body field username: contains a lone surrogate "
                       "'\\ud800' at character 1 (half of a character such as an emoji; not valid Unicode)."),
    "NUL in a key": ('{"a\\u0000": 1}', "Request body: key contains a NUL character (at character 2), which "
                     "cannot be stored."),
}


def test_every_api_write_route_is_classified():
    assert api_write_routes() == READS_BODY | set(IGNORES_BODY)


def route_url(name: str, user) -> str:
    """The route's URL, with ids of objects `user` may act on."""
    from pipeline.models import Benchmark
    from tests.jobs.test_lifecycle import make_job

    if name.startswith("submission-") and name != "submission-list":
        submission = Submission.objects.create(owner=user, display_name="rm", benchmark=Benchmark.objects.get(),
                                               kind="scalar", model_path="rm", weights_hash="0" * 64)
        submission.runs.create(setting="profile", fingerprint=f"f-{submission.pk}")
        return reverse(name, kwargs={"pk": submission.pk})
    if name == "build-resume":
        build = make_job("build", user)
        type(build).objects.filter(pk=build.pk).update(status="failed")
        return reverse(name, kwargs={"pk": build.pk})
    if name in ("api-job-cancel", "api-job-retry"):
        return reverse(name, kwargs={"job_type": "evaluation", "pk": make_job("evaluation", user).pk})
    if name == "api-annotation-draft":
        return reverse(name, kwargs={"token": "0" * 32})  # the body is read before the token is looked up
    if name.startswith("api-benchmark-health-"):
        return reverse(name, kwargs={"name": Benchmark.objects.get().name})
    return reverse(name)


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize(("name", "method"), sorted(READS_BODY))
def test_a_bad_json_body_on_every_route_that_reads_one_is_a_400_naming_the_limit(sample, everyone, name, method,
                                                                                 body):
    text, detail = BODIES[body]
    client = api() if name == "api-token" else api(everyone)
    response = getattr(client, method)(route_url(name, everyone), text, content_type="application/json")
    assert (response.status_code, response["Content-Type"]) == (400, "application/json")
    assert response.json() == {"detail": detail}


@pytest.mark.parametrize(("name", "method"), sorted(IGNORES_BODY))
def test_a_bad_json_body_on_a_route_that_ignores_it_changes_nothing(sample, everyone, name, method):
    for text in ("{}", DEEP, LONG_NUMBER, "[1]"):
        response = getattr(api(everyone), method)(route_url(name, everyone), text, content_type="application/json")
        assert (response.status_code, response["Content-Type"]) == (IGNORES_BODY[(name, method)], "application/json")


def test_the_token_endpoint_reads_forms_and_objects_and_names_a_non_object(db):
    UserFactory(username="ann")
    credentials = {"username": "ann", "password": PASSWORD}
    assert api().post("/api/auth/token/", credentials).status_code == 200  # a form
    response = api().post("/api/auth/token/", json.dumps(credentials), content_type="application/json")
    assert response.status_code == 200 and len(response.json()["token"]) == 40
    response = api().post("/api/auth/token/", json.dumps([credentials]), content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"detail": "Request body: must be a JSON object, not a list."}


# --- JSON in forms (the submit page, the admin) -------------------------------------------------

@pytest.mark.parametrize(("options", "error"), [
    (DEEP, "JSON nested deeper than 64 levels."),
    ('{"both_orders": 1' + "0" * 4999 + "}", "A number 5000 characters long (at most 1000)."),
    ('{"both_orders": NaN}', "NaN is not a JSON number."),
])
def test_the_submit_pages_options_field_names_the_limit(client, sample, everyone, options, error):
    client.force_login(everyone)
    response = client.post("/submit/", {"display_name": "x", "benchmark": "sample", "kind": "scalar",
                                        "settings": ["no_profile"], "model_path": "rm", "options": options})
    assert response.status_code == 200
    assert response.context["form"].errors["options"] == [error]


def test_an_admin_json_field_names_the_limit(client, everyone):
    from tests.factories import BenchmarkFactory

    benchmark = BenchmarkFactory()
    client.force_login(everyone)
    response = client.post(f"/admin/pipeline/benchmark/{benchmark.pk}/change/", {"name": "b2", "metadata": DEEP})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["metadata"] == ["JSON nested deeper than 64 levels."]


# --- uploaded scores files ------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "reason"), [
    (DEEP, "line 2: JSON nested deeper than 64 levels"),
    ('{"id": "x", "chosen_score": 1' + "0" * 4999 + ', "rejected_score": 0}',
     "line 2: a number 5000 characters long (at most 1000)"),
    ('{"id": "x", "chosen_score": 1e999, "rejected_score": 0}',
     "line 2, field 'chosen_score': must be a finite number, not inf"),
])
def test_a_deep_or_huge_number_scores_file_is_a_400_naming_file_and_line(sample, everyone, line, reason):
    upload = SimpleUploadedFile("bad.jsonl", scores_lines(sample, replace={1: line}))
    response = api(everyone).post("/api/submissions/", {
        "display_name": "s", "benchmark": "sample", "kind": "scores", "settings": ["no_profile"],
        "scores_file": upload}, format="multipart")
    assert response.status_code == 400
    assert response.json()["scores_file"] == [f"scores file bad.jsonl, {reason}"]


def test_a_400_byte_non_ascii_upload_name_is_accepted_and_stored_under_a_short_name(sample, everyone):
    response = api(everyone).post("/api/submissions/", {
        "display_name": "long name", "benchmark": "sample", "kind": "scores", "settings": ["no_profile"],
        "scores_file": SimpleUploadedFile(NAME_400_BYTES, scores_lines(sample))}, format="multipart")
    assert response.status_code == 201
    stored = Submission.objects.get(pk=response.json()["id"]).scores_file.name
    assert stored.startswith("scores/") and len(stored.encode()) < 100


def test_a_400_byte_upload_name_in_a_refusal_is_cut_to_120_bytes(sample, everyone, client):
    cut = "ж" * 55 + "….jsonl"  # 110 + 3 + 6 bytes: the stem cut at a whole character
    assert len(cut.encode()) <= 120 == services.submissions.MAX_SHOWN_NAME_BYTES
    response = api(everyone).post("/api/submissions/", {
        "display_name": "long name", "benchmark": "sample", "kind": "scores", "settings": ["no_profile"],
        "scores_file": SimpleUploadedFile(NAME_400_BYTES, b"{not json\n")}, format="multipart")
    assert response.status_code == 400
    assert response.json()["scores_file"] == [
        f"scores file {cut}, line 1: not valid JSON (Expecting property name enclosed in double quotes at column 2)"]
    client.force_login(everyone)  # the page: the same name, the same answer
    response = client.post("/submit/", {"display_name": "page", "benchmark": "sample", "kind": "scores",
                                        "settings": ["no_profile"],
                                        "scores_file": SimpleUploadedFile(NAME_400_BYTES, scores_lines(sample))})
    assert response.status_code == 302


def test_the_admin_cannot_replace_an_uploaded_scores_file(client, everyone):
    from django.contrib import admin

    assert "scores_file" in admin.site._registry[Submission].readonly_fields


# --- model folders --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built_rm(tmp_path_factory):
    from prblib.tiny_models import build_decoder_rm

    return build_decoder_rm(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture
def rm_folder(settings, tmp_path, built_rm):
    root = (tmp_path / "models").resolve()
    settings.MODELS_ROOT = root
    shutil.copytree(built_rm, root / "rm")
    return root / "rm"


def submit_folder(user) -> tuple[int, dict]:
    response = api(user).post("/api/submissions/", {
        "display_name": "rm", "benchmark": "sample", "kind": "scalar", "settings": ["no_profile"],
        "model_path": "rm"}, format="json")
    return response.status_code, response.json()


def rewrite_header(file: Path, edit) -> None:
    """The safetensors file with its JSON header replaced by edit(header) (bytes), the data kept."""
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = edit(raw[8:8 + length])
    file.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length:])


def deep_value(name: str) -> str:
    return '{"%s": ' % name + DEEP + "}"


@pytest.mark.parametrize(("file", "text", "problem"), [
    ("config.json", DEEP, "config.json in the model folder is refused: JSON nested deeper than 64 levels"),
    ("tokenizer_config.json", deep_value("model_max_length"),
     "tokenizer_config.json in the model folder is refused: JSON nested deeper than 64 levels"),
    ("chat_template.json", deep_value("chat_template"),
     "chat_template.json in the model folder is refused: JSON nested deeper than 64 levels"),
    ("special_tokens_map.json", deep_value("bos_token"),
     "special_tokens_map.json in the model folder is refused: JSON nested deeper than 64 levels"),
    ("tokenizer_config.json", '{"model_max_length": 1' + "0" * 4999 + "}",
     "tokenizer_config.json in the model folder is refused: a number 5000 characters long (at most 1000)"),
    ("chat_template.json", '{"chat_template": "' + "{% if x %}" * 5000 + "{% endif %}" * 5000 + '"}',
     "the chat template in chat_template.json is nested too deeply to compile"),
    ("chat_template.jinja", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
     "the chat template in chat_template.jinja is nested too deeply to compile"),
    ("chat_template.jinja", "{{ messages }}" * 20_000,
     "the chat template in chat_template.jinja is 280,000 characters long (at most 200,000)"),
])
def test_a_deep_or_huge_model_file_is_a_400_naming_the_file_and_limit(sample, everyone, rm_folder, file, text,
                                                                        problem):
    (rm_folder / file).write_text(text, encoding="utf-8")
    status, body = submit_folder(everyone)
    assert status == 400 and body["model_path"] == [problem]


def test_a_config_with_a_5000_digit_number_is_a_400(sample, everyone, rm_folder):
    config = json.loads((rm_folder / "config.json").read_text())
    text = json.dumps(config).replace(f'"vocab_size": {config["vocab_size"]}', '"vocab_size": 1' + "0" * 4999)
    (rm_folder / "config.json").write_text(text)
    status, body = submit_folder(everyone)
    assert status == 400 and body["model_path"] == [
        "config.json in the model folder is refused: a number 5000 characters long (at most 1000)"]


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda header: b'{"a": ' + DEEP.encode() + b"}",
     "model.safetensors has a safetensors header this server refuses: JSON nested deeper than 64 levels"),
    (lambda header: header.replace(b'"data_offsets":[0,', b'"data_offsets":[' + b"0" * 5000 + b",", 1),
     "model.safetensors has a safetensors header this server refuses: a number 5000 characters long (at most 1000)"),
])
def test_a_deep_or_huge_number_safetensors_header_is_a_400(sample, everyone, rm_folder, edit, problem):
    rewrite_header(rm_folder / "model.safetensors", edit)
    status, body = submit_folder(everyone)
    assert status == 400 and body["model_path"] == [problem]


def test_a_header_claiming_10_to_the_30_parameters_gives_no_count_not_a_database_error(sample, everyone,
                                                                                          rm_folder):
    def claim(header: bytes) -> bytes:
        data = json.loads(header)
        name = next(n for n in data if n != "__metadata__" and not n.startswith("score"))
        data[name]["shape"] = [BIG]
        return json.dumps(data).encode()

    rewrite_header(rm_folder / "model.safetensors", claim)
    status, body = submit_folder(everyone)
    assert status == 201 and body["parameters"] is None


# --- numbers in forms and serializers fit their columns -------------------------------------------

def test_parameters_10_to_the_30_is_a_form_and_api_error_naming_the_bound(client, sample, everyone):
    client.force_login(everyone)
    response = client.post("/submit/", {"display_name": "x", "benchmark": "sample", "kind": "scores",
                                        "settings": ["no_profile"], "parameters": str(BIG),
                                        "scores_file": SimpleUploadedFile("s.jsonl", scores_lines(sample))})
    assert response.status_code == 200
    assert response.context["form"].errors["parameters"] == [
        "Ensure this value is less than or equal to 9223372036854775807."]
    response = api(everyone).post("/api/submissions/", {
        "display_name": "x", "benchmark": "sample", "kind": "scores", "settings": ["no_profile"],
        "parameters": str(BIG), "scores_file": SimpleUploadedFile("s.jsonl", scores_lines(sample))},
        format="multipart")
    assert response.status_code == 400
    assert response.json()["parameters"] == ["Ensure this value is less than or equal to 9223372036854775807."]
    assert not Submission.objects.exists()


@pytest.mark.parametrize(("field", "value", "error"), [
    ("target_per_annotator", BIG, "Ensure this value is less than or equal to 2147483647."),
    ("rubric_min_diff", 5, "Ensure this value is less than or equal to 4."),
    ("other_max_diff", -1, "Ensure this value is greater than or equal to 0."),
    ("lease_minutes", 1441, "Ensure this value is less than or equal to 1440."),
])
def test_campaign_bounds_are_the_same_on_the_page_and_the_api(client, sample, everyone, field, value, error):
    from annotation.models import Campaign

    base = {"benchmark": "sample", "guidelines": "g", "overlap": 1, "lease_minutes": 30, "rubric_min_diff": 2,
            "other_max_diff": 1}
    client.force_login(everyone)
    response = client.post("/annotation/campaigns/new/", {**base, field: str(value)})
    assert response.status_code == 200 and response.context["form"].errors[field] == [error]
    response = api(everyone).post("/api/annotation/campaigns/", {**base, field: value}, format="json")
    assert response.status_code == 400 and response.json() == {field: [error]}
    assert not Campaign.objects.exists()


def test_a_build_limit_or_seed_past_32_bits_is_a_form_error(client, everyone):
    client.force_login(everyone)
    response = client.post("/pipeline/builds/", {"name": "b", "source_path": "x", "generator_model": "g",
                                                  "profile_k": 10, "temperature": 0.7, "limit": str(BIG),
                                                  "seed": str(-BIG)})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert errors["limit"] == ["Ensure this value is less than or equal to 2147483647."]
    assert errors["seed"] == ["Ensure this value is greater than or equal to -2147483647."]


def numeric_bounds(fields) -> dict[str, tuple]:
    return {name: (getattr(f, "min_value", None), getattr(f, "max_value", None)) for name, f in fields.items()
            if type(f).__name__ in ("IntegerField", "FloatField")}


def test_every_form_numbers_bounds_are_its_serializers():
    from annotation.api import CampaignCreateSerializer
    from annotation.views import CampaignForm
    from leaderboard.api import SubmissionCreateSerializer
    from leaderboard.forms import SubmissionForm
    from pipeline.api import BuildCreateSerializer
    from pipeline.views import BuildForm

    for form, serializer, form_only in ((CampaignForm, CampaignCreateSerializer, set()),
                                        (SubmissionForm, SubmissionCreateSerializer, {"m", "n"}),  # kind options
                                        (BuildForm, BuildCreateSerializer, set())):
        page = numeric_bounds(form.base_fields)
        api_bounds = numeric_bounds(serializer().fields)
        assert {k: v for k, v in page.items() if k not in form_only} == api_bounds, form.__name__
        assert all(high is not None for _, high in page.values()), form.__name__
