"""Thin Celery tasks: take ids, call one service. The stale-job sweep lives in jobs/tasks.py."""

from jobs.tasks import job_task

from . import services
from .models import BestOfNRun, EvaluationRun, PPORun


@job_task(EvaluationRun)
def evaluate_run(run_id: int) -> str:
    return services.run_execute(run_id=run_id)


@job_task(BestOfNRun)
def best_of_n(run_id: int) -> str:
    return services.bon_run_execute(run_id=run_id)


@job_task(PPORun)
def ppo(run_id: int) -> str:
    return services.ppo_run_execute(run_id=run_id)
