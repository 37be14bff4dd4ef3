"""Data migrations of the annotation app, run forward and back on the real test database."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("annotation", "0004_areaa_one_live_lease")
AFTER = ("annotation", "0005_campaign_report_cache_table")


def migrate(target: tuple[str, str]):
    """Migrate the annotation app to `target`; the app registry of that state (every other app
    at its latest migration, as the database is)."""
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    executor.loader.build_graph()
    others = [node for node in executor.loader.graph.leaf_nodes() if node[0] != target[0]]
    return executor.loader.project_state([*others, target]).apps


@pytest.mark.django_db(transaction=True)
def test_0005_moves_each_cached_report_to_its_own_table_and_back():
    try:
        apps = migrate(BEFORE)
        Benchmark = apps.get_model("pipeline", "Benchmark")
        Campaign = apps.get_model("annotation", "Campaign")
        benchmark = Benchmark.objects.create(name="migrated")
        cached = Campaign.objects.create(name="cached", benchmark=benchmark, guidelines="g", report_key="a" * 64,
                                         report_cache={"n_pairs": 3, "headline": {"agreement": 0.5}})
        never = Campaign.objects.create(name="never viewed", benchmark=benchmark, guidelines="g")
        # Neither of these could ever be a cache hit (no key equals "", and no cache reads as a miss).
        no_key = Campaign.objects.create(name="no key", benchmark=benchmark, guidelines="g",
                                         report_cache={"n_pairs": 1})
        no_cache = Campaign.objects.create(name="no cache", benchmark=benchmark, guidelines="g", report_key="b" * 64)

        apps = migrate(AFTER)
        Cache = apps.get_model("annotation", "CampaignReportCache")
        assert list(Cache.objects.values_list("campaign_id", "key", "statistics")) == [
            (cached.pk, "a" * 64, {"n_pairs": 3, "headline": {"agreement": 0.5}})]
        columns = {f.column for f in apps.get_model("annotation", "Campaign")._meta.concrete_fields}
        assert columns.isdisjoint({"report_key", "report_cache"})

        apps = migrate(BEFORE)
        Campaign = apps.get_model("annotation", "Campaign")
        assert Campaign.objects.get(pk=cached.pk).report_cache == {"n_pairs": 3, "headline": {"agreement": 0.5}}
        assert Campaign.objects.get(pk=cached.pk).report_key == "a" * 64
        assert Campaign.objects.get(pk=never.pk).report_cache is None
        assert [Campaign.objects.filter(pk=c.pk).values_list("report_key", "report_cache").get()
                for c in (no_key, no_cache)] == [("", None), ("", None)]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
