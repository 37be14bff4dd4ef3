"""Reads for the Jobs page and GET /api/jobs/."""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, F, Value
from django.utils import timezone

from .models import ACTIVE_STATUSES, RETRYABLE_STATUSES, Job, JobStatus
from .services import JobRefused, job_model, job_models, jobs_visible_to

PER_TYPE_LIMIT = 200


def jobs_list(*, user, job_type: str = "", status: str = "", owner: str = "") -> list[Job]:
    """The user's jobs of every kind (staff: everyone's), newest first, at most
    PER_TYPE_LIMIT per kind; `owner` (a username) keeps the jobs of that user's submissions
    (kinds without an owner, staff's builds and sample sets, then have none). Each job carries
    `owner_name`: the owning user's username, "" for kinds without an owner. JobRefused for an
    unknown type or status."""
    if status and status not in JobStatus.values:
        raise JobRefused(f"no status '{status}' (statuses: {', '.join(JobStatus.values)})")
    models = [job_model(job_type)] if job_type else job_models()
    found: list[Job] = []
    for model in models:
        if owner and not model.job_owner:
            continue
        qs = jobs_visible_to(model, user).select_related(*model.job_related).annotate(
            owner_name=F(f"{model.job_owner}__username") if model.job_owner else Value("", output_field=CharField()))
        if status:
            qs = qs.filter(status=status)
        if owner:
            qs = qs.filter(**{f"{model.job_owner}__username": owner})
        found.extend(qs.order_by("-created_at")[:PER_TYPE_LIMIT])
    return sorted(found, key=lambda j: j.created_at, reverse=True)


def job_as_dict(job: Job, *, user=None) -> dict[str, Any]:
    """The shape of one job in GET /api/jobs/: type, id, title, status, progress {done, total,
    percent}, attempts, reason (also as `error`, the name runs use in /api/submissions/), worker
    (the host and process that ran it last; staff only, "" for everyone else: a worker's
    identity maps the operator's machines), owner (the owning user's username; "" for kinds
    without an owner), times (ISO 8601), duration_seconds (from start to finish, or to now while
    it runs; None before it starts), url, and the actions allowed."""
    base = f"/api/jobs/{job.job_type}/{job.pk}"
    return {
        "type": job.job_type, "id": job.pk, "title": job.job_title(), "status": job.status,
        "progress": {"done": job.progress_done, "total": job.progress_total, "percent": job.progress_percent},
        "attempts": job.attempts, "reason": job.error, "error": job.error,
        "worker": job.worker if user is not None and user.is_staff else "",
        "owner": getattr(job, "owner_name", None) or "", "duration_seconds": duration_seconds(job),
        "created_at": _iso(job.created_at), "queued_at": _iso(job.queued_at), "started_at": _iso(job.started_at),
        "heartbeat_at": _iso(job.heartbeat_at), "finished_at": _iso(job.finished_at),
        "url": job.job_url(), "can_cancel": job.status in ACTIVE_STATUSES,
        "can_retry": job.status in RETRYABLE_STATUSES, "cancel_url": f"{base}/cancel/", "retry_url": f"{base}/retry/",
    }


def duration_seconds(job: Job) -> float | None:
    """Seconds from the job's start to its finish (to now while it runs); None before it starts."""
    if job.started_at is None:
        return None
    end = job.finished_at or (timezone.now() if job.status == JobStatus.RUNNING else None)
    return round((end - job.started_at).total_seconds(), 1) if end else None


def duration_text(seconds: float | None) -> str:
    """A duration as people read it: "45 s", "3 min 05 s", "2 h 04 min"; "" for None."""
    if seconds is None:
        return ""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _iso(value) -> str | None:
    return value.isoformat() if value else None
