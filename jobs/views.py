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
    return render(request, "jobs/jobs.html", {"jobs": [selectors.job_as_dict(j, user=request.user) for j in jobs]})


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
