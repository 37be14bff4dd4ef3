"""Per-request CPU of the annotation API (`next`, then a rating submit), in one process through
Django's test client: what a request costs the web process, whatever else the machine runs.

Writes to the database DATABASE_URL names (migrates it, imports a 400-pair benchmark once,
creates a campaign, a staff user and an annotator per run): give it a scratch database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/SCRATCH \\
        .venv/bin/python benchmarks/profile_annotation.py [--cycles 40] [--profile] [--pairs 400]
        [--rated-first N]

--rated-first N: the annotator first rates N pairs (untimed) and the campaign's report is opened
once (as staff watching it do), so its statistics are cached, before the timed cycles.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import ROOT, make_benchmark, text_of  # noqa: E402

sys.path.insert(0, str(ROOT))
RATINGS = {k: 3 for k in ("factuality", "relevance", "helpfulness", "personal_rubrics")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--profile", action="store_true", help="also print cProfile (CPU clock) of the cycles")
    parser.add_argument("--pairs", type=int, default=400, help="pairs in the benchmark (default 400)")
    parser.add_argument("--rated-first", type=int, default=0, metavar="N",
                        help="rate N pairs and open the campaign's report before timing")
    parser.add_argument("--sort", default="cumulative", help="--profile's sort key (pstats), default cumulative")
    parser.add_argument("--guidelines-chars", type=int, default=1, metavar="N",
                        help="the campaign's guidelines, N characters of markdown (default 1)")
    parser.add_argument("--narrative-chars", type=int, default=1, metavar="N",
                        help="each pair's narrative (the answer key), N characters (default 1)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "prbench.settings")
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from annotation.services.campaigns import campaign_create
    from pipeline.models import Benchmark
    from pipeline.services import benchmark_import
    from prbench.warmup import warm_up

    call_command("migrate", verbosity=0)
    warm_up()
    tag = str(time.time_ns())
    prefix = f"annbench{args.pairs}n{args.narrative_chars}-"
    existing = Benchmark.objects.filter(name__startswith=prefix).first()
    if existing is None:
        with tempfile.TemporaryDirectory() as tmp:
            make_benchmark(Path(tmp) / "bench.jsonl", args.pairs, narrative_chars=args.narrative_chars)
            existing = benchmark_import(path=Path(tmp) / "bench.jsonl", name=f"{prefix}{tag}").benchmark
    staff = User.objects.create(username=f"staff{tag}", is_staff=True)
    campaign = campaign_create(user=staff, benchmark=existing.name, overlap=1,
                               guidelines=text_of(args.guidelines_chars, "Rate each answer on its own. "))
    user = User.objects.create(username=f"annotator{tag}")
    user.groups.add(Group.objects.get(name="annotator"))
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}", HTTP_HOST="127.0.0.1")

    def cycle() -> tuple[float, float]:
        start = time.process_time()
        response = client.get(f"/api/annotation/next/?campaign={campaign.pk}")
        middle = time.process_time()
        if response.status_code != 200:
            sys.exit(f"next gave {response.status_code}: {response.content[:200]!r}")
        body = {"assignment": response.json()["assignment"], "ratings": {"1": RATINGS, "2": RATINGS}, "seconds": 5}
        response = client.post("/api/annotation/ratings/", json.dumps(body), content_type="application/json")
        if response.status_code != 201:
            sys.exit(f"rating gave {response.status_code}: {response.content[:200]!r}")
        return middle - start, time.process_time() - middle

    for _ in range(5 + args.rated_first):
        cycle()
    if args.rated_first:
        from annotation.services.reports import campaign_report

        report = campaign_report(campaign=campaign)
        print(f"rated {args.rated_first + 5} pairs first; the cached report holds "
              f"{len(json.dumps({k: v for k, v in report.items() if k != 'campaign'})):,} bytes of JSON")
    read_before = _loopback_bytes()
    samples = [cycle() for _ in range(args.cycles)]
    read_per_cycle = (_loopback_bytes() - read_before) / args.cycles
    one, five, _ = os.getloadavg()
    print(f"CPU per request, median of {args.cycles}: next {statistics.median(s[0] for s in samples) * 1000:.2f} ms, "
          f"rating {statistics.median(s[1] for s in samples) * 1000:.2f} ms "
          f"(load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} CPUs); "
          f"{read_per_cycle / 1000:.1f} kB through loopback (the database's traffic) per cycle")
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(args.cycles):
            cycle()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(60)
        print(out.getvalue())


def _loopback_bytes() -> int:
    """Bytes through the loopback interface so far (psutil): with the database on this machine
    and the test client's requests kept in memory, nearly all of it the database's traffic, both
    ways (the queries and their rows); whatever else uses loopback meanwhile is counted too."""
    import psutil

    return psutil.net_io_counters(pernic=True)["lo"].bytes_recv


if __name__ == "__main__":
    main()
