"""Benchmark health page of a 3,000-pair benchmark with 20 published results, in one process.

A throwaway test database (Django's test-database creation: SQLite by default, PostgreSQL with
DATABASE_URL) gets a benchmark of `--pairs` pairs and `--results` published results in the
`profile` setting (60,000 stored per-pair outcomes by default; each result's chance of being
right follows a seeded item-response model: ability rising across results, a difficulty per
pair, 3% of pairs with the sign flipped so some pairs discriminate negatively). Then, through
Django's test client as a staff member, in the same process:

  1. the plain baselines: the benchmark's own page (its facts and the first 50 pairs), and reading
     every stored per-pair outcome of the 20 results (what the first computation must read);
  2. the health page's first visit (the report computed and cached);
  3. `--visits` later visits of the health page, the page filtered to flagged pairs, the API
     and the CSV: p50/p95, and each p50 against the benchmark page's (target: under 1 s);
  4. two visits as a fresh web process would make them (the report read from the shared cache,
     not from the process's memory);
  5. one verdict recorded on a pair, then the next visit (what it reads changed: recomputed).
Prints the machine's CPU count and load average with the figures.

    .venv/bin/python benchmarks/bench_health.py [--pairs 3000] [--results 20] [--visits 20]
    CACHE_URL=redis://127.0.0.1:6379/5 DATABASE_URL=postgres://... .venv/bin/python benchmarks/bench_health.py
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import load_average, machine  # noqa: E402


def populate(pairs: int, results: int, seed: int = 0):
    from django.contrib.auth.models import User

    from leaderboard.models import EvaluationRun, PairScore, RunStatus, Submission
    from pipeline.models import Benchmark, BenchmarkItem, Domain

    rng = random.Random(seed)
    staff = User.objects.create(username="staff", is_staff=True, is_superuser=True)
    bench = Benchmark.objects.create(name="bench-health", content_hash="b" * 64, item_count=pairs,
                                     metadata={"synthetic": True})
    domains = [Domain.ARTS, Domain.LIFESTYLE, Domain.SOCIETY]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    items = []
    for i in range(pairs):
        chosen = " ".join(rng.choice(words) for _ in range(rng.randint(90, 160)))
        rejected = " ".join(rng.choice(words) for _ in range(rng.randint(90, 160))) + " no"
        items.append(BenchmarkItem(benchmark=bench, position=i, source_id=f"q{i}", domain=domains[i % 3],
                                   category="c", question=f"Question {i}?", chosen=chosen, rejected=rejected))
    BenchmarkItem.objects.bulk_create(items, batch_size=1000)
    items = list(bench.items.order_by("position"))
    difficulty = [rng.gauss(0, 1) for _ in items]
    flipped = {i for i in range(pairs) if rng.random() < 0.03}
    for r in range(results):
        ability = -0.5 + 2.0 * r / max(results - 1, 1)
        submission = Submission.objects.create(owner=staff, display_name=f"RM {r:02d}", benchmark=bench,
                                               kind="scores", weights_hash=f"w{r}", published=True)
        run = EvaluationRun.objects.create(submission=submission, setting="profile", status=RunStatus.SUCCEEDED,
                                           fingerprint=f"f{r}")
        rows = []
        for i, item in enumerate(items):
            logit = 1.5 * (ability - difficulty[i]) * (-1 if i in flipped else 1)
            right = rng.random() < 1 / (1 + math.exp(-logit))
            rows.append(PairScore(run=run, item=item, chosen_score=1.0 if right else 0.0, rejected_score=0.5,
                                  correct=right))
        PairScore.objects.bulk_create(rows, batch_size=5000)
        accuracy = sum(row.correct for row in rows) / len(rows)
        EvaluationRun.objects.filter(pk=run.pk).update(metrics={
            "accuracy": accuracy, "n": len(rows), "ci_low": accuracy - 0.02, "ci_high": accuracy + 0.02,
            "tie_rate": 0.0, "by_domain": {}})
    return staff, bench


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--results", type=int, default=20)
    parser.add_argument("--visits", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="cProfile one later visit of the page and print "
                                                               "the 25 costliest functions")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "prbench.settings")
    os.environ["DEBUG"] = "0"  # no query log, templates as in production
    os.environ.setdefault("SECRET_KEY", "bench-health-not-secret")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    import django

    django.setup()
    from django.conf import settings
    from django.core.cache import cache
    from django.db import connection
    from django.test import Client

    from leaderboard.models import PairScore
    from pipeline.services import items_record_validation

    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # no collectstatic needed
    # No setup_test_environment(): its instrumented template rendering copies every context, which
    # a served page never does.
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        print(machine(), "|", load_average(), "|", connection.vendor, "|",
              settings.CACHES["default"]["BACKEND"].rsplit(".", 1)[-1])
        started = time.perf_counter()
        staff, bench = populate(args.pairs, args.results)
        print(f"{args.pairs:,} pairs, {args.results} published results "
              f"({args.pairs * args.results:,} stored outcomes) in {time.perf_counter() - started:.1f} s")
        client = Client()
        client.force_login(staff)
        url = f"/benchmarks/{bench.name}/health/"

        def get(path):
            def go():
                response = client.get(path, secure=True)
                assert response.status_code == 200, (path, response.status_code)
                if hasattr(response, "streaming_content"):
                    b"".join(response.streaming_content)
            return go

        cache.clear()
        leaderboard = [timed(get(f"/benchmarks/{bench.name}/")) for _ in range(args.visits)]
        run_ids = list(bench.submissions.values_list("runs__pk", flat=True))
        plain_read = [timed(lambda: list(PairScore.objects.filter(run_id__in=run_ids)
                                         .values_list("run_id", "item_id", "correct").iterator(chunk_size=10000)))
                      for _ in range(3)]
        first = timed(get(url))
        figures = {name: [timed(get(path)) for _ in range(args.visits)] for name, path in (
            ("health page", url), ("health page, flagged only", url + "?flag=any"),
            ("health API", f"/api/benchmarks/{bench.name}/health/"),
            ("health CSV", f"/benchmarks/{bench.name}/health.csv"))}
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(get(url))
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        from leaderboard.services import health as service

        service._MEMO.clear()  # as a fresh web process: the report comes from the shared cache
        from_cache = [timed(get(url))]
        service._MEMO.clear()
        from_cache.append(timed(get(url)))
        item = bench.items.order_by("position").first()
        items_record_validation(benchmark=bench, source="bench", verdicts={item.source_id: (False, ["bench"])})
        after_change = timed(get(url))
        again = timed(get(url))

        lb = statistics.median(leaderboard)
        read = statistics.median(plain_read)
        print(f"\nplain baselines: benchmark page p50 {lb * 1000:7.1f} ms; reading the "
              f"{args.pairs * args.results:,} stored outcomes p50 {read * 1000:7.1f} ms")
        print(f"health page, first visit (computed, cached): {first * 1000:8.1f} ms "
              f"({first / read:5.2f}x the plain read, {first / lb:5.2f}x the benchmark page)")
        for name, values in figures.items():
            p50, p95 = statistics.median(values), pct(values, 0.95)
            print(f"{name:28} later visits p50 {p50 * 1000:7.1f} ms  p95 {p95 * 1000:7.1f} ms  "
                  f"({p50 / lb:5.2f}x the benchmark page){'  UNDER 1 s' if p95 < 1 else '  OVER 1 s'}")
        print(f"health page in a fresh process (report unpickled from {settings.CACHES['default']['BACKEND'].rsplit('.', 1)[-1]}):"
              f" {', '.join(f'{v * 1000:.1f}' for v in from_cache)} ms")
        print(f"after a verdict was recorded: {after_change * 1000:8.1f} ms (recomputed), then {again * 1000:.1f} ms")
        print(load_average())
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
