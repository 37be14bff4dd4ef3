"""A task sent through the configured broker runs in a real worker process (under CI:
Redis and PostgreSQL; locally without environment: the filesystem broker and SQLite)."""

from django.conf import settings

from pipeline.models import Benchmark
from pipeline.tasks import compute_benchmark_stats
from prbench.celery import app
from tests.conftest import wait_for
from tests.factories import BenchmarkFactory, BenchmarkItemFactory


def test_the_celery_app_uses_the_configured_broker():
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_soft_time_limit < app.conf.task_time_limit
    assert {q.name for q in app.conf.task_queues} == {"default", "gpu"}


def test_a_worker_process_computes_benchmark_stats_sent_through_the_broker(celery_worker_process):
    benchmark = BenchmarkFactory()
    BenchmarkItemFactory.create_batch(3, benchmark=benchmark, chosen="one two three four", rejected="one two")
    BenchmarkItemFactory(benchmark=benchmark, domain="society_culture", category="Society_and_Culture")
    assert benchmark.stats is None

    compute_benchmark_stats.delay(benchmark.pk)

    stats = wait_for(lambda: Benchmark.objects.get(pk=benchmark.pk).stats, timeout=120,
                     worker=celery_worker_process, what="the worker to store benchmark stats")
    assert stats["overall"]["items"] == 4
    assert stats["by_domain"]["arts_entertainment"]["mean_length_ratio"] == 2.0
    assert stats["by_domain"]["society_culture"]["items"] == 1
