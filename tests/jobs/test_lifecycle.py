"""One job lifecycle for all five kinds of long work: claim, progress, cancel, retry, stale
sweep, and the Jobs API and page."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import JobStatus
from jobs.services import (
    JobRefused, job_claim, job_enqueue, job_execute, job_models, job_progress, jobs_recover_stale,
)
from leaderboard.models import BestOfNRun, EvaluationRun, PPORun, Submission
from pipeline.build import template_latest, templates_ensure_defaults
from pipeline.models import BuildRun, LLMEndpoint, PolicySampleSet
from tests.factories import BenchmarkFactory, UserFactory

pytestmark = pytest.mark.django_db

KINDS = ("best_of_n", "build", "evaluation", "ppo", "sampling")


@pytest.fixture
def owner(db):
    return UserFactory(roles=["researcher"])


def make_job(kind: str, owner):
    """One row of the kind, PENDING, owned by `owner` (sample sets have no owner: staff only)."""
    benchmark = BenchmarkFactory()
    endpoint, _ = LLMEndpoint.objects.get_or_create(name="judge", defaults={"base_url": "http://127.0.0.1:9/v1"})
    submission = Submission.objects.create(owner=owner, display_name=f"rm for {kind}", benchmark=benchmark,
                                           kind="scalar", model_path="rm", weights_hash="0" * 64)
    if kind == "evaluation":
        return EvaluationRun.objects.create(submission=submission, setting="profile",
                                            fingerprint=f"{kind}-{submission.pk}")
    if kind == "sampling":
        return PolicySampleSet.objects.create(benchmark=benchmark, model="policy", n=2)
    if kind == "best_of_n":
        sample_set = PolicySampleSet.objects.create(benchmark=benchmark, model="policy", n=2)
        return BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=endpoint, judge_model="j")
    if kind == "ppo":
        return PPORun.objects.create(submission=submission, policy_model="policy", judge=endpoint, judge_model="j")
    templates_ensure_defaults()
    return BuildRun.objects.create(name=f"build-{benchmark.pk}", source_path="x", generator_model="g",
                                   chosen_template=template_latest("chosen"), created_by=owner)


def test_the_five_kinds_of_long_work_are_jobs():
    assert sorted(m.job_type for m in job_models()) == list(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_without_heartbeat_is_requeued_then_failed_after_max_attempts(kind, owner, settings):
    job = make_job(kind, owner)
    model = type(job)
    stale = timezone.now() - timedelta(seconds=settings.RUN_STALE_SECONDS + 5)
    model.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, heartbeat_at=stale, attempts=1,
                                           worker="dead-host:1")
    assert jobs_recover_stale() == [(kind, job.pk)]
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.worker == ""
    model.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, heartbeat_at=stale, worker="dead-host:1",
                                           attempts=settings.RUN_MAX_ATTEMPTS)
    assert jobs_recover_stale() == []
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error == f"The worker running this was lost {settings.RUN_MAX_ATTEMPTS} times; giving up."  # no host: reasons go public
    # A fresh heartbeat is left alone.
    model.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, heartbeat_at=timezone.now())
    assert jobs_recover_stale() == []


@pytest.mark.parametrize("kind", KINDS)
def test_only_one_delivery_claims_a_job_and_failed_or_cancelled_jobs_are_never_claimed(kind, owner):
    job = make_job(kind, owner)
    job_enqueue(job, send=False)
    first, second = job_claim(type(job), job.pk), job_claim(type(job), job.pk)
    assert first is not None and second is None
    assert (first.status, first.attempts) == (JobStatus.RUNNING, 1)
    for status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.SUCCEEDED):
        type(job).objects.filter(pk=job.pk).update(status=status)
        assert job_claim(type(job), job.pk) is None


def test_a_cancelled_job_stops_at_its_next_progress_report_and_stays_cancelled(owner):
    job = make_job("ppo", owner)
    job_enqueue(job, send=False)
    reports = []

    def work(j):
        job_progress(j, 1, 10)
        reports.append(1)
        PPORun.objects.filter(pk=j.pk).update(status=JobStatus.CANCELLED)
        job_progress(j, 2)
        reports.append(2)  # never reached
        return {}

    assert job_execute(PPORun, job.pk, work) == JobStatus.CANCELLED
    assert reports == [1]
    job.refresh_from_db()
    assert (job.progress_done, job.progress_total) == (1, 10)


def test_a_failing_job_records_a_readable_reason_and_the_traceback(owner):
    job = make_job("sampling", owner)
    job_enqueue(job, send=False)

    def work(j):
        raise ValueError("the policy folder has no config.json")

    assert job_execute(PolicySampleSet, job.pk, work) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.error == "ValueError: the policy folder has no config.json"
    assert "Traceback" in job.log_tail and job.finished_at is not None


def test_a_running_job_cannot_be_queued_twice(owner):
    job = make_job("best_of_n", owner)
    BestOfNRun.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    with pytest.raises(JobRefused, match="is running; cancel it first"):
        job_enqueue(job)


# --- the API and the page -----------------------------------------------------------------------

def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_jobs_api_lists_the_owners_jobs_of_every_kind_and_staff_see_all(owner, staff_user):
    jobs = {kind: make_job(kind, owner) for kind in KINDS}
    stranger = UserFactory(roles=["researcher"])
    make_job("evaluation", stranger)

    mine = api(owner).get("/api/jobs/").json()
    # Sample sets have no owner (two were made for sampling and best_of_n): staff only.
    assert sorted((j["type"], j["id"]) for j in mine["results"]) == sorted(
        (k, j.pk) for k, j in jobs.items() if k != "sampling")
    row = next(j for j in mine["results"] if j["type"] == "ppo")
    assert row["status"] == "PENDING" and row["progress"] == {"done": 0, "total": 0, "percent": 0}
    assert row["title"] == "PPO of Qwen2.5-0.5B-Instruct against rm for ppo" and row["can_cancel"] is True

    everything = api(staff_user).get("/api/jobs/").json()
    assert everything["count"] == 4 + 2 + 1  # four owned kinds + two sample sets + the stranger's run
    assert api(staff_user).get("/api/jobs/?type=sampling").json()["count"] == 2
    bad = api(owner).get("/api/jobs/?type=training")
    assert bad.status_code == 400 and "no job type 'training'" in bad.json()["detail"]
    assert api(owner).get("/api/jobs/?status=DONE").status_code == 400


def test_cancel_and_retry_through_the_api_for_the_owner_only_and_each_is_idempotent(owner, staff_user):
    job = make_job("ppo", owner)
    stranger = UserFactory(roles=["researcher"])
    assert api(stranger).post(f"/api/jobs/ppo/{job.pk}/cancel/").status_code == 404
    response = api(owner).post(f"/api/jobs/ppo/{job.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
    # The reason becomes public with a published submission: it names no account.
    assert response.json()["reason"] == response.json()["error"] == "Cancelled by its owner."
    again = api(owner).post(f"/api/jobs/ppo/{job.pk}/cancel/")  # a second press: a no-op, not a toggle
    assert again.status_code == 200 and again.json()["status"] == "CANCELLED"
    assert again.json()["reason"] == "Cancelled by its owner."
    PPORun.objects.filter(pk=job.pk).update(attempts=3)
    retried = api(owner).post(f"/api/jobs/ppo/{job.pk}/retry/")
    assert retried.status_code == 200 and retried.json()["status"] == "QUEUED" and retried.json()["attempts"] == 0
    queued_at = PPORun.objects.get(pk=job.pk).queued_at
    twice = api(owner).post(f"/api/jobs/ppo/{job.pk}/retry/")  # already queued again: left as it is
    assert twice.status_code == 200 and twice.json()["status"] == "QUEUED"
    assert PPORun.objects.get(pk=job.pk).queued_at == queued_at
    assert api(staff_user).post(f"/api/jobs/ppo/{job.pk}/cancel/").json()["reason"] == "Cancelled by staff."
    PPORun.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED)
    refused = api(owner).post(f"/api/jobs/ppo/{job.pk}/retry/")
    assert refused.status_code == 409 and "this one is succeeded" in refused.json()["detail"]
    late = api(owner).post(f"/api/jobs/ppo/{job.pk}/cancel/")
    assert late.status_code == 409 and "this one is succeeded" in late.json()["detail"]


def test_a_build_that_produced_its_benchmark_is_not_retried(owner, staff_user):
    job = make_job("build", owner)
    BuildRun.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, benchmark=BenchmarkFactory())
    refused = api(staff_user).post(f"/api/jobs/build/{job.pk}/retry/")
    assert refused.status_code == 409 and refused.json()["detail"] == "the build already produced its benchmark"


def test_the_jobs_page_shows_status_progress_reason_and_actions(client, owner):
    job = make_job("evaluation", owner)
    EvaluationRun.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, progress_done=12, progress_total=30,
                                                   error="the planner has not run")
    client.force_login(owner)
    html = client.get("/jobs/").content.decode()
    assert f'id="job-evaluation-{job.pk}"' in html
    assert 'max="30" value="12"' in html and "the planner has not run" in html
    assert f'action="/jobs/evaluation/{job.pk}/retry/"' in html
    response = client.post(f"/jobs/evaluation/{job.pk}/retry/")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert client.get("/jobs/", follow=False).status_code == 200
    assert "/api/jobs/{job_type}/{id}/retry/:" in client.get("/api/schema/").content.decode()
    client.logout()
    assert client.get("/jobs/").status_code == 302  # to the login page


def test_a_heartbeat_the_database_refuses_is_retried_not_dropped(settings, monkeypatch, caplog):
    """One refused beat (SQLite's "database is locked") must not end the heartbeat thread: the
    job would look dead while it works, and the stale sweep would hand it to a second worker."""
    import time

    from django.db import OperationalError

    from jobs.services import _Heartbeat

    settings.RUN_HEARTBEAT_SECONDS = 0.05
    beats = []

    class Rows:
        def update(self, **fields):
            beats.append(fields)
            if len(beats) <= 2:
                raise OperationalError("database is locked")
            return 1

    monkeypatch.setattr(PPORun.objects, "filter", lambda **kw: Rows())
    with _Heartbeat(PPORun, 1, "token"):
        deadline = time.monotonic() + 10
        while len(beats) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(beats) >= 4 and all("heartbeat_at" in b for b in beats)  # beats went on after two refusals
    assert "heartbeat not recorded (database is locked); retrying" in caplog.text


def test_failure_reasons_and_log_tails_name_the_servers_folders_not_their_paths(settings, tmp_path):
    from jobs.services import redact_server_paths

    settings.BASE_DIR, settings.VAR_DIR = tmp_path / "app", tmp_path / "app" / "var"
    settings.MODELS_ROOT, settings.DATA_ROOT = tmp_path / "app" / "var" / "models", tmp_path / "srv-data"
    text = (f"cannot load the model in {tmp_path}/app/var/models/alice-rm: no file {tmp_path}/srv-data/x.json; "
            f"File \"{tmp_path}/app/prblib/rewards/scalar.py\", line 3; cache {tmp_path}/app/var/cache")
    assert redact_server_paths(text) == ("cannot load the model in <models>/alice-rm: no file <data>/x.json; "
                                         "File \"<app>/prblib/rewards/scalar.py\", line 3; cache <var>/cache")


def test_redaction_takes_only_whole_paths_and_covers_the_hugging_face_cache(settings, monkeypatch):
    """Docker's usual roots are /app and /models: a URL or a longer folder name that merely
    contains them stays as it is."""
    from huggingface_hub import constants as hub

    from jobs.services import redact_server_paths

    settings.BASE_DIR, settings.VAR_DIR, settings.MODELS_ROOT, settings.DATA_ROOT = "/app", "/app/var", "/models", "/data"
    monkeypatch.setattr(hub, "HF_HUB_CACHE", "/root/.cache/huggingface/hub")
    text = ("listed on 'https://huggingface.co/models'; POST http://judge:8000/approve/v1; /app2/other; "
            "/models/alice-rm; (/data); model folder /root/.cache/huggingface/hub/models--org--rm/snapshots/0123/")
    assert redact_server_paths(text) == (
        "listed on 'https://huggingface.co/models'; POST http://judge:8000/approve/v1; /app2/other; "
        "<models>/alice-rm; (<data>); model folder <hf-cache>/models--org--rm/snapshots/0123/")


def test_the_jobs_page_shows_owner_start_and_duration_and_filters_by_type_status_and_owner(client, owner,
                                                                                           staff_user):
    from jobs.selectors import duration_text

    done = make_job("evaluation", owner)
    start = timezone.now() - timedelta(hours=1)
    EvaluationRun.objects.filter(pk=done.pk).update(status=JobStatus.SUCCEEDED, started_at=start,
                                                   finished_at=start + timedelta(minutes=3, seconds=5))
    queued = make_job("ppo", owner)
    other = make_job("evaluation", UserFactory(username="zoe", roles=["researcher"]))
    build = make_job("build", owner)
    row = api(owner).get("/api/jobs/?type=evaluation").json()["results"][0]
    assert (row["owner"], row["duration_seconds"]) == (owner.username, 185.0)
    assert api(owner).get("/api/jobs/?type=ppo").json()["results"][0]["duration_seconds"] is None
    assert [duration_text(s) for s in (None, 44.6, 185.0, 7440)] == ["", "45 s", "3 min 05 s", "2 h 04 min"]

    client.force_login(owner)
    html = client.get("/jobs/").content.decode()
    assert '<td class="num nowrap job-duration">3 min 05 s</td>' in html and "not yet" in html
    assert f'id="job-evaluation-{other.pk}"' not in html  # another researcher's job
    assert 'name="owner"' not in html  # the owner filter is staff's
    only_ppo = client.get("/jobs/", {"type": "ppo"}).content.decode()
    assert f'id="job-ppo-{queued.pk}"' in only_ppo and f'id="job-evaluation-{done.pk}"' not in only_ppo
    none = client.get("/jobs/", {"status": "FAILED"}).content.decode()
    assert "No jobs match these filters" in none
    bad = client.get("/jobs/", {"status": "DONE"})
    assert bad.status_code == 400 and "no status 'DONE'" in bad.content.decode()

    client.force_login(staff_user)
    zoe = client.get("/jobs/", {"owner": "zoe"}).content.decode()
    assert f'id="job-evaluation-{other.pk}"' in zoe and f'id="job-evaluation-{done.pk}"' not in zoe
    assert f'id="job-build-{build.pk}"' not in zoe  # builds have no owner
    assert f'id="job-build-{build.pk}"' in client.get("/jobs/").content.decode()
    assert [r["id"] for r in api(staff_user).get("/api/jobs/?owner=zoe").json()["results"]] == [other.pk]


def test_the_system_check_names_a_job_kind_whose_task_is_not_registered(monkeypatch):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from jobs.checks import job_tasks_registered

    assert job_tasks_registered(None) == []
    monkeypatch.setattr(PPORun, "job_task", "gpu.leaderboard.ppo_renamed")
    errors = job_tasks_registered(None)
    assert [(e.id, e.msg) for e in errors] == [
        ("jobs.E001", "the job kind 'ppo' (PPORun) has no registered Celery task 'gpu.leaderboard.ppo_renamed'")]
    with pytest.raises(SystemCheckError, match="jobs.E001"):
        call_command("check")
