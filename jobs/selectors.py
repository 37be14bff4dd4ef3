"""Reads for the Jobs page and GET /api/jobs/."""

from __future__ import annotations

from typing import Any

from .models import ACTIVE_STATUSES, RETRYABLE_STATUSES, Job, JobStatus
from .services import JobRefused, job_model, job_models, jobs_visible_to

PER_TYPE_LIMIT = 200


def jobs_list(*, user, job_type: str = "", status: str = "") -> list[Job]:
    """The user's jobs of every kind (staff: everyone's), newest first, at most
    PER_TYPE_LIMIT per kind. JobRefused for an unknown type or status."""
    if status and status not in JobStatus.values:
        raise JobRefused(f"no status '{status}' (statuses: {', '.join(JobStatus.values)})")
    models = [job_model(job_type)] if job_type else job_models()
    found: list[Job] = []
    for model in models:
        qs = jobs_visible_to(model, user).select_related(*model.job_related)
        if status:
            qs = qs.filter(status=status)
        found.extend(qs.order_by("-created_at")[:PER_TYPE_LIMIT])
    return sorted(found, key=lambda j: j.created_at, reverse=True)


def job_as_dict(job: Job, *, user=None) -> dict[str, Any]:
    """The shape of one job in GET /api/jobs/: type, id, title, status, progress {done, total,
    percent}, attempts, reason (also as `error`, the name runs use in /api/submissions/), worker
    (the host and process that ran it last; staff only, "" for everyone else: a worker's
    identity maps the operator's machines), times (ISO 8601), url, and the actions allowed."""
    base = f"/api/jobs/{job.job_type}/{job.pk}"
    return {
        "type": job.job_type, "id": job.pk, "title": job.job_title(), "status": job.status,
        "progress": {"done": job.progress_done, "total": job.progress_total, "percent": job.progress_percent},
        "attempts": job.attempts, "reason": job.error, "error": job.error,
        "worker": job.worker if user is not None and user.is_staff else "",
        "created_at": _iso(job.created_at), "queued_at": _iso(job.queued_at), "started_at": _iso(job.started_at),
        "heartbeat_at": _iso(job.heartbeat_at), "finished_at": _iso(job.finished_at),
        "url": job.job_url(), "can_cancel": job.status in ACTIVE_STATUSES,
        "can_retry": job.status in RETRYABLE_STATUSES, "cancel_url": f"{base}/cancel/", "retry_url": f"{base}/retry/",
    }


def _iso(value) -> str | None:
    return value.isoformat() if value else None
