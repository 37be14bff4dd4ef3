"""System checks of the job lifecycle (run by `manage.py check`, `migrate` and the test suite)."""

from importlib import import_module

from celery import current_app
from django.core import checks

from .services import job_models


@checks.register("jobs")
def job_tasks_registered(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """jobs.E001 for every kind of job whose Celery task (`job_task`, declared in its app's
    tasks.py with jobs.tasks.job_task) is not registered: enqueuing such a job would send a
    message no worker can run."""
    errors = []
    for model in job_models():
        try:
            import_module(f"{model._meta.app_config.name}.tasks")
        except ImportError:
            pass  # reported below: nothing registered the task
        if not model.job_task or model.job_task not in current_app.tasks:
            errors.append(checks.Error(
                f"the job kind {model.job_type!r} ({model.__name__}) has no registered Celery task "
                f"{model.job_task!r}", hint=f"declare it in {model._meta.app_config.name}/tasks.py with "
                f"@job_task({model.__name__})", obj=model, id="jobs.E001"))
    return errors
