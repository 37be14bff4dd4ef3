"""The job lifecycle, one implementation for every kind of long work (see jobs/models.py).

    create (the kind's own service) -> job_enqueue -> [worker] job_execute:
        job_claim (conditional UPDATE QUEUED -> RUNNING, attempts + 1)
        heartbeat thread touching heartbeat_at every RUN_HEARTBEAT_SECONDS
        work(job): does only the units not done yet (upserts by a unique key), reports
                   job_progress (which raises JobStopped once the job was cancelled)
        -> SUCCEEDED with the fields `work` returns, or FAILED with a readable reason
    job_cancel / job_retry (owner or staff); jobs_recover_stale re-queues RUNNING jobs whose
    heartbeat stopped (worker killed) and fails them after RUN_MAX_ATTEMPTS claims.

Nothing here imports another app: the kinds are found as the installed models that
inherit `Job`, and tasks are sent by name.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from .models import ACTIVE_STATUSES, RETRYABLE_STATUSES, Job, JobStatus

log = logging.getLogger(__name__)

J = TypeVar("J", bound=Job)


class JobRefused(Exception):
    """An action on a job that is not allowed (permission or state); the message says why."""


class JobNotFound(Exception):
    """No job of that type and id that this user may see."""


class JobStopped(Exception):
    """Raised inside a job's work once the job is no longer RUNNING (cancelled, or taken over)."""


# --- the kinds ---------------------------------------------------------------------------------

def job_models() -> list[type[Job]]:
    """Every installed model that is a kind of job, in a fixed order."""
    found = [m for m in apps.get_models() if issubclass(m, Job)]
    return sorted(found, key=lambda m: m.job_type)


def job_model(job_type: str) -> type[Job]:
    for model in job_models():
        if model.job_type == job_type:
            return model
    raise JobRefused(f"no job type '{job_type}' (types: {', '.join(m.job_type for m in job_models())})")


def jobs_visible_to(model: type[J], user) -> QuerySet[J]:
    """The user's own jobs of this kind; staff see all; kinds without an owner are staff-only."""
    qs = model.objects.all()
    if user.is_staff:
        return qs
    if not model.job_owner:
        return qs.none()
    return qs.filter(**{model.job_owner: user})


def job_get(*, user, job_type: str, pk: int) -> Job:
    """One job the user may see; JobNotFound otherwise (unknown type included)."""
    try:
        model = job_model(job_type)
    except JobRefused:
        raise JobNotFound(f"no {job_type} job {pk}") from None
    job = jobs_visible_to(model, user).select_related(*model.job_related).filter(pk=pk).first()
    if job is None:
        raise JobNotFound(f"no {job_type} job {pk}")
    return job


def job_act(*, user, job_type: str, pk: int, action: str) -> Job:
    """Cancel or retry one job the user may see (the Jobs page and API); returns it as it is
    now. JobNotFound when there is none, JobRefused when the action is not allowed now."""
    job = job_get(user=user, job_type=job_type, pk=pk)
    if action == "cancel":
        if not job_cancel(user=user, job=job):
            raise JobRefused(f"Only unfinished jobs can be cancelled; this one is {job.get_status_display().lower()}.")
    elif action == "retry":
        job_retry(user=user, job=job)
    else:
        raise JobRefused(f"no action '{action}' (cancel, retry)")
    return job_get(user=user, job_type=job_type, pk=pk)


def _may_act(job: Job, user) -> bool:
    return bool(user.is_staff or (job.job_owner and type(job).objects.filter(
        pk=job.pk, **{job.job_owner: user}).exists()))


# --- queueing ----------------------------------------------------------------------------------

def job_enqueue(job: Job, *, send: bool = True) -> None:
    """Mark the job QUEUED and, once the surrounding transaction commits, send its task.
    With send=False the caller runs it in this process (management commands). A job that is
    RUNNING is refused (JobRefused): cancel it first, or let the stale sweep re-queue it."""
    if not type(job).objects.filter(pk=job.pk).exclude(status=JobStatus.RUNNING).update(
            status=JobStatus.QUEUED, queued_at=timezone.now(), error="", heartbeat_at=None, worker="",
            finished_at=None):
        raise JobRefused(f"{job.job_type} {job.pk} is running; cancel it first")
    job.status = JobStatus.QUEUED
    if send:
        from celery import current_app

        name, pk = job.job_task, job.pk
        transaction.on_commit(lambda: current_app.send_task(name, args=[pk]))


def job_cancel(*, user, job: Job) -> bool:
    """Cancel an unfinished job; a running worker stops at its next progress report."""
    if not _may_act(job, user):
        raise JobRefused("Only the owner or staff can cancel this job.")
    return bool(type(job).objects.filter(pk=job.pk, status__in=ACTIVE_STATUSES).update(
        status=JobStatus.CANCELLED, finished_at=timezone.now(), error="Cancelled by " + user.get_username()))


def job_retry(*, user, job: Job) -> None:
    """Queue a failed or cancelled job again; units already done are kept and not redone."""
    if not _may_act(job, user):
        raise JobRefused("Only the owner or staff can retry this job.")
    with transaction.atomic():
        job = type(job).objects.select_for_update().get(pk=job.pk)
        if job.status not in RETRYABLE_STATUSES:
            raise JobRefused(f"Only failed or cancelled jobs can be retried; this one is "
                             f"{job.get_status_display().lower()}.")
        refusal = job.job_retry_refusal()
        if refusal:
            raise JobRefused(refusal)
        job.job_reset_for_retry()
        type(job).objects.filter(pk=job.pk).update(attempts=0)
        job_enqueue(job)


# --- running -----------------------------------------------------------------------------------

def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def job_claim(model: type[J], pk: int) -> J | None:
    """PENDING or QUEUED -> RUNNING by a conditional UPDATE; None when another delivery got it
    first or the job is not waiting (cancelled, failed, finished, already running)."""
    now = timezone.now()
    claimed = model.objects.filter(pk=pk, status__in=[JobStatus.PENDING, JobStatus.QUEUED]).update(
        status=JobStatus.RUNNING, heartbeat_at=now, worker=worker_id(), attempts=F("attempts") + 1, error="")
    if not claimed:
        return None
    model.objects.filter(pk=pk, started_at__isnull=True).update(started_at=now)
    return model.objects.get(pk=pk)


def job_progress(job: Job, done: int, total: int | None = None) -> None:
    """Record progress (units done, optionally the total) and touch the heartbeat. Raises
    JobStopped when the job is no longer RUNNING, so the work stops between units."""
    fields: dict[str, Any] = {"progress_done": done, "heartbeat_at": timezone.now()}
    if total is not None:
        fields["progress_total"] = total
    if not type(job).objects.filter(pk=job.pk, status=JobStatus.RUNNING).update(**fields):
        raise JobStopped(job.pk)
    job.progress_done = done
    if total is not None:
        job.progress_total = total


def job_is_running(job: Job) -> bool:
    return type(job).objects.filter(pk=job.pk, status=JobStatus.RUNNING).exists()


class _Heartbeat:
    """Touches the job's heartbeat from a background thread while it works, so a long model
    load or a slow batch does not look like a dead worker."""

    def __init__(self, model: type[Job], pk: int):
        self.model, self.pk = model, pk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{model.job_type}-{pk}", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        """One beat per RUN_HEARTBEAT_SECONDS. A beat the database refuses (SQLite's "database
        is locked" after its busy timeout, a dropped PostgreSQL connection) is logged and tried
        again on a fresh connection a quarter period later: a thread that died on one error would
        leave a live job looking dead, and the stale sweep would hand it to a second worker."""
        period = settings.RUN_HEARTBEAT_SECONDS
        wait = period
        try:
            while not self._stop.wait(wait):
                try:
                    self.model.objects.filter(pk=self.pk, status=JobStatus.RUNNING).update(
                        heartbeat_at=timezone.now())
                    wait = period
                except DatabaseError as exc:
                    log.warning("%s %s: heartbeat not recorded (%s); retrying", self.model.job_type, self.pk, exc)
                    connection.close()
                    wait = max(period / 4, 0.05)
        finally:
            connection.close()


def readable_reason(exc: BaseException, expected: tuple[type[BaseException], ...] = (), *,
                    progress: tuple[int, int] | None = None) -> str:
    """One line for people: the message of an expected error, the time limit (with the job's
    (done, total) progress when given, and how to go on), or 'Type: message'."""
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, SoftTimeLimitExceeded):
        limit = f"Stopped by the time limit ({settings.CELERY_TASK_SOFT_TIME_LIMIT} s)"
        if progress is None:
            return limit + "."
        return f"{limit} at {progress[0]} of {progress[1]}; what was done is kept: retry to continue from there."
    if expected and isinstance(exc, expected):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def redact_server_paths(text: str) -> str:
    """`text` with the server's own folders named instead of spelled out: the models root,
    the data root, the var folder, the code's folder and the Hugging Face cache become
    <models>, <data>, <var>, <app> and <hf-cache> (the longest first, so <models> wins inside
    <var>). A job's failure reason is public once its submission is published, and its log
    tail goes to the submitter: neither should map the worker's disk. A folder counts only as
    a whole path: not preceded by a name character (so ".../huggingface.co/models" and
    "host:8000/approve" stay as they are) and followed by "/" or the end of the path.
    E.g. "/srv/prbench/var/models/alice-rm/config.json" -> "<models>/alice-rm/config.json"."""
    from huggingface_hub import constants as hub

    roots = [(str(root), f"<{name}>") for name, root in (
        ("models", settings.MODELS_ROOT), ("data", settings.DATA_ROOT), ("var", settings.VAR_DIR),
        ("app", settings.BASE_DIR), ("hf-cache", hub.HF_HUB_CACHE))]
    for root, name in sorted(roots, key=lambda r: len(r[0]), reverse=True):
        root = root.rstrip("/")
        if root:  # never the filesystem root itself
            text = re.sub(rf"(?<![\w.~-]){re.escape(root)}(?![\w.~-])", name, text)
    return text


def job_execute(model: type[J], pk: int, work: Callable[[J], dict | None], *,
                expected: tuple[type[BaseException], ...] = ()) -> str:
    """Claim the job, run `work(job)` under a heartbeat and record the outcome. Returns the
    job's final status (or its current one when this delivery had nothing to do).

    `work` returns the fields to store with SUCCEEDED ({} for none), or None when it stopped
    without finishing and the status it set stands. An exception fails the job with a
    readable reason (`expected` errors by their message alone) and the traceback's tail."""
    job = job_claim(model, pk)
    if job is None:
        status = model.objects.filter(pk=pk).values_list("status", flat=True).first()
        log.info("%s %s is %s; this delivery has nothing to do", model.job_type, pk, status)
        return status or "MISSING"
    try:
        with _Heartbeat(model, pk):
            fields = work(job)
    except JobStopped:
        fields = None
    except BaseException as exc:
        progress = model.objects.values_list("progress_done", "progress_total").get(pk=pk)
        reason = readable_reason(exc, expected, progress=progress)
        model.objects.filter(pk=pk, status=JobStatus.RUNNING).update(
            status=JobStatus.FAILED, error=redact_server_paths(reason)[:4000],
            log_tail=redact_server_paths(traceback.format_exc())[-4000:], finished_at=timezone.now())
        log.warning("%s %s failed: %s", model.job_type, pk, reason)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return model.objects.values_list("status", flat=True).get(pk=pk)
    if fields is not None:
        model.objects.filter(pk=pk, status=JobStatus.RUNNING).update(
            status=JobStatus.SUCCEEDED, finished_at=timezone.now(), **fields)
    return model.objects.values_list("status", flat=True).get(pk=pk)


def job_fail(job: Job, reason: str) -> None:
    """Fail a RUNNING job from inside its work with a reason that is not an exception
    (e.g. some units failed and wait for a retry)."""
    type(job).objects.filter(pk=job.pk, status=JobStatus.RUNNING).update(
        status=JobStatus.FAILED, error=redact_server_paths(reason)[:4000], finished_at=timezone.now())
    raise JobStopped(job.pk)


# --- recovery ----------------------------------------------------------------------------------

def jobs_recover_stale(*, stale_after: timedelta | None = None) -> list[tuple[str, int]]:
    """Re-queue RUNNING jobs of every kind whose worker stopped sending heartbeats (killed,
    lost power, OOM); after RUN_MAX_ATTEMPTS claims the job fails instead of looping forever.
    Returns the (type, id) pairs re-queued.

    The broker alone cannot be trusted here: Redis redelivers an unacknowledged message only
    after its visibility timeout, and the filesystem transport loses it."""
    cutoff = timezone.now() - (stale_after or timedelta(seconds=settings.RUN_STALE_SECONDS))
    recovered = []
    for model in job_models():
        stale = model.objects.filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True),
                                     status=JobStatus.RUNNING)
        for job in stale:
            unchanged = model.objects.filter(pk=job.pk, status=JobStatus.RUNNING, heartbeat_at=job.heartbeat_at)
            if job.attempts >= settings.RUN_MAX_ATTEMPTS:
                unchanged.update(status=JobStatus.FAILED, finished_at=timezone.now(),
                                 error=f"The worker running this was lost {job.attempts} times "
                                       f"(last: {job.worker or 'unknown'}); giving up.")
                continue
            with transaction.atomic():
                if unchanged.update(status=JobStatus.QUEUED):  # only if nobody touched it since we read it
                    log.warning("%s %s: no heartbeat from %s since %s; re-queued", model.job_type, job.pk,
                                job.worker, job.heartbeat_at)
                    job_enqueue(job)
                    recovered.append((model.job_type, job.pk))
    return recovered
