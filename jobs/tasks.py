"""The stale-job sweep (periodic, by Celery beat, and once when a worker starts), and
`job_task`, the decorator every kind's task is declared with."""

import logging
import time
from collections.abc import Callable

from celery import shared_task
from celery.exceptions import Reject
from celery.signals import worker_ready
from django.conf import settings

from . import services
from .models import Job

log = logging.getLogger(__name__)


def job_task(model: type[Job]) -> Callable[[Callable[[int], str]], object]:
    """Declare the Celery task that runs one job of `model` by id, under the name the model
    declares (`model.job_task`, the one place it is written; jobs/checks.py fails `manage.py
    check` when a kind's task is missing). `body(pk)` calls the kind's execute service. A delivery that cannot start the job now (services.JobDeferred: the database
    refused the claim, or an earlier execution of the job has not stopped yet) is not
    acknowledged: after a pause of RUN_HEARTBEAT_SECONDS its message goes back to the queue
    and is delivered again, instead of being acknowledged with the job left QUEUED."""

    def declare(body: Callable[[int], str]):
        @shared_task(name=model.job_task)
        def task(pk: int) -> str:
            try:
                return body(pk)
            except services.JobDeferred as exc:
                log.warning("%s; message handed back to the queue", exc)
                time.sleep(settings.RUN_HEARTBEAT_SECONDS)  # not a hot loop while the database is down
                raise Reject(str(exc), requeue=True) from None

        return task

    return declare


@shared_task(name="jobs.recover_stale")
def recover_stale() -> list[tuple[str, int]]:
    return services.jobs_recover_stale()


@worker_ready.connect
def recover_at_worker_start(sender=None, **kwargs):
    # A worker that starts after a crash should not wait for the next beat tick to pick up
    # the jobs its predecessor left RUNNING.
    try:
        recovered = services.jobs_recover_stale()
        if recovered:
            log.warning("re-queued stale jobs at worker start: %s", recovered)
    except Exception:  # never keep a worker from starting
        log.exception("stale-job sweep at worker start failed")
