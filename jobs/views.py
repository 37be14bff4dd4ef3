"""The Jobs page: every long job the user may see, with live status and cancel/retry."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from . import selectors, services


@login_required
def job_list(request):
    jobs = selectors.jobs_list(user=request.user)
    return render(request, "jobs/jobs.html", {"jobs": [selectors.job_as_dict(j) for j in jobs]})


@require_POST
@login_required
def job_action(request, job_type: str, pk: int, action: str):
    try:
        job = selectors.job_get(user=request.user, job_type=job_type, pk=pk)
    except services.JobRefused:
        job = None
    if job is None:
        raise Http404
    try:
        if action == "cancel":
            if not services.job_cancel(user=request.user, job=job):
                raise services.JobRefused(f"Only unfinished jobs can be cancelled; this one is {job.status}.")
            messages.success(request, f"Cancelled: {job.job_title()}.")
        else:
            services.job_retry(user=request.user, job=job)
            messages.success(request, f"Queued again: {job.job_title()}.")
    except services.JobRefused as exc:
        messages.error(request, str(exc))
    return redirect("jobs:list")
