"""Thin Celery tasks: take ids, call one service."""

import logging

from celery import shared_task
from celery.signals import worker_ready

from . import services

log = logging.getLogger(__name__)


@shared_task(name="gpu.leaderboard.evaluate_run")
def evaluate_run(run_id: int) -> str:
    return services.run_execute(run_id=run_id)


@shared_task(name="leaderboard.recover_stale_runs")
def recover_stale_runs() -> list[int]:
    return services.runs_recover_stale()


@worker_ready.connect
def recover_at_worker_start(sender=None, **kwargs):
    # A worker that starts after a crash should not wait for the next beat tick to
    # pick up the runs its predecessor left RUNNING.
    try:
        recovered = services.runs_recover_stale()
        if recovered:
            log.warning("re-queued stale runs at worker start: %s", recovered)
    except Exception:  # never keep a worker from starting
        log.exception("stale-run sweep at worker start failed")


@shared_task(name="gpu.leaderboard.best_of_n")
def best_of_n(run_id: int) -> str:
    return services.bon_run_execute(run_id=run_id)


@shared_task(name="gpu.leaderboard.ppo")
def ppo(run_id: int) -> str:
    return services.ppo_run_execute(run_id=run_id)
