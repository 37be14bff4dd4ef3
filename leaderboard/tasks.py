"""Thin Celery tasks: take ids, call one service. The stale-job sweep lives in jobs/tasks.py."""

from celery import shared_task

from . import services


@shared_task(name="gpu.leaderboard.evaluate_run")
def evaluate_run(run_id: int) -> str:
    return services.run_execute(run_id=run_id)


@shared_task(name="gpu.leaderboard.best_of_n")
def best_of_n(run_id: int) -> str:
    return services.bon_run_execute(run_id=run_id)


@shared_task(name="gpu.leaderboard.ppo")
def ppo(run_id: int) -> str:
    return services.ppo_run_execute(run_id=run_id)
