"""Thin Celery tasks: take ids, call one service."""

from celery import shared_task

from jobs.tasks import job_task

from .models import Benchmark, BuildRun, PolicySampleSet
from .services import benchmark_compute_stats


@shared_task(name="pipeline.compute_benchmark_stats")
def compute_benchmark_stats(benchmark_id: int) -> None:
    benchmark = Benchmark.objects.filter(pk=benchmark_id).first()
    if benchmark is not None:  # deleted since it was queued: nothing to do
        benchmark_compute_stats(benchmark=benchmark)


@job_task(BuildRun)
def run_build(build_id: int) -> str:
    from .build import build_execute

    return build_execute(build_id=build_id)


@job_task(PolicySampleSet)
def sample_policy(sample_set_id: int) -> str:
    from .downstream import samples_execute

    return samples_execute(sample_set_id=sample_set_id)
