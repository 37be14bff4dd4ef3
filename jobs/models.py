"""One lifecycle for every kind of long work (evaluation runs, builds, policy sample sets,
Best-of-N runs, PPO runs).

Each kind is its own table inheriting the abstract `Job`: the kinds keep their own foreign
keys, unique keys and per-unit result tables (pairs, build items, samples, judged picks,
answers), while the lifecycle columns and every transition between them are shared
(`jobs/services.py`). Subclasses declare three things as class attributes:

    job_type   short name used in URLs and the API ("evaluation", "build", ...)
    job_task   Celery task name that runs one job, called with its id
    job_owner  lookup path to the owning user ("submission__owner"), or "" for staff-only kinds
    job_related  relations job_title/job_url read (select_related), optional

and may override `job_title`, `job_url`, `job_retry_refusal` and `job_reset_for_retry`.
"""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


ACTIVE_STATUSES = (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING)
RETRYABLE_STATUSES = (JobStatus.FAILED, JobStatus.CANCELLED)


class Job(models.Model):
    """The lifecycle columns: PENDING -> QUEUED -> RUNNING (heartbeat, progress) ->
    SUCCEEDED | FAILED | CANCELLED, with FAILED/CANCELLED -> QUEUED on retry and a stale
    RUNNING -> QUEUED by the sweep (at most RUN_MAX_ATTEMPTS claims).

    `claim_token` fences one execution: each claim writes a new token, and every write an
    execution makes (progress, units, its outcome) is conditioned on it, so a worker whose job
    was cancelled, retried or handed to another worker writes nothing more. The execution
    clears it when it stops; while it is set and the heartbeat is fresh, no other claim starts.
    `sent_at` is when the job's task message was last sent: a QUEUED job nobody claimed within
    RUN_RESEND_SECONDS of it is sent again by the sweep (the message may be lost)."""

    job_type: str = ""
    job_task: str = ""
    job_owner: str = ""
    job_related: tuple[str, ...] = ()  # select_related for job_title / job_url

    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    claim_token = models.CharField(max_length=32, blank=True, default="",
                                   help_text="The running execution's token (empty when none runs).")
    sent_at = models.DateTimeField(null=True, blank=True, help_text="When the task message was last sent.")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="Times a worker claimed this job.")
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    @property
    def progress_percent(self) -> int:
        return min(100, int(100 * self.progress_done / self.progress_total)) if self.progress_total else 0

    def job_title(self) -> str:
        return str(self)

    def job_url(self) -> str:
        """A page with this job's details; empty when the Jobs page is the only one."""
        return ""

    def job_retry_refusal(self) -> str:
        """Why this job may not be retried now (empty: it may)."""
        return ""

    def job_reset_for_retry(self) -> None:
        """Undo what made the last attempt fail, before the job is queued again."""
