"""The stale-job sweep: periodic (Celery beat) and once when a worker starts."""

import logging

from celery import shared_task
from celery.signals import worker_ready

from . import services

log = logging.getLogger(__name__)


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
