"""Thin Celery tasks: take ids, call one service. The stale-job sweep lives in jobs/tasks.py."""

from jobs.tasks import job_task

from . import services


@job_task("gpu.leaderboard.evaluate_run")
def evaluate_run(run_id: int) -> str:
    return services.run_execute(run_id=run_id)


@job_task("gpu.leaderboard.best_of_n")
def best_of_n(run_id: int) -> str:
    return services.bon_run_execute(run_id=run_id)


@job_task("gpu.leaderboard.ppo")
def ppo(run_id: int) -> str:
    return services.ppo_run_execute(run_id=run_id)
