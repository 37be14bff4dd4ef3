"""Template context of the job lifecycle."""

from .models import ACTIVE_STATUSES


def job_statuses(request):
    """``job_active_statuses``: the statuses of a job that is still to finish (PENDING, QUEUED,
    RUNNING), the one list templates test against (``{% if run.status in job_active_statuses %}``)
    and base.html hands to scripts (``<body data-active-statuses>``, read by ``window.jobIsActive``)."""
    return {"job_active_statuses": [str(s) for s in ACTIVE_STATUSES]}
