"""The Jobs page: every long job the user may see, with live status and cancel/retry."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from . import selectors, services
from .models import JobStatus


@login_required
def job_list(request):
    """The Jobs page, filterable by ?type=, ?status= and (staff) ?owner=; an unknown type or
    status is a 400 naming the known ones."""
    chosen = {key: request.GET.get(key, "").strip() for key in ("type", "status", "owner")}
    try:
        jobs = selectors.jobs_list(user=request.user, job_type=chosen["type"], status=chosen["status"],
                                   owner=chosen["owner"])
    except services.JobRefused as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    return render(request, "jobs/jobs.html", {
        "jobs": [{**row, "duration_text": selectors.duration_text(row["duration_seconds"]), "started": job.started_at}
                 for job, row in ((j, selectors.job_as_dict(j, user=request.user)) for j in jobs)],
        "chosen": chosen,
        "types": [model.job_type for model in services.job_models()], "statuses": JobStatus.values,
        "filtered": any(chosen.values())})


@require_POST
@login_required
def job_action(request, job_type: str, pk: int, action: str):
    try:
        job = services.job_act(user=request.user, job_type=job_type, pk=pk, action=action)
    except services.JobNotFound:
        raise Http404 from None
    except services.JobRefused as exc:
        messages.error(request, str(exc))
    else:
        done = "Cancelled" if action == "cancel" else "Queued again"
        messages.success(request, f"{done}: {job.job_title()}.")
    return redirect("jobs:list")
