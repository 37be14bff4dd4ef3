"""Admin pieces every kind of job shares: the lifecycle columns shown read-only, and an
action that queues the selected jobs through jobs.services (never a task directly)."""

from django.contrib import admin, messages

from .services import JobNotSent, JobRefused, job_enqueue

LIFECYCLE_FIELDS = ("status", "progress_done", "progress_total", "attempts", "heartbeat_at", "worker", "error",
                    "log_tail", "queued_at", "started_at", "finished_at", "created_at")


def enqueue_action(description: str):
    """An admin action queueing each selected job (running ones are refused and reported, and
    so is a job queued while the broker is down)."""

    @admin.action(description=description)
    def enqueue(model_admin, request, queryset):
        queued, refused = 0, []
        for job in queryset:
            try:
                job_enqueue(job)
                queued += 1
            except JobNotSent as exc:  # queued all the same: the sweep sends it once the broker is back
                queued += 1
                refused.append(str(exc))
            except JobRefused as exc:
                refused.append(str(exc))
        model_admin.message_user(request, f"Queued {queued} job(s).", messages.SUCCESS)
        for reason in refused:
            model_admin.message_user(request, reason, messages.WARNING)

    return enqueue
