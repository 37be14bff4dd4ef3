"""The job lifecycle, one implementation for every kind of long work (see jobs/models.py).

    create (the kind's own service) -> job_enqueue -> [worker] job_execute:
        job_claim (conditional UPDATE QUEUED -> RUNNING, attempts + 1, a new claim token)
        heartbeat thread touching heartbeat_at every RUN_HEARTBEAT_SECONDS
        work(job): does only the units not done yet (upserts by a unique key) inside
                   job_unit_write, reports job_progress; both raise JobStopped once this
                   execution is no longer the job's (cancelled, retried, taken over)
        -> SUCCEEDED with the fields `work` returns, or FAILED with a readable reason
    job_cancel / job_retry (owner or staff); jobs_recover_stale re-queues RUNNING jobs whose
    heartbeat stopped (worker killed), fails them after RUN_MAX_ATTEMPTS claims, and sends
    again the message of a QUEUED job nobody claimed within RUN_RESEND_SECONDS.

One execution per job: the claim refuses while an earlier execution of the same job still
holds its token with a fresh heartbeat (JobDeferred: the task puts its message back), and
every write of an execution is conditioned on its own token.

Nothing here imports another app: the kinds are found as the installed models that
inherit `Job`, and tasks are sent by name.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q, QuerySet
from django.dispatch import Signal
from django.utils import timezone

from .models import ACTIVE_STATUSES, RETRYABLE_STATUSES, Job, JobStatus

log = logging.getLogger(__name__)

J = TypeVar("J", bound=Job)


class JobRefused(Exception):
    """An action on a job that is not allowed (permission or state); the message says why.
    `status`: the HTTP answer (409; 429 when a limit refused it)."""

    def __init__(self, message: str, *, status: int = 409):
        super().__init__(message)
        self.status = status


# Sent inside job_retry's transaction, after the job was found retryable and before it is queued
# (sender: the job's model; job, user). A receiver may raise JobRefused to refuse the retry: the
# leaderboard counts a researcher's retries toward the hourly submission limit this way.
job_retry_requested = Signal()


class JobNotFound(Exception):
    """No job of that type and id that this user may see."""


class JobStopped(Exception):
    """Raised inside a job's work once this execution is no longer the job's (cancelled,
    retried, failed or taken over by another worker): it stops and writes nothing more."""


class JobDeferred(Exception):
    """This delivery cannot start the job now: the database refused the claim, or an earlier
    execution of the job has not stopped yet. The task hands its message back to the broker
    (not acknowledged), so it is delivered again."""


class JobNotSent(Exception):
    """The job is saved and QUEUED but its task message could not be sent (the broker is
    down). Nothing is lost: the sweep sends it again once the broker is back. The web layer
    answers 503 with this message."""


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


def _owns(job: Job, user) -> bool:
    return bool(job.job_owner and type(job).objects.filter(pk=job.pk, **{job.job_owner: user}).exists())


def _may_act(job: Job, user) -> bool:
    return bool(user.is_staff or _owns(job, user))


# --- queueing ----------------------------------------------------------------------------------

def job_enqueue(job: Job, *, send: bool = True) -> None:
    """Mark the job QUEUED and, once the surrounding transaction commits, send its task.
    With send=False the caller runs it in this process (management commands). A job that is
    RUNNING is refused (JobRefused): cancel it first, or let the stale sweep re-queue it.

    The row is saved before the message is sent, never the other way round: a send that fails
    (broker down) leaves a QUEUED job with no `sent_at`, which the sweep sends as soon as the
    broker is back, and raises JobNotSent after the commit so the caller can say so. The
    claim token and heartbeat of an earlier execution are kept: they keep a second execution
    from starting while that one may still run."""
    now = timezone.now()
    if not type(job).objects.filter(pk=job.pk).exclude(status=JobStatus.RUNNING).update(
            status=JobStatus.QUEUED, queued_at=now, error="", finished_at=None, worker="",
            sent_at=None if send else now):
        raise JobRefused(f"{job.job_type} {job.pk} is running; cancel it first")
    job.status = JobStatus.QUEUED
    if send:
        model, pk = type(job), job.pk
        transaction.on_commit(lambda: _send(model, pk))


def _send(model: type[Job], pk: int) -> None:
    """Send the job's task message and record when; JobNotSent when the broker refuses."""
    from celery import current_app

    try:
        current_app.send_task(model.job_task, args=[pk])
    except Exception as exc:  # kombu OperationalError, redis ConnectionError, OSError...
        log.error("%s %s: task not sent (%s); the sweep sends it once the broker is back", model.job_type, pk, exc)
        raise JobNotSent(f"The {model.job_type.replace('_', '-')} job {pk} is saved and queued, but the task queue "
                         f"is unreachable right now; it starts once the queue is back (checked every "
                         f"{settings.RUN_SWEEP_SECONDS} s). Nothing needs to be submitted again.") from exc
    model.objects.filter(pk=pk, status=JobStatus.QUEUED).update(sent_at=timezone.now())


def job_cancel(*, user, job: Job) -> bool:
    """Cancel an unfinished job; a running execution stops at its next progress report or unit
    write. Idempotent: cancelling a job that is already CANCELLED is a no-op that returns True;
    False for a job that already finished otherwise (SUCCEEDED or FAILED)."""
    owner = _owns(job, user)
    if not (owner or user.is_staff):
        raise JobRefused("Only the owner or staff can cancel this job.")
    model = type(job)
    if model.objects.filter(pk=job.pk, status__in=ACTIVE_STATUSES).update(
            status=JobStatus.CANCELLED, finished_at=timezone.now(),
            error="Cancelled by its owner." if owner else "Cancelled by staff."):
        return True
    return model.objects.filter(pk=job.pk, status=JobStatus.CANCELLED).exists()


def job_retry(*, user, job: Job, before: Callable[[], None] | None = None) -> None:
    """Queue a failed or cancelled job again; units already done are kept and not redone.
    Idempotent: a job already QUEUED again (a repeated retry) is left as it is. The new
    execution starts only once an earlier one has stopped (or its heartbeat went stale):
    its claim is deferred until then. Before it is queued, `before()` is called, or without one
    `job_retry_requested` is sent; either may refuse the retry by raising JobRefused."""
    if not _may_act(job, user):
        raise JobRefused("Only the owner or staff can retry this job.")
    with transaction.atomic():
        job = type(job).objects.select_for_update().get(pk=job.pk)
        if job.status in (JobStatus.QUEUED, JobStatus.PENDING):
            return
        if job.status not in RETRYABLE_STATUSES:
            raise JobRefused(f"Only failed or cancelled jobs can be retried; this one is "
                             f"{job.get_status_display().lower()}.")
        refusal = job.job_retry_refusal()
        if refusal:
            raise JobRefused(refusal)
        if before is not None:
            before()
        else:
            job_retry_requested.send(sender=type(job), job=job, user=user)
        job.job_reset_for_retry()
        type(job).objects.filter(pk=job.pk).update(attempts=0)
        job_enqueue(job)


# --- running -----------------------------------------------------------------------------------

def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# The claim token of the execution this process runs, per job: job_progress, job_unit_write
# and the heartbeat condition every write on it, whatever copy of the job row the work holds.
_tokens: dict[tuple[str, int], str] = {}
_tokens_lock = threading.Lock()


def _key(model: type[Job], pk: int) -> tuple[str, int]:
    return (model._meta.label, int(pk))


def _token(job: Job) -> str:
    with _tokens_lock:
        return _tokens.get(_key(type(job), job.pk), "\0none")  # matches no row: a write outside an execution fails


def _mine(job: Job) -> QuerySet:
    """The job's row while this process's execution still owns it and it is RUNNING."""
    return type(job).objects.filter(pk=job.pk, status=JobStatus.RUNNING, claim_token=_token(job))


def job_claim(model: type[J], pk: int) -> J | None:
    """PENDING or QUEUED -> RUNNING with a new claim token, by a conditional UPDATE; None when
    another delivery got it first or the job is not waiting (cancelled, failed, finished,
    already running). JobDeferred when it is waiting but an earlier execution still holds it
    (token set, heartbeat fresher than RUN_STALE_SECONDS), or the database refused."""
    now = timezone.now()
    free = Q(claim_token="") | Q(heartbeat_at__isnull=True) | Q(
        heartbeat_at__lt=now - timedelta(seconds=settings.RUN_STALE_SECONDS))
    token = secrets.token_hex(16)
    try:
        claimed = model.objects.filter(free, pk=pk, status__in=[JobStatus.PENDING, JobStatus.QUEUED]).update(
            status=JobStatus.RUNNING, heartbeat_at=now, worker=worker_id(), attempts=F("attempts") + 1, error="",
            claim_token=token)
        if not claimed:
            if model.objects.filter(pk=pk, status__in=[JobStatus.PENDING, JobStatus.QUEUED]).exists():
                raise JobDeferred(f"{model.job_type} {pk}: an earlier execution has not stopped yet")
            return None
        model.objects.filter(pk=pk, started_at__isnull=True).update(started_at=now)
        job = model.objects.get(pk=pk)
    except DatabaseError as exc:
        connection.close()
        raise JobDeferred(f"{model.job_type} {pk}: the database refused the claim ({exc})") from exc
    with _tokens_lock:
        _tokens[_key(model, pk)] = token
    return job


# What to call when this process's execution of a job is told to stop (cancelled, retried or
# taken over): the heartbeat thread notices within RUN_HEARTBEAT_SECONDS and calls them once.
_on_stop: dict[tuple[str, int], list[Callable[[], None]]] = {}


def job_on_stop(job: Job, callback: Callable[[], None]) -> None:
    """Have `callback()` called (from the heartbeat thread, once) as soon as this execution of
    `job` is no longer RUNNING under its claim: e.g. cancel the LLM backend, so requests waiting
    on a hung endpoint end and the worker is free within a beat instead of at the next chunk.
    It must be quick and thread-safe; it is forgotten when the execution ends."""
    with _tokens_lock:
        _on_stop.setdefault(_key(type(job), job.pk), []).append(callback)


def _stop_requested(model: type[Job], pk: int) -> None:
    with _tokens_lock:
        callbacks = _on_stop.pop(_key(model, pk), [])
    for callback in callbacks:
        try:
            callback()
        except Exception:  # noqa: BLE001 (a stop hook must not kill the heartbeat)
            log.exception("%s %s: stop callback failed", model.job_type, pk)


def _release(model: type[Job], pk: int) -> None:
    """The execution this process ran has stopped: clear its token (so a waiting retry may
    start at once) and forget it."""
    with _tokens_lock:
        token = _tokens.pop(_key(model, pk), None)
        _on_stop.pop(_key(model, pk), None)
    if token:
        try:
            model.objects.filter(pk=pk, claim_token=token).update(claim_token="")
        except DatabaseError:  # the heartbeat stops anyway: the token goes stale
            log.warning("%s %s: claim token not released", model.job_type, pk)


def job_progress(job: Job, done: int, total: int | None = None) -> None:
    """Record progress (units done, optionally the total) and touch the heartbeat. Raises
    JobStopped when this execution no longer owns the job, so the work stops between units."""
    fields: dict[str, Any] = {"progress_done": done, "heartbeat_at": timezone.now()}
    if total is not None:
        fields["progress_total"] = total
    if not _mine(job).update(**fields):
        raise JobStopped(job.pk)
    job.progress_done = done
    if total is not None:
        job.progress_total = total


@contextmanager
def job_unit_write(job: Job) -> Iterator[None]:
    """A transaction for writing units of the job, entered only while this execution still
    owns it: the job's row is locked first (SELECT ... FOR UPDATE), so a cancel, retry or sweep
    waits for the write to commit and every later write of this execution raises JobStopped.
    Every unit a job's work stores goes through here (fencing)."""
    with transaction.atomic():
        if not list(_mine(job).select_for_update().values_list("pk", flat=True)):
            raise JobStopped(job.pk)
        yield


class _Heartbeat:
    """Touches the job's heartbeat from a background thread while it works, so a long model
    load or a slow batch does not look like a dead worker."""

    def __init__(self, model: type[Job], pk: int, token: str):
        self.model, self.pk, self.token = model, pk, token
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
                    # Any status: a cancelled execution that has not stopped yet stays visibly alive,
                    # so a retry waits for it instead of running beside it.
                    now = timezone.now()
                    if not self.model.objects.filter(pk=self.pk, claim_token=self.token,
                                                     status=JobStatus.RUNNING).update(heartbeat_at=now):
                        self.model.objects.filter(pk=self.pk, claim_token=self.token).update(heartbeat_at=now)
                        _stop_requested(self.model, self.pk)  # cancelled or taken over: stop hooks run
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


def server_roots() -> list[tuple[str, str]]:
    """[(absolute folder, its name)] of every server folder a message may spell out, longest
    first: the models root, the data root, the var folder, the code's folder and the Hugging
    Face cache as <models>, <data>, <var>, <app>, <hf-cache>, each as configured (the setting,
    and the MODELS_ROOT / DATA_ROOT environment value as given) and as resolved (a root that is
    a symlink is reached under both names); the interpreter's site-packages as <site-packages>
    and its prefixes and standard library as <python>."""
    import site
    import sys
    import sysconfig

    from huggingface_hub import constants as hub

    named = [("models", settings.MODELS_ROOT), ("models", os.environ.get("MODELS_ROOT", "")),
             ("data", settings.DATA_ROOT), ("data", os.environ.get("DATA_ROOT", "")), ("var", settings.VAR_DIR),
             ("app", settings.BASE_DIR), ("hf-cache", hub.HF_HUB_CACHE)]
    try:
        packages = [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site.py lacks them
        packages = []
    paths = sysconfig.get_paths()
    named += [("site-packages", p) for p in (*packages, paths.get("purelib"), paths.get("platlib"))]
    named += [("python", p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, paths.get("stdlib"),
                                      paths.get("platstdlib"))]
    roots: dict[str, str] = {}
    for name, root in named:
        if not root or not os.path.isabs(str(root)):
            continue
        for form in (os.path.normpath(str(root)), os.path.realpath(str(root))):
            if form.rstrip("/"):  # never the filesystem root itself
                roots.setdefault(form.rstrip("/"), f"<{name}>")
    return sorted(roots.items(), key=lambda r: len(r[0]), reverse=True)


def redact_server_paths(text: str) -> str:
    """`text` with the server's own folders named instead of spelled out (`server_roots`: the
    models, data, var, code and Hugging Face cache folders, configured and resolved, the
    interpreter's site-packages and prefixes), the longest first, so <models> wins inside
    <var>. A job's failure reason is public once its submission is published, its log tail and
    a submission's refusal go to the submitter: none should map the worker's disk. A folder
    counts only as a whole path: not preceded by a name character (so ".../huggingface.co/models"
    and "host:8000/approve" stay as they are) and followed by "/" or the end of the path.
    E.g. "/srv/prbench/var/models/alice-rm/config.json" -> "<models>/alice-rm/config.json"."""
    for root, name in server_roots():
        text = re.sub(rf"(?<![\w.~-]){re.escape(root)}(?![\w.~-])", name, text)
    return text


def job_execute(model: type[J], pk: int, work: Callable[[J], dict | None], *,
                expected: tuple[type[BaseException], ...] = ()) -> str:
    """Claim the job, run `work(job)` under a heartbeat and record the outcome. Returns the
    job's final status (or its current one when this delivery had nothing to do).

    `work` returns the fields to store with SUCCEEDED ({} for none), or None when it stopped
    without finishing and the status it set stands. An exception fails the job with a
    readable reason (`expected` errors by their message alone) and the traceback's tail.
    Every outcome is written only while this execution still owns the job (its claim token):
    one that was cancelled, retried or taken over meanwhile changes nothing.
    JobDeferred (from job_claim) when the job cannot start now; the task retries it."""
    job = job_claim(model, pk)
    if job is None:
        status = model.objects.filter(pk=pk).values_list("status", flat=True).first()
        log.info("%s %s is %s; this delivery has nothing to do", model.job_type, pk, status)
        return status or "MISSING"
    try:
        return _run_claimed(model, job, work, expected)
    finally:
        _release(model, pk)


def _run_claimed(model: type[J], job: J, work: Callable[[J], dict | None],
                 expected: tuple[type[BaseException], ...]) -> str:
    pk = job.pk
    try:
        with _Heartbeat(model, pk, _token(job)):
            fields = work(job)
    except JobStopped:
        fields = None
    except BaseException as exc:
        progress = model.objects.values_list("progress_done", "progress_total").get(pk=pk)
        reason = readable_reason(exc, expected, progress=progress)
        _mine(job).update(
            status=JobStatus.FAILED, error=redact_server_paths(reason)[:4000],
            log_tail=redact_server_paths(traceback.format_exc())[-4000:], finished_at=timezone.now())
        log.warning("%s %s failed: %s", model.job_type, pk, reason)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return model.objects.values_list("status", flat=True).get(pk=pk)
    if fields is not None:
        _mine(job).update(status=JobStatus.SUCCEEDED, finished_at=timezone.now(), **fields)
    return model.objects.values_list("status", flat=True).get(pk=pk)


def job_fail(job: Job, reason: str) -> None:
    """Fail a RUNNING job from inside its work with a reason that is not an exception
    (e.g. some units failed and wait for a retry); only while this execution owns it."""
    _mine(job).update(status=JobStatus.FAILED, error=redact_server_paths(reason)[:4000], finished_at=timezone.now())
    raise JobStopped(job.pk)


# --- recovery ----------------------------------------------------------------------------------

def jobs_recover_stale(*, stale_after: timedelta | None = None,
                       resend_after: timedelta | None = None) -> list[tuple[str, int]]:
    """The sweep, which owns every state a worker may leave behind. Returns the (type, id)
    pairs re-queued or sent again.

    - RUNNING with no heartbeat for RUN_STALE_SECONDS (worker killed, lost power, OOM, or a
      database pause it could not beat through): QUEUED and sent again; after RUN_MAX_ATTEMPTS
      claims, FAILED instead of looping forever. If the old execution is in fact alive, its
      next write finds a new claim token and it stops without writing.
    - QUEUED whose message was sent more than RUN_RESEND_SECONDS ago (or never: the broker
      was down) and that no worker claimed: sent again. The broker may have lost it (Redis
      restarted without persistence), or its delivery was acknowledged without a claim. A
      second message for a job is harmless: the claim decides who runs it.

    The broker alone cannot be trusted here: Redis redelivers an unacknowledged message only
    after its visibility timeout, and the filesystem transport loses it."""
    now = timezone.now()
    cutoff = now - (stale_after or timedelta(seconds=settings.RUN_STALE_SECONDS))
    resend_cutoff = now - (resend_after or timedelta(seconds=settings.RUN_RESEND_SECONDS))
    recovered = []
    for model in job_models():
        stale = model.objects.filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True),
                                     status=JobStatus.RUNNING)
        for job in stale:
            unchanged = model.objects.filter(pk=job.pk, status=JobStatus.RUNNING, heartbeat_at=job.heartbeat_at)
            if job.attempts >= settings.RUN_MAX_ATTEMPTS:
                unchanged.update(status=JobStatus.FAILED, finished_at=timezone.now(),
                                 error=f"The worker running this was lost {job.attempts} times; giving up.")
                continue
            try:
                with transaction.atomic():
                    if unchanged.update(status=JobStatus.QUEUED):  # only if nobody touched it since we read it
                        log.warning("%s %s: no heartbeat from %s since %s; re-queued", model.job_type, job.pk,
                                    job.worker, job.heartbeat_at)
                        job_enqueue(job)
                        recovered.append((model.job_type, job.pk))
            except JobNotSent:  # saved as QUEUED without sent_at: the next sweep sends it
                pass
        # Never sent (the broker was down): after a grace of one heartbeat period, so a job whose
        # creating transaction has just committed gets its own send first.
        never_sent = Q(sent_at__isnull=True, queued_at__lt=now - timedelta(seconds=settings.RUN_HEARTBEAT_SECONDS))
        unsent = model.objects.filter(Q(sent_at__lt=resend_cutoff) | never_sent, status=JobStatus.QUEUED)
        for pk, sent_at in unsent.values_list("pk", "sent_at"):
            # Claim the re-send (so two sweeps send once), then send; a failed send clears sent_at again.
            if model.objects.filter(pk=pk, status=JobStatus.QUEUED, sent_at=sent_at).update(sent_at=now):
                log.warning("%s %s: queued since %s and not claimed; task sent again", model.job_type, pk,
                            sent_at or "a send that failed")
                try:
                    _send(model, pk)
                except JobNotSent:
                    model.objects.filter(pk=pk, status=JobStatus.QUEUED).update(sent_at=None)
                    continue
                recovered.append((model.job_type, pk))
    return recovered
