"""Submissions: validation before queueing, the run lifecycle, recovery, exports, the leaderboard."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from leaderboard import services
from leaderboard.models import EvaluationRun, PairScore, RunStatus, Submission
from leaderboard.selectors import leaderboard_rows, leaderboard_tables
from pipeline.services import benchmark_import
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


def scores_upload(benchmark, *, wrong=(), drop=(), name="scores.jsonl", extra_lines=()) -> SimpleUploadedFile:
    """Scores that get every pair right except the ids in `wrong`."""
    lines = []
    for source_id in benchmark.items.order_by("position").values_list("source_id", flat=True):
        if source_id in drop:
            continue
        chosen, rejected = (0.2, 0.9) if source_id in wrong else (0.9, 0.2)
        lines.append(json.dumps({"id": source_id, "chosen_score": chosen, "rejected_score": rejected}))
    lines.extend(extra_lines)
    return SimpleUploadedFile(name, ("\n".join(lines) + "\n").encode(), content_type="application/jsonl")


def submit_scores(user, benchmark, settings=("no_profile",), **kwargs) -> Submission:
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name="Closed model X", benchmark=benchmark.name, kind="scores", settings=settings,
        scores_file=scores_upload(benchmark, **kwargs)))


def refusal(user, **fields) -> services.SubmissionRefused:
    base = {"display_name": "m", "benchmark": "sample", "kind": "scalar", "settings": ("no_profile",)}
    with pytest.raises(services.SubmissionRefused) as info:
        services.submission_create(user=user, request=services.SubmissionRequest(**{**base, **fields}))
    return info.value


def test_a_valid_scores_submission_queues_one_run_in_its_setting_and_freezes_the_benchmark(researcher, sample):
    submission = submit_scores(researcher, sample, settings=("profile",))
    runs = list(submission.runs.order_by("setting"))
    assert [(r.setting, r.status, r.progress_total) for r in runs] == [("profile", RunStatus.QUEUED, 30)]
    sample.refresh_from_db()
    assert sample.is_frozen
    assert submission.scores_file.name.endswith(".jsonl") and len(submission.weights_hash) == 64


def test_a_scores_file_declares_exactly_one_setting(researcher, sample):
    with pytest.raises(services.SubmissionRefused) as info:
        submit_scores(researcher, sample, settings=("no_profile", "profile"))
    assert info.value.field == "settings" and "exactly one setting" in str(info.value)
    assert not Submission.objects.exists()


def test_names_are_unique_per_owner_among_live_submissions(researcher, sample):
    first = submit_scores(researcher, sample)
    with pytest.raises(services.SubmissionRefused) as info:
        services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name="Closed model X", benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(sample, wrong={"x"})))
    assert info.value.field == "display_name" and f"#{first.pk}" in str(info.value)
    other = submit_scores(UserFactory(roles=["researcher"]), sample, wrong={sample.items.first().source_id})
    assert other.display_name == first.display_name  # another owner may use the name


def test_a_scores_file_missing_pairs_is_refused_naming_them(researcher, sample):
    first = sample.items.order_by("position").first().source_id
    with pytest.raises(services.SubmissionRefused) as info:
        submit_scores(researcher, sample, drop={first})
    assert info.value.field == "scores_file" and first in str(info.value)
    assert not Submission.objects.exists()


def test_a_scores_file_with_a_bad_line_is_refused_naming_the_line(researcher, sample):
    with pytest.raises(services.SubmissionRefused) as info:
        submit_scores(researcher, sample, extra_lines=['{"id": "nope", "chosen_score": "high"}'])
    assert "line 31" in str(info.value) and "scores.jsonl" in str(info.value)


def test_the_same_model_setting_and_benchmark_is_refused_with_a_link(researcher, sample):
    first = submit_scores(researcher, sample)
    with pytest.raises(services.SubmissionRefused) as info:
        submit_scores(researcher, sample)
    assert info.value.link == f"/submissions/{first.pk}/"
    # After the first run failed, submitting the same model again is allowed.
    first.runs.update(status=RunStatus.FAILED)
    assert submit_scores(researcher, sample).pk != first.pk


def submit_folder(user, name="tiny-rm", *, display_name="folder model", settings_=("no_profile",)) -> Submission:
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=display_name, benchmark="sample", kind="scalar", settings=settings_, model_path=name))


def test_a_model_folder_is_checked_at_create_and_its_weights_hashed_once_on_the_worker(
        researcher, sample, settings, monkeypatch):
    import hashlib

    from leaderboard import identity
    from prblib import modelcheck
    from prblib.tiny_models import build_decoder_rm

    folder = build_decoder_rm(settings.MODELS_ROOT / "tiny-rm")
    expected = hashlib.sha256(folder.joinpath("model.safetensors").read_bytes()
                              + folder.joinpath("config.json").read_bytes()).hexdigest()
    hashed = []
    digest = modelcheck.weights_digest
    monkeypatch.setattr(modelcheck, "weights_digest", lambda *a: hashed.append(a) or digest(*a))

    submission = submit_folder(researcher, settings_=("no_profile", "profile"))
    assert hashed == [] and submission.weights_hash == "" and submission.parameters > 0
    runs = list(EvaluationRun.objects.select_related("submission__benchmark").filter(submission=submission))
    assert {r.fingerprint for r in runs} == {f"pending:{submission.pk}"}

    for run in runs:  # the first step of each run on the worker
        identity.run_identify(run)
    submission.refresh_from_db()
    assert len(hashed) == 1 and submission.weights_hash == expected
    # With its owner and configuration (issue 28: the same weights otherwise configured are another result).
    from pipeline.services import configuration, configuration_sha256

    config = configuration(kind="scalar", options={}, dtype=submission.dtype, max_length=submission.max_length,
                           profile_k=submission.profile_k, folder=folder)
    fingerprint = hashlib.sha256(f"{expected}|scalar|{sample.content_hash}|owner:{researcher.pk}|"
                                 f"config:{configuration_sha256(config)}".encode()).hexdigest()
    assert set(submission.runs.values_list("fingerprint", flat=True)) == {fingerprint}


def test_a_duplicate_model_folder_fails_its_run_on_the_worker_with_a_link_for_its_owner(researcher, sample, settings):
    from leaderboard import identity
    from prblib.tiny_models import build_decoder_rm

    build_decoder_rm(settings.MODELS_ROOT / "tiny-rm")
    first = submit_folder(researcher, display_name="first")
    identity.run_identify(EvaluationRun.objects.select_related("submission__benchmark").get(submission=first))
    second = submit_folder(researcher, display_name="second")  # not refused: the weights are not hashed yet
    run = second.runs.get()
    assert services.run_execute(run_id=run.pk) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.error == (f"This model was already evaluated on sample in the \"Without profile\" setting "
                         f"(submission #{first.pk}, queued): see /submissions/{first.pk}/")
    assert not PairScore.objects.filter(run=run).exists() and run.fingerprint == f"pending:{second.pk}"
    # Once the first result is gone, a retry of the second goes through the worker's check again.
    first.runs.update(status=RunStatus.FAILED)
    assert services.submission_retry(user=researcher, submission=second) == 1
    identity.run_identify(EvaluationRun.objects.select_related("submission__benchmark").get(pk=run.pk))
    assert second.runs.get().fingerprint == first.runs.get().fingerprint


def test_model_paths_must_stay_inside_the_models_folder(researcher, sample, settings, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    err = refusal(researcher, model_path=str(outside))
    assert err.field == "model_path" and "outside the models folder" in str(err)
    err = refusal(researcher, model_path="../../etc")
    assert err.field == "model_path"
    settings.MODELS_ROOT.mkdir(parents=True, exist_ok=True)
    (settings.MODELS_ROOT / "escape").symlink_to(outside)
    assert refusal(researcher, model_path="escape").field == "model_path"


def test_pickle_only_weights_and_custom_code_are_refused(researcher, sample, settings):
    pickled = settings.MODELS_ROOT / "pickled"
    pickled.mkdir(parents=True)
    (pickled / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"],
                                                     "model_type": "bert"}))
    (pickled / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    assert "safetensors" in str(refusal(researcher, model_path="pickled"))

    custom = settings.MODELS_ROOT / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps({"architectures": ["EvilForSequenceClassification"],
                                                    "auto_map": {"AutoModel": "modeling_evil.Evil"}}))
    assert "remote code" in str(refusal(researcher, model_path="custom"))


@pytest.mark.parametrize("fields,field", [
    ({"display_name": "  "}, "display_name"),
    ({"benchmark": "missing"}, "benchmark"),
    ({"kind": "pgenrm", "model_path": ""}, "model_path"),
    ({"settings": ()}, "settings"),
    ({"settings": ("sideways",)}, "settings"),
    ({"batch_size": 0}, "batch_size"),
    ({"kind": "scores"}, "scores_file"),
    ({"kind": "scalar", "model_path": ""}, "model_path"),
])
def test_incomplete_submissions_are_refused_on_the_right_field(researcher, sample, fields, field):
    assert refusal(researcher, **fields).field == field


def test_annotators_cannot_submit_and_the_rate_limit_applies(annotator, researcher, sample, settings):
    assert "researcher role" in str(refusal(annotator))
    settings.SUBMISSIONS_PER_HOUR = 1
    submit_scores(researcher, sample)
    assert "limit of 1 submission attempts per hour" in str(refusal(researcher))


def test_a_run_executed_in_process_scores_every_pair_and_summarises(researcher, sample):
    wrong = set(sample.items.order_by("position").values_list("source_id", flat=True)[:6])
    submission = submit_scores(researcher, sample, wrong=wrong)
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.progress_done == 30 == PairScore.objects.filter(run=run).count()
    assert run.metrics["accuracy"] == pytest.approx(24 / 30)
    assert set(run.metrics["by_domain"]) == {"arts_entertainment", "lifestyle_personal_development", "society_culture"}
    assert run.metrics["ci_low"] <= run.metrics["accuracy"] <= run.metrics["ci_high"]
    calibration = run.metrics["calibration"]
    assert calibration["n"] == 30 and calibration["slope"] > 0 and 0 <= calibration["brier"] <= 1
    # A second delivery of the same task finds nothing to do.
    assert services.run_execute(run_id=run.pk) == RunStatus.SUCCEEDED
    assert PairScore.objects.filter(run=run).count() == 30


def test_a_redelivered_run_only_scores_the_missing_pairs(researcher, sample):
    run = submit_scores(researcher, sample).runs.get()
    first_items = list(sample.items.order_by("position")[:10])
    PairScore.objects.bulk_create([PairScore(run=run, item=item, chosen_score=5.0, rejected_score=1.0, correct=True)
                                   for item in first_items])
    services.run_execute(run_id=run.pk)
    assert PairScore.objects.filter(run=run).count() == 30
    # The ten pairs scored by the "earlier delivery" kept their first scores.
    assert PairScore.objects.filter(run=run, chosen_score=5.0).count() == 10


def test_the_plan_setting_is_refused_before_queueing_until_every_pair_has_a_plan(researcher, sample):
    with pytest.raises(services.SubmissionRefused) as info:
        submit_scores(researcher, sample, settings=("no_profile", "plan"))
    assert info.value.field == "settings"
    assert str(info.value).startswith("Benchmark sample does not support the plan setting: every pair needs planner "
                                      "aspects; make a planned version first with manage.py plan_benchmark")
    assert not Submission.objects.exists()
    assert services.benchmark_settings(benchmark=sample) == ("no_profile", "profile")
    sample.items.exclude(pk=sample.items.first().pk).update(plan=["Mentions the user's budget"])
    assert services.benchmark_settings(benchmark=sample) == ("no_profile", "profile")  # one pair still has none
    sample.items.update(plan=["Mentions the user's budget"])
    assert services.benchmark_settings(benchmark=sample) == ("no_profile", "profile", "plan")


def test_a_run_whose_pairs_lack_plans_still_fails_with_a_readable_reason(researcher, sample):
    sample.items.update(plan=["Mentions the user's budget"])
    run = submit_scores(researcher, sample, settings=("plan",)).runs.get()
    sample.items.filter(pk=sample.items.first().pk).update(plan=[])
    services.run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "planner" in run.error


def test_every_problem_of_a_submission_is_reported_at_once(researcher, sample, settings, tmp_path):
    settings.MODELS_ROOT = tmp_path
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    error = refusal(researcher, display_name=" ", settings=("plan",), batch_size=0, model_path="broken")
    assert set(error.errors) == {"display_name", "settings", "batch_size", "model_path"}
    assert [m.split(" ")[0] for m in error.errors["model_path"]] == ["architecture", "no", "no"]
    assert "expected LlamaForSequenceClassification" in error.errors["model_path"][0]
    api = APIClient()
    api.force_authenticate(researcher)
    body = api.post("/api/submissions/", {"display_name": "x", "benchmark": "sample", "kind": "scalar",
                                          "settings": ["plan"], "model_path": "broken"}, format="json")
    assert body.status_code == 400
    assert set(body.json()) >= {"detail", "settings", "model_path"} and len(body.json()["model_path"]) == 3


def test_cancel_and_retry_respect_ownership(researcher, sample, staff_user):
    submission = submit_scores(researcher, sample)
    other = UserFactory(roles=["researcher"])
    with pytest.raises(PermissionError):
        services.submission_cancel(user=other, submission=submission)
    assert services.submission_cancel(user=researcher, submission=submission) == 1
    run = submission.runs.get()
    assert run.status == RunStatus.CANCELLED
    assert services.run_execute(run_id=run.pk) == RunStatus.CANCELLED  # a late delivery does nothing
    assert services.submission_retry(user=staff_user, submission=submission) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.error == ""


def test_the_api_creates_lists_and_reports_progress(researcher, sample):
    client = APIClient()
    client.force_authenticate(researcher)
    response = client.post("/api/submissions/", {
        "display_name": "API model", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": scores_upload(sample)}, format="multipart")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "QUEUED" and body["runs"][0]["progress"] == {"done": 0, "total": 30, "percent": 0}
    assert [s["id"] for s in client.get("/api/submissions/").json()["results"]] == [body["id"]]

    again = client.post("/api/submissions/", {"display_name": "API model", "benchmark": "sample", "kind": "scores",
                                              "settings": ["profile"], "scores_file": scores_upload(sample)},
                        format="multipart")
    assert again.status_code == 400 and again.json()["existing"] == f"/submissions/{body['id']}/"

    services.run_execute(run_id=body["runs"][0]["id"])
    detail = client.get(f"/api/submissions/{body['id']}/").json()
    assert detail["status"] == "SUCCEEDED" and detail["runs"][0]["metrics"]["accuracy"] == 1.0
    assert client.post(f"/api/submissions/{body['id']}/cancel/").status_code == 200


def test_the_api_refuses_bad_submissions_with_400_and_annotators_with_403(researcher, annotator, sample):
    client = APIClient()
    client.force_authenticate(researcher)
    response = client.post("/api/submissions/", {"display_name": "x", "benchmark": "sample", "kind": "scalar",
                                                 "settings": ["no_profile"], "model_path": "../outside"},
                           format="json")
    assert response.status_code == 400 and "model_path" in response.json()
    client.force_authenticate(annotator)
    assert client.post("/api/submissions/", {}, format="json").status_code == 403


def test_per_pair_results_export_as_csv_and_jsonl(client, researcher, sample):
    submission = submit_scores(researcher, sample)
    run = submission.runs.get()
    services.run_execute(run_id=run.pk)
    client.force_login(researcher)
    csv_body = b"".join(client.get(f"/submissions/{submission.pk}/runs/{run.pk}/scores.csv").streaming_content)
    lines = csv_body.decode().splitlines()
    assert lines[0].startswith("id,domain,chosen_score,rejected_score,correct,tie,manifest_code_version,") \
        and len(lines) == 31
    jsonl = b"".join(client.get(f"/submissions/{submission.pk}/runs/{run.pk}/scores.jsonl").streaming_content)
    rows = [json.loads(line) for line in jsonl.decode().splitlines()]
    assert len(rows) == 30 and rows[0]["correct"] is True


def test_the_leaderboard_lists_finished_runs_with_significance_groups(researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    for name, wrong in (("perfect", ()), ("close", ids[:1]), ("weak", ids[:15])):
        submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(sample, wrong=set(wrong), name=f"{name}.jsonl")))
        services.run_execute(run_id=submission.runs.get().pk)
        services.submission_publish(user=researcher, submission=submission)
    rows = leaderboard_rows(benchmark="sample")
    assert [(r["display_name"], round(r["accuracy"], 3)) for r in rows] == [
        ("perfect", 1.0), ("close", 0.967), ("weak", 0.5)]
    ranks = {r["display_name"]: r["rank"] for r in rows}
    assert ranks["perfect"] == ranks["close"] == 1 and ranks["weak"] == 3
    assert [r["display_name"] for r in leaderboard_rows(benchmark="sample", sort="name", descending=False)] == [
        "close", "perfect", "weak"]


def test_each_setting_is_its_own_ranked_table_on_the_page_and_in_the_api(client, researcher, sample):
    """The fault: settings interleaved, a 46.7% model showing rank 1 just below 60% models ranked 2."""
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    for name, setting, wrong in (("p-top", "profile", 0), ("p-mid", "profile", 12), ("p-low", "profile", 13),
                                 ("n-only", "no_profile", 16)):
        submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=(setting,),
            scores_file=scores_upload(sample, wrong=set(ids[:wrong]), name=f"{name}.jsonl")))
        services.run_execute(run_id=submission.runs.get().pk)
        services.submission_publish(user=researcher, submission=submission)
    tables = leaderboard_tables(benchmark="sample")
    assert [(t["setting"], [(r["display_name"], round(r["accuracy"], 3), r["rank"]) for r in t["rows"]])
            for t in tables] == [
        ("no_profile", [("n-only", 0.467, 1)]),
        ("profile", [("p-top", 1.0, 1), ("p-mid", 0.6, 2), ("p-low", 0.567, 2)])]
    api = APIClient().get("/api/leaderboard/", {"benchmark": "sample"}).json()
    assert [(r["setting"], r["display_name"], r["rank"]) for r in api] == [
        ("no_profile", "n-only", 1), ("profile", "p-top", 1), ("profile", "p-mid", 2), ("profile", "p-low", 2)]
    assert api[0]["rm"] == f"{researcher.username}/n-only"
    nested = APIClient().get("/api/leaderboard/", {"benchmark": "sample", "tables": "1"}).json()
    assert [(t["setting"], len(t["rows"])) for t in nested] == [("no_profile", 1), ("profile", 3)]
    html = client.get("/", {"benchmark": "sample"}).content.decode()
    assert html.count('<table class="table leaderboard-table"') == 2
    assert html.index('data-setting="no_profile"') < html.index('id="table-profile"')


def test_the_leaderboard_query_count_does_not_grow_with_submissions(client, researcher, sample):
    ids = list(sample.items.values_list("source_id", flat=True))

    def add(n):
        for i in range(n):
            owner = UserFactory(roles=["researcher"])
            submission = services.submission_create(user=owner, request=services.SubmissionRequest(
                display_name=f"m{Submission.objects.count()}", benchmark="sample", kind="scores",
                settings=("no_profile",),
                scores_file=scores_upload(sample, wrong=set(ids[: Submission.objects.count() + 1]),
                                          name=f"s{Submission.objects.count()}.jsonl")))
            services.run_execute(run_id=submission.runs.get().pk)
            services.submission_publish(user=owner, submission=submission)

    add(2)
    with CaptureQueriesContext(connection) as few:
        assert client.get("/").status_code == 200
    add(4)
    with CaptureQueriesContext(connection) as many:
        response = client.get("/")
    assert response.status_code == 200 and response.content.count(b'data-submission="') == 6
    assert len(many) == len(few)
    api = APIClient().get("/api/leaderboard/", {"benchmark": "sample"})
    assert api.status_code == 200 and len(api.json()) == 6


def test_a_pairwise_judge_behind_a_staff_backend_reports_its_position_bias(researcher, sample, fake_openai,
                                                                          monkeypatch):
    from pipeline.models import LLMEndpoint

    # A judge that always answers "A": right when chosen is shown first, wrong otherwise.
    fake_openai.responder = lambda body: "I compared both.\nVerdict: A"
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test-not-a-real-key")
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, api_key_env="FAKE_JUDGE_KEY")
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="Always-A judge", benchmark="sample", kind="pairwise", settings=("profile",),
        judge_backend="fake", model_path="fake-model"))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    judge = run.metrics["judge"]
    assert run.metrics["accuracy"] == 0.0  # a 1-1 split over the two orders is a tie: wrong
    assert run.metrics["accuracy_ties_half"] == 0.5
    assert judge["position_bias"] == 1.0 and judge["order_consistency"] == 0.0
    assert judge["parse_failure_rate"] == 0.0 and judge["judgments"] == 60
    assert len(fake_openai.requests) == 60
    auth = [{k.lower(): v for k, v in r["headers"].items()}["authorization"] for r in fake_openai.requests]
    assert set(auth) == {"Bearer sk-test-not-a-real-key"}
    # The key never lands in the database.
    assert "sk-test" not in json.dumps(run.metrics) + json.dumps(submission.options)


def test_hub_ids_are_refused_unless_allowed_and_already_on_the_machine(researcher, sample, settings, tmp_path,
                                                                        monkeypatch):
    from huggingface_hub import constants

    from prblib.tiny_models import build_encoder_rm

    assert "ALLOW_HUB_MODELS" in str(refusal(researcher, model_path="org/tiny-rm"))
    settings.ALLOW_HUB_MODELS = True
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert "not in this machine's cache" in str(refusal(researcher, model_path="org/tiny-rm"))

    repo = tmp_path / "hub" / "models--org--tiny-rm"
    build_encoder_rm(repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="hub model", benchmark="sample", kind="scalar", settings=("no_profile",),
        model_path="org/tiny-rm"))
    assert submission.model_path == str((repo / "snapshots" / "0123abcd").resolve())
    assert services.run_execute(run_id=submission.runs.get().pk) == RunStatus.SUCCEEDED
    # What people read names the Hub model and revision, never the server's cache folder.
    assert submission.model_shown == "hf:org/tiny-rm@0123abcd"
    run = submission.runs.get()
    assert run.metrics["manifest"]["model"] == "hf:org/tiny-rm@0123abcd"
    from django.test import Client

    client = Client()
    client.force_login(researcher)
    page = client.get(f"/submissions/{submission.pk}/").content.decode()
    api = client.get(f"/api/submissions/{submission.pk}/").json()
    assert "hf:org/tiny-rm@0123abcd" in page and str(tmp_path) not in page
    assert api["model_path"] == "hf:org/tiny-rm@0123abcd" and str(tmp_path) not in json.dumps(api)


@pytest.mark.parametrize("total, batch, cap, expected", [
    (30, 8, 64, 8),       # the sample: four updates instead of one jump from 0 to 30
    (30, 1, 64, 2),       # ~1/20 of the run
    (10_000, 8, 64, 64),  # capped: a killed worker loses at most RUN_CHUNK_PAIRS pairs
    (0, 8, 64, 8),
])
def test_progress_is_saved_in_chunks_of_about_a_twentieth_of_the_run(total, batch, cap, expected):
    assert services.progress_chunk_size(total=total, batch_size=batch, cap=cap) == expected


def test_a_run_reports_progress_after_every_chunk(researcher, sample, monkeypatch):
    seen = []
    original = services.EvaluationRun.objects.filter

    def spy(*args, **kwargs):
        qs = original(*args, **kwargs)
        if kwargs.get("status") == RunStatus.RUNNING and "pk" in kwargs:
            done = PairScore.objects.filter(run_id=kwargs["pk"]).count()
            if not seen or seen[-1] != done:
                seen.append(done)
        return qs

    run = submit_scores(researcher, sample).runs.get()
    monkeypatch.setattr(services.EvaluationRun.objects, "filter", spy)
    services.run_execute(run_id=run.pk)
    assert [d for d in seen if d] == [8, 16, 24, 30]


def test_a_researcher_submits_through_the_form_and_lands_on_the_queued_submission(researcher, sample):
    """The page's request.user is a lazy object; the hourly limit's row lock must still find the user."""
    from django.test import Client

    client = Client()
    client.force_login(researcher)
    response = client.post("/submit/", {"display_name": "form scores", "benchmark": "sample", "kind": "scores",
                                        "settings": ["profile"], "dtype": "auto", "max_length": 4096,
                                        "batch_size": 8, "profile_k": 10, "scores_file": scores_upload(sample)})
    submission = Submission.objects.get()
    assert response.status_code == 302 and response["Location"] == submission.get_absolute_url()
    assert (submission.owner, submission.display_name) == (researcher, "form scores")
    assert list(submission.runs.values_list("status", flat=True)) == [RunStatus.QUEUED]
