"""A hostile researcher at every door of the submission path (issue: a submission reaches
nothing but its own model, and a researcher sees nothing private of another's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import PairScore, RunStatus, Submission
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import
from tests.concurrency import race
from tests.conftest import wait_for_job
from tests.factories import UserFactory
from tests.leaderboard.test_submissions import scores_upload
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

BASE_DIR = Path(__file__).resolve().parents[2]


class Trap:
    """A loopback HTTP listener that records every request: nothing should ever reach it."""

    def __init__(self):
        self.requests: list[dict] = []
        trap = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self):
                length = int(self.headers.get("Content-Length") or 0)
                trap.requests.append({"path": self.path, "headers": dict(self.headers),
                                      "body": self.rfile.read(length).decode(errors="replace")})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"choices": [{"message": {"content": "Verdict: A"}}]}')

            do_GET = do_POST = _record

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def trap():
    t = Trap()
    yield t
    t.close()


def api_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


# Every way a researcher has tried to steer a worker, per kind: each is a 400 naming the key.
STEERING = [("base_url", "http://10.0.0.1/v1"), ("backend", "openai"), ("api_key_env", "DATABASE_URL"),
            ("api_key", "sk-x"), ("model", "other"), ("cache_dir", "/tmp/steer"), ("cache_key", "x"),
            ("models_root", "/"), ("timeout", 1), ("max_retries", 99), ("concurrency", 64),
            ("price_prompt_per_1k", 0), ("benchmark_ids", ["a"]), ("data_root", "/etc"), ("device", "cuda")]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["scalar", "pairwise", "pointwise", "scores", "pgenrm"])
def test_every_steering_option_is_a_400_naming_the_key_for_every_kind(researcher, trap, kind):
    benchmark_import(path=SAMPLE, name="sample")
    LLMEndpoint.objects.create(name="judge", base_url=trap.url)
    client = api_for(researcher)
    for key, value in STEERING:
        response = client.post("/api/submissions/", {
            "display_name": "steer", "benchmark": "sample", "kind": kind, "settings": ["profile"],
            "judge_backend": "judge" if kind in ("pairwise", "pointwise", "pgenrm") else "",
            "model_path": "judge-model", "options": {key: value}}, format="json")
        assert response.status_code == 400, (key, response.content)
        body = response.json()
        assert body["detail"].startswith(f"option '{key}' is not an option of the {kind} kind (allowed: ")
        assert key in body
    assert Submission.objects.count() == 0 and trap.requests == []


@pytest.mark.django_db
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.dictionaries(st.text(min_size=1, max_size=12),
                               st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.text(max_size=30),
                                         st.floats(allow_nan=True)), max_size=4),
       kind=st.sampled_from(["pairwise", "pointwise", "pgenrm"]))
def test_whatever_the_options_the_worker_only_ever_targets_the_configured_endpoint(options, kind):
    """Options either are refused or, once accepted, leave the connection exactly as staff set it."""
    from prblib.rewards.options import OptionsError, validate_options

    user = UserFactory(roles=["researcher"])
    endpoint, _ = LLMEndpoint.objects.get_or_create(name="judge", defaults={"base_url": "http://127.0.0.1:9/v1",
                                                                              "api_key_env": "JUDGE_KEY"})
    try:
        stored = validate_options(kind, options)
    except OptionsError:
        return
    if kind == "pgenrm" and stored.get("prototypes"):
        return  # needs a real file; covered by test_pgenrm
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    submission = Submission.objects.create(owner=user, display_name="x", benchmark=bench, kind=kind,
                                           model_path="judge-model", judge_backend=endpoint, weights_hash="h",
                                           options=stored)
    runtime = services.model_spec_for(submission).runtime
    assert runtime["base_url"] == "http://127.0.0.1:9/v1" and runtime["api_key_env"] == "JUDGE_KEY"
    assert runtime["cache_dir"] == str(settings.VAR_DIR / "llm-cache") and runtime["model"] == "judge-model"
    assert not set(stored) & {"base_url", "api_key_env", "backend", "cache_dir", "models_root", "data_root"}


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_calls_only_the_configured_endpoint_and_no_secret_leaves_it(
        celery_worker_process, researcher, fake_openai, trap):
    """Redis + PostgreSQL under CI: a judge submission whose options tried to point the worker at
    another host was refused; the accepted one talks to the staff endpoint alone, and no value of
    the worker's environment appears in anything it sent."""
    benchmark_import(path=SAMPLE, name="sample")
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=1)
    fake_openai.responder = lambda body: "The first fits this person.\nVerdict: A"
    client = api_for(researcher)
    steer = client.post("/api/submissions/", {
        "display_name": "steer", "benchmark": "sample", "kind": "pairwise", "settings": ["profile"],
        "judge_backend": "judge", "model_path": "judge-model",
        "options": {"backend": "openai", "base_url": trap.url, "api_key_env": "DATABASE_URL"}}, format="json")
    assert steer.status_code == 400 and "backend" in steer.json()
    ok = client.post("/api/submissions/", {
        "display_name": "judge", "benchmark": "sample", "kind": "pairwise", "settings": ["profile"],
        "judge_backend": "judge", "model_path": "judge-model", "options": {"both_orders": False}}, format="json")
    assert ok.status_code == 201, ok.content
    run = Submission.objects.get(pk=ok.json()["id"]).runs.get()
    wait_for_job(run, worker=celery_worker_process, what="the judge run",
                 until=(RunStatus.SUCCEEDED, RunStatus.FAILED), timeout=180)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert PairScore.objects.filter(run=run).count() == 30 and len(fake_openai.requests) == 30
    assert trap.requests == []
    # Every credential-like value of the worker's environment, searched for in all it sent
    # (paths, headers and bodies): none may appear.
    from tests.conftest import subprocess_env

    secret_names = ("URL", "KEY", "SECRET", "TOKEN", "PASSWORD", "DATABASE", "BROKER")
    secrets = {name: value for name, value in subprocess_env().items()
               if any(part in name.upper() for part in secret_names) and len(value) >= 6}
    assert "DATABASE_URL" in secrets
    sent = json.dumps(fake_openai.requests)
    assert sorted(name for name, value in secrets.items() if value in sent) == []


# -- visibility ------------------------------------------------------------------------------------

ROLES = ("owner", "other researcher", "annotator", "anonymous", "staff")


@pytest.fixture
def private_submission(db):
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    owner = UserFactory(roles=["researcher"], username="owner")
    submission = services.submission_create(user=owner, request=services.SubmissionRequest(
        display_name="secret sauce", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=scores_upload(bench), options={}))
    run = submission.runs.get()
    services.run_execute(run_id=run.pk)
    run.__class__.objects.filter(pk=run.pk).update(log_tail="Traceback: /srv/worker/secret/path.py")
    users = {"owner": owner, "other researcher": UserFactory(roles=["researcher"]),
             "annotator": UserFactory(roles=["annotator"]), "anonymous": None,
             "staff": UserFactory(is_staff=True, is_superuser=True)}
    return submission, run, users


def _views(submission, run):
    s, r = submission.pk, run.pk
    return {
        "page": ("get", f"/submissions/{s}/"),
        "api detail": ("get", f"/api/submissions/{s}/"),
        "api scores": ("get", f"/api/submissions/{s}/scores/?run={r}"),
        "csv export": ("get", f"/submissions/{s}/runs/{r}/scores.csv"),
        "jsonl export": ("get", f"/submissions/{s}/runs/{r}/scores.jsonl"),
    }


def _status(user, method, url) -> int:
    from django.test import Client

    if url.startswith("/api/"):
        return getattr(api_for(user), method)(url).status_code
    client = Client()
    if user is not None:
        client.force_login(user)
    return getattr(client, method)(url).status_code


# Expected status per (view, role) for a private submission, then once it is published.
PRIVATE = {"owner": 200, "other researcher": 404, "annotator": 404, "anonymous": 404, "staff": 200}
PUBLISHED = {role: 200 for role in ROLES}


@pytest.mark.django_db
def test_every_view_of_a_submission_answers_each_role_by_visibility(private_submission):
    submission, run, users = private_submission
    views = _views(submission, run)
    seen = {(view, role): _status(users[role], *views[view]) for view in views for role in ROLES}
    assert seen == {(view, role): PRIVATE[role] for view in views for role in ROLES}

    # Lists: the leaderboard (page and API) shows the row to its owner (marked) and staff only.
    def on_board(user) -> tuple[bool, bool]:
        from django.test import Client

        client = Client()
        if user is not None:
            client.force_login(user)
        page = b"secret sauce" in client.get("/").content
        api = [row["display_name"] for row in api_for(user).get("/api/leaderboard/").json()]
        return page, "secret sauce" in api

    assert {role: on_board(users[role]) for role in ROLES} == {
        "owner": (True, True), "other researcher": (False, False), "annotator": (False, False),
        "anonymous": (False, False), "staff": (True, True)}
    assert [s["id"] for s in api_for(users["other researcher"]).get("/api/submissions/").json()["results"]] == []

    # Acting on it: 404 to those who cannot see it; the owner publishes.
    assert api_for(users["other researcher"]).post(f"/api/submissions/{submission.pk}/publish/").status_code == 404
    assert api_for(users["other researcher"]).post(f"/api/submissions/{submission.pk}/cancel/").status_code == 404
    response = api_for(users["owner"]).post(f"/api/submissions/{submission.pk}/publish/")
    assert response.status_code == 200 and response.json()["published"] is True

    seen = {(view, role): _status(users[role], *views[view]) for view in views for role in ROLES}
    assert seen == {(view, role): PUBLISHED[role] for view in views for role in ROLES}
    assert {role: on_board(users[role]) for role in ROLES} == {role: (True, True) for role in ROLES}
    # Published, but still the owner's to act on, and the worker's log stays with owner and staff.
    assert api_for(users["other researcher"]).post(f"/api/submissions/{submission.pk}/retry/").status_code == 403
    detail = api_for(users["other researcher"]).get(f"/api/submissions/{submission.pk}/").json()
    assert detail["runs"][0]["log_tail"] == ""
    assert "secret/path" in api_for(users["owner"]).get(f"/api/submissions/{submission.pk}/").json()["runs"][0][
        "log_tail"]


@pytest.mark.django_db
def test_a_copy_of_another_researchers_private_submission_is_accepted_and_reveals_nothing(private_submission):
    """Issue 28, fault 7: a refusal confirmed what a competitor evaluates privately. A duplicate is
    now refused only against the same owner's results: the copy is its own submission."""
    submission, _, users = private_submission
    bench = submission.benchmark
    copy = services.submission_create(user=users["other researcher"], request=services.SubmissionRequest(
        display_name="copy", benchmark=bench.name, kind="scores", settings=("profile",),
        scores_file=scores_upload(bench)))
    assert copy.weights_hash == submission.weights_hash and copy.runs.get().fingerprint != submission.runs.get(
        ).fingerprint
    page = api_for(users["other researcher"]).get(f"/api/submissions/{copy.pk}/").content.decode()
    assert f"/submissions/{submission.pk}/" not in page and f"#{submission.pk}" not in page


@pytest.mark.django_db
@pytest.mark.parametrize("copier_is_staff", [False, True], ids=["researcher", "staff"])
def test_a_copy_of_another_researchers_private_model_folder_is_evaluated_on_the_worker_without_a_link(
        copier_is_staff):
    """The same for a model folder, whose weights are hashed on the worker: the copy's run
    identifies as its own result (another owner's results never make a duplicate), and nothing
    on its pages names the private original, for the copier, the public or anyone else."""
    from leaderboard import identity
    from leaderboard.models import EvaluationRun

    benchmark_import(path=SAMPLE, name="sample")
    build_decoder_rm(settings.MODELS_ROOT / "shared-rm")
    owner = UserFactory(roles=["researcher"])
    copier = UserFactory(roles=["researcher"], is_staff=copier_is_staff)

    def submit(user):
        return services.submission_create(user=user, request=services.SubmissionRequest(
            display_name="rm", benchmark="sample", kind="scalar", settings=("profile",), model_path="shared-rm"))

    private = submit(owner)
    identity.run_identify(EvaluationRun.objects.select_related("submission__benchmark").get(submission=private))
    copy = submit(copier)
    run = copy.runs.get()
    identity.run_identify(EvaluationRun.objects.select_related("submission__benchmark").get(pk=run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.error == "" and not run.fingerprint.startswith("pending:")
    assert services.submission_publish(user=copier, submission=copy)
    for reader in (copier, None, UserFactory(roles=["researcher"])):
        shown = api_for(reader).get(f"/api/submissions/{copy.pk}/").content.decode()
        assert f"/submissions/{private.pk}/" not in shown and f"#{private.pk}" not in shown


@pytest.mark.django_db
def test_retrying_a_run_whose_model_another_researcher_now_carries_names_no_private_submission():
    """A failed run's model was submitted again by someone else meanwhile (their run now holds the
    result): the retry is refused, on the page and through /api/jobs/, without that private
    submission's number; a published one, or the owner's own, is named."""
    from leaderboard.models import EvaluationRun

    benchmark_import(path=SAMPLE, name="sample")
    owner, other = UserFactory(roles=["researcher"]), UserFactory(roles=["researcher"])

    def submit(user):
        return services.submission_create(user=user, request=services.SubmissionRequest(
            display_name="rm", benchmark="sample", kind="scalar", settings=("profile",), model_path="shared-rm"))

    build_decoder_rm(settings.MODELS_ROOT / "shared-rm")
    failed, carrier = submit(owner), submit(other)
    EvaluationRun.objects.filter(submission=failed).update(fingerprint="f" * 64, status=RunStatus.FAILED)
    EvaluationRun.objects.filter(submission=carrier).update(fingerprint="f" * 64, status=RunStatus.RUNNING)
    run = failed.runs.get()
    refused = api_for(owner).post(f"/api/jobs/evaluation/{run.pk}/retry/")
    assert refused.status_code == 409
    assert refused.json()["detail"] == ("The same model was submitted again meanwhile by another researcher; "
                                        "that run carries the result.")
    assert f"#{carrier.pk}" not in refused.content.decode()
    Submission.objects.filter(pk=carrier.pk).update(published=True)
    assert api_for(owner).post(f"/api/jobs/evaluation/{run.pk}/retry/").json()["detail"] == (
        f"The same model was submitted again meanwhile (submission #{carrier.pk}); that run carries the result.")


# -- files outside the models folder --------------------------------------------------------------

@pytest.mark.django_db
def test_a_submitted_folder_whose_tokenizer_links_outside_the_models_folder_is_refused(researcher, tmp_path):
    benchmark_import(path=SAMPLE, name="sample")
    folder = build_decoder_rm(settings.MODELS_ROOT / "linked-rm")
    secret = tmp_path / "worker-secret.json"
    secret.write_text("{}")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(secret)
    response = api_for(researcher).post("/api/submissions/", {
        "display_name": "linked", "benchmark": "sample", "kind": "scalar", "settings": ["profile"],
        "model_path": "linked-rm"}, format="json")
    assert response.status_code == 400
    assert response.json()["model_path"] == [
        "tokenizer.json in the model folder points outside the models folder (links must stay inside it)"]


# -- unbounded uploads ----------------------------------------------------------------------------

@pytest.mark.django_db
def test_an_upload_over_the_limit_is_refused_while_streaming_and_nothing_is_stored(researcher, settings):
    settings.MAX_UPLOAD_BYTES = 64 * 1024
    benchmark_import(path=SAMPLE, name="sample")
    big = SimpleUploadedFile("huge.jsonl", b'{"id": "x", "chosen_score": 1, "rejected_score": 0}\n' * 4000)
    response = api_for(researcher).post("/api/submissions/", {
        "display_name": "big", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": big}, format="multipart")
    assert response.status_code == 413
    assert response.json()["detail"] == "huge.jsonl is larger than the upload limit of 0.0625 MB (MAX_UPLOAD_MB)."
    assert Submission.objects.count() == 0

    from django.test import Client

    client = Client()
    client.force_login(researcher)
    big.seek(0)
    page = client.post("/submit/", {"display_name": "big", "benchmark": "sample", "kind": "scores",
                                    "settings": ["profile"], "dtype": "auto", "max_length": 4096, "batch_size": 8,
                                    "profile_k": 10, "scores_file": big})
    assert page.status_code == 413 and b"larger than the upload limit" in page.content
    assert Submission.objects.count() == 0


# -- the hourly limit is atomic ------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_exceed_the_hourly_limit_on_postgresql(require_postgres, settings):
    from django.db import connection as main_connection

    settings.SUBMISSIONS_PER_HOUR = 10
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    user = UserFactory(roles=["researcher"])
    ids = list(bench.items.order_by("position").values_list("source_id", flat=True))
    uploads = [scores_upload(bench, wrong=set(ids[:i]), name=f"s{i}.jsonl") for i in range(16)]
    made = race(16, lambda i: services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=f"m{i}", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=uploads[i])))
    main_connection.close()
    assert all(isinstance(o, (Submission, services.SubmissionRefused)) for o in made), made
    outcomes = ["ok" if isinstance(o, Submission) else str(o) for o in made]
    assert Submission.objects.filter(owner=user).count() == 10
    assert outcomes.count("ok") == 10
    assert sorted(set(outcomes) - {"ok"}) == ["You reached the limit of 10 submission attempts per hour "
                                              "(SUBMISSIONS_PER_HOUR; refused ones count too); try again later."]


# -- hardening ----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_token_and_login_endpoints_are_throttled_per_username(researcher):
    from django.test import Client

    client = APIClient()
    codes = [client.post("/api/auth/token/", {"username": researcher.username, "password": "wrong"}).status_code
             for _ in range(11)]
    assert codes == [400] * 10 + [429]
    page = Client()
    codes = [page.post("/accounts/login/", {"username": "victim", "password": "wrong"}).status_code
             for _ in range(11)]
    assert codes == [200] * 10 + [429]
    last = page.post("/accounts/login/", {"username": "victim", "password": "wrong"})
    assert last.status_code == 429 and int(last["Retry-After"]) > 0 and b"Too many sign-in attempts" in last.content


@pytest.mark.django_db
def test_password_guessing_finds_no_way_around_the_login_limits(researcher, staff_user):
    """Each bypass the audit found: a new X-Forwarded-For per request, a look-alike (NFKC)
    spelling of the username, the admin's login page; and the owner is not locked out."""
    from django.test import Client

    researcher.set_password("right-password-1")
    researcher.save()
    api = APIClient()
    spoofed = [api.post("/api/auth/token/", {"username": researcher.username, "password": "wrong"},
                        HTTP_X_FORWARDED_FOR=f"10.0.{i}.1").status_code for i in range(11)]
    assert spoofed == [400] * 10 + [429]  # the header is not trusted: one address, one bucket
    # The mathematical-monospace spelling normalises (NFKC) to the same account and the same bucket.
    monospace = "".join(chr(0x1D670 + ord(c) - ord("a")) if "a" <= c <= "z" else c for c in researcher.username)
    assert monospace != researcher.username
    assert api.post("/api/auth/token/", {"username": monospace, "password": "right-password-1"}).status_code == 429
    assert api.post("/api/auth/token/", {"username": researcher.username.upper(),
                                         "password": "right-password-1"}).status_code == 429
    # The owner, from their own address, still signs in: failures elsewhere do not lock them out.
    owner = APIClient(REMOTE_ADDR="192.0.2.7")
    ok = owner.post("/api/auth/token/", {"username": researcher.username, "password": "right-password-1"})
    assert ok.status_code == 200 and ok.json()["token"]
    # A success never counts: ten sign-ins in a row all work.
    assert [owner.post("/api/auth/token/", {"username": researcher.username, "password": "right-password-1"})
            .status_code for _ in range(10)] == [200] * 10
    # The admin's login page is throttled the same way.
    admin = Client()
    codes = [admin.post("/admin/login/?next=/admin/", {"username": staff_user.username, "password": "wrong"})
             .status_code for _ in range(11)]
    assert codes == [200] * 10 + [429]
    assert b"Too many sign-in attempts" in admin.post("/admin/login/", {"username": staff_user.username,
                                                                         "password": "wrong"}).content


@pytest.mark.django_db
def test_a_trusted_proxy_count_reads_the_client_address_from_x_forwarded_for(researcher, settings):
    from core.throttles import client_address
    from rest_framework.settings import api_settings
    from django.test import RequestFactory

    request = RequestFactory().post("/", HTTP_X_FORWARDED_FOR="203.0.113.9, 10.0.0.2", REMOTE_ADDR="10.0.0.3")
    assert client_address(request) == "10.0.0.3"  # default: no proxy is trusted
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    api_settings.reload()
    try:
        assert client_address(request) == "10.0.0.2"
    finally:
        api_settings.reload()


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_scripts(client):
    response = client.get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-eval" not in policy
    assert "object-src 'none'" in policy


def _check_deploy(secret: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    env.update(DEBUG="0", SECRET_KEY=secret, ALLOWED_HOSTS="example.org", PRBENCH_VAR_DIR=str(settings.VAR_DIR))
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_example_env_files_secret_is_refused_at_start_up():
    example = dict(line.split("=", 1) for line in (BASE_DIR / ".env.example").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    assert example["SECRET_KEY"] == ""
    empty = _check_deploy("")
    assert empty.returncode != 0 and "SECRET_KEY must be set when DEBUG is off" in empty.stderr
    placeholder = _check_deploy("change-me-to-a-long-random-string-of-at-least-fifty-characters")
    assert placeholder.returncode != 0 and "SECRET_KEY is a placeholder" in placeholder.stderr


# -- operator commands ---------------------------------------------------------------------------

@pytest.mark.django_db
def test_llm_endpoint_add_list_remove(capsys):
    call_command("llm_endpoint", "add", "vllm-local", "--base-url", "http://127.0.0.1:8001/v1",
                 "--api-key-env", "VLLM_KEY", "--max-concurrency", "8", "--price-prompt-per-1k", "0.5",
                 "--price-completion-per-1k", "1.5")
    assert capsys.readouterr().out.strip() == "endpoint 'vllm-local' -> http://127.0.0.1:8001/v1"
    call_command("llm_endpoint", "list", "--format", "json")
    [row] = json.loads(capsys.readouterr().out)
    assert row == {"name": "vllm-local", "base_url": "http://127.0.0.1:8001/v1", "api_key_env": "VLLM_KEY",
                   "max_concurrency": 8, "timeout": 120, "max_retries": 4, "deadline": 240, "price_prompt_per_1k": "0.500000",
                   "price_completion_per_1k": "1.500000", "enabled": True,
                   "response_format": "json_schema", "token_parameter": "max_tokens", "accepts_temperature": True,
                   "accepts_seed": True, "accepts_n": True, "reasoning_effort": "", "allowed_models": [],
                   # spend caps, none set (issue 29): llm_endpoint add --max-{requests,tokens,cost}-per-{run,day}
                   "max_requests_per_run": None, "max_tokens_per_run": None, "max_cost_per_run": None,
                   "max_requests_per_day": None, "max_tokens_per_day": None, "max_cost_per_day": None}
    call_command("llm_endpoint", "list")
    assert capsys.readouterr().out.startswith("vllm-local\thttp://127.0.0.1:8001/v1 key=$VLLM_KEY concurrency=8")
    with pytest.raises(CommandError, match="an endpoint named 'vllm-local' exists"):
        call_command("llm_endpoint", "add", "vllm-local", "--base-url", "http://127.0.0.1:8002/v1")
    with pytest.raises(CommandError, match="is not an http:// or https:// URL"):
        call_command("llm_endpoint", "add", "bad", "--base-url", "file:///etc/passwd")
    with pytest.raises(CommandError, match="must be an environment variable name"):
        call_command("llm_endpoint", "add", "bad", "--base-url", "http://x/v1", "--api-key-env", "A B;rm")
    call_command("llm_endpoint", "remove", "vllm-local")
    assert capsys.readouterr().out.strip() == "removed endpoint 'vllm-local'"
    call_command("llm_endpoint", "list")
    assert "No endpoints. Add one" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no LLM endpoint named 'vllm-local'"):
        call_command("llm_endpoint", "remove", "vllm-local")


@pytest.mark.django_db
def test_evaluate_rm_takes_the_same_options_and_an_endpoint_by_name(fake_openai, capsys):
    benchmark_import(path=SAMPLE, name="sample")
    call_command("llm_endpoint", "add", "fake", "--base-url", fake_openai.base_url, "--max-retries", "0")
    capsys.readouterr()
    fake_openai.responder = lambda body: "Verdict: A"
    call_command("evaluate_rm", "--benchmark", "sample", "--model", "judge-model", "--kind", "pairwise",
                 "--setting", "profile", "--endpoint", "fake", "--option", "both_orders=false", "--limit", "3")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 3 and len(fake_openai.requests) == 3
    assert {r["body"]["model"] for r in fake_openai.requests} == {"judge-model"}
    with pytest.raises(CommandError, match=r"^--option option 'base_url' is not an option of the pairwise kind"):
        call_command("evaluate_rm", "--benchmark", "sample", "--model", "m", "--kind", "pairwise",
                     "--setting", "profile", "--option", "base_url=http://127.0.0.1:9/v1")
    with pytest.raises(CommandError, match=r"no enabled LLM endpoint named 'nope' \(configured: fake\)"):
        call_command("evaluate_rm", "--benchmark", "sample", "--model", "m", "--kind", "pairwise",
                     "--setting", "profile", "--endpoint", "nope")
