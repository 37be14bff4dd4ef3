"""Annotation under load: gunicorn + PostgreSQL, annotators as threads on loopback.

Issue 14's targets, measured in one run on a throwaway database:
  1. paced: 20 annotators who pause about 0.5 s after each action (GET next, then POST
     rating): each starts after a random share of one pause and each pause lasts 0.8-1.2x its
     length (seeded per annotator), so they arrive as independent people do, sometimes
     together; --no-stagger starts all n at once with exact pauses, so they arrive in bursts of
     n. p50/p95 latency of each request (target: p95 < 100 ms);
  2. saturated: the same annotators without pauses: ratings stored per second (target >= 100),
     and the CPU seconds spent meanwhile by gunicorn, by PostgreSQL's backends and by this
     process (the load generator), out of CPUs x seconds: whether the server's CPU or the
     generator is the limit, and what a rating cost the server under contention;
  3. afterwards, from the database: no rating lost (ratings stored == 201 answers), no pair
     rated more often than the overlap, every pair's `taken` equal to its live leases plus
     ratings, at most one live lease per annotator;
  4. a plain baseline in the same run: the same threads calling /healthz/ (one trivial query);
  5. first of all, CPU per rating cycle (GET next + POST rating), one annotator, one request at
     a time, --cycles of them: gunicorn's processes and the database's backends, read from the
     process table (PostgreSQL on this machine). A figure that moves far less between runs than
     throughput does, and the ceiling it implies (CPUs / CPU per cycle, all of it for the server)
     is printed beside the saturated rate.
The server runs as in production (DEBUG off). The machine's CPU count and load average are
printed with the figures (the load generator shares the CPUs with the server).

    .venv/bin/python benchmarks/bench_annotation.py --annotators 20 --seconds 20
"""

import argparse
import json
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import cpu_seconds, machine_load, pct, request, serve  # noqa: E402

RATINGS = {k: 3 for k in ("factuality", "relevance", "helpfulness", "personal_rubrics")}

SETUP = r"""
import json, sys
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from annotation.services.campaigns import campaign_create
staff = User.objects.create(username="staff", is_staff=True)
campaign = campaign_create(user=staff, benchmark="bench", guidelines="g", overlap=int(sys.argv[3]))
group = Group.objects.get(name="annotator")
tokens = []
for i in range(int(sys.argv[2])):
    user = User.objects.create(username=f"annotator{i}")
    user.groups.add(group)
    tokens.append(Token.objects.create(user=user).key)
print(json.dumps({"campaign": campaign.pk, "tokens": tokens}))
"""

CHECK = r"""
import json, sys
from django.db.models import Count, Q
from annotation.models import Assignment, CampaignPair, Rating
campaign = int(sys.argv[1])
pairs = CampaignPair.objects.filter(campaign_id=campaign).annotate(
    n_ratings=Count("assignments__rating"),
    n_live=Count("assignments", filter=Q(assignments__status__in=["leased", "submitted"])))
leases = Assignment.objects.filter(campaign_id=campaign, status="leased").values("annotator").annotate(n=Count("pk"))
print(json.dumps({
    "ratings": Rating.objects.filter(campaign_id=campaign).count(),
    "max_ratings_per_pair": max((p.n_ratings for p in pairs), default=0),
    "pairs_over_overlap": sum(1 for p in pairs if p.n_ratings > p.campaign.overlap),
    "taken_mismatches": sum(1 for p in pairs if p.taken != p.n_live),
    "max_live_leases_per_annotator": max((row["n"] for row in leases), default=0),
}))
"""


def annotate_loop(base: str, campaign: int, token: str, deadline: float, pause: float, rng: random.Random | None,
                  out: dict, cycles: float = float("inf")) -> None:
    """GET next, pause, POST the rating, pause, until the deadline or after `cycles` of them.
    With `rng` (people, not a metronome): the first request after a random share of one pause,
    each pause 0.8-1.2x its length; without, every annotator starts at once and pauses exactly,
    in lockstep."""
    headers = {"Authorization": f"Token {token}"}

    def wait() -> None:
        time.sleep(pause * rng.uniform(0.8, 1.2) if rng else pause)

    if rng:
        time.sleep(rng.uniform(0, pause))
    done = 0
    while time.monotonic() < deadline and done < cycles:
        done += 1
        t0 = time.perf_counter()
        status, body = request(f"{base}/api/annotation/next/?campaign={campaign}", headers)
        out["next"].append(time.perf_counter() - t0)
        if status == 204:
            return
        if status != 200:
            out["errors"].append(status)
            continue
        wait()
        assignment = json.loads(body)["assignment"]
        t0 = time.perf_counter()
        status, _ = request(f"{base}/api/annotation/ratings/", headers,
                            {"assignment": assignment, "ratings": {"1": RATINGS, "2": RATINGS}, "seconds": 5})
        out["submit"].append(time.perf_counter() - t0)
        if status == 201:
            out["rated"] += 1
        else:
            out["errors"].append(status)
        wait()


def cpu_per_cycle(server, campaign: int, token: str, cycles: int) -> tuple[float, float, int]:
    """(web, database) CPU milliseconds per rating cycle, one request at a time, after 40
    warm-up cycles (every worker has connected and prepared its statements), and the number
    of ratings stored (201) on the way."""
    out = {"next": [], "submit": [], "errors": [], "rated": 0}
    annotate_loop(server.base, campaign, token, float("inf"), 0.0, None, out, cycles=40)
    web0, db0 = cpu_seconds(server)
    annotate_loop(server.base, campaign, token, float("inf"), 0.0, None, out, cycles=cycles)
    web1, db1 = cpu_seconds(server)
    if out["errors"]:
        sys.exit(f"CPU phase: requests failed with {sorted(set(out['errors']))}")
    return (web1 - web0) / cycles * 1000, (db1 - db0) / cycles * 1000, out["rated"]


def own_cpu_seconds() -> float:
    """CPU seconds (user + system, all threads) this process, the load generator, used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def healthz_loop(base: str, token: str, deadline: float, out: dict) -> None:
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        status, _ = request(f"{base}/healthz/", {"Authorization": f"Token {token}"})
        out["next"].append(time.perf_counter() - t0)
        if status != 200:
            out["errors"].append(status)


def phase(target, args_for, n: int) -> tuple[dict, float]:
    """Run n threads, each with its own result dict; merge them afterwards."""
    parts = [{"next": [], "submit": [], "errors": [], "rated": 0} for _ in range(n)]
    threads = [threading.Thread(target=target, args=(*args_for(i), parts[i])) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    merged = {"next": [], "submit": [], "errors": [], "rated": 0}
    for part in parts:
        for key in ("next", "submit", "errors"):
            merged[key].extend(part[key])
        merged["rated"] += part["rated"]
    return merged, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20, help="length of each phase")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds an annotator waits after each action")
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--overlap", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
    parser.add_argument("--cycles", type=int, default=300, help="sequential rating cycles timed for CPU per cycle")
    parser.add_argument("--no-stagger", dest="stagger", action="store_false",
                        help="paced annotators start at once and pause exactly (lockstep) instead of at "
                             "random moments")
    args = parser.parse_args()
    if args.annotators < 1 or args.cycles < 1:
        sys.exit("--annotators and --cycles must be at least 1")

    load_before = machine_load()
    with serve(pairs=args.pairs, workers=args.workers, setup=SETUP,
               setup_args=(str(args.annotators), str(args.overlap))) as (server, setup):
        base, campaign, tokens = server.base, setup["campaign"], setup["tokens"]
        web_ms, db_ms, sequential = cpu_per_cycle(server, campaign, tokens[0], args.cycles)
        # Paced annotators arrive at random moments (seeded), as people do; --no-stagger makes them
        # start in the same millisecond and stay in lockstep, which measures a queue of n requests.
        people = (lambda i: random.Random(i)) if args.stagger else (lambda i: None)
        paced, paced_s = phase(annotate_loop, lambda i: (base, campaign, tokens[i], time.monotonic() + args.seconds,
                                                         args.pause, people(i)), len(tokens))
        web0, db0, gen0 = *cpu_seconds(server), own_cpu_seconds()
        busy, busy_s = phase(annotate_loop, lambda i: (base, campaign, tokens[i], time.monotonic() + args.seconds, 0.0,
                                                       None), len(tokens))
        web1, db1, gen1 = *cpu_seconds(server), own_cpu_seconds()
        check = server.django(CHECK, str(campaign))
        health, health_s = phase(healthz_loop, lambda i: (base, tokens[i], time.monotonic() + args.seconds),
                                 len(tokens))
    load_after = machine_load()

    stored_201 = sequential + paced["rated"] + busy["rated"]
    print(f"gunicorn x{args.workers}, PostgreSQL, loopback, {args.annotators} annotators, {args.pairs} pairs, "
          f"overlap {args.overlap}; machine: {load_before} before, {load_after} after")
    print(f"paced ({args.pause:g} s pause after each action, {'random starts, pauses 0.8-1.2x' if args.stagger else 'lockstep'}, "
          f"{paced_s:.1f} s): {paced['rated']} ratings, "
          f"errors {len(paced['errors'])}")
    print(f"  GET next:    p50 {pct(paced['next'], 50):.1f} ms  p95 {pct(paced['next'], 95):.1f} ms  "
          f"(target p95 < 100 ms: {'met' if pct(paced['next'], 95) < 100 else 'NOT met'})")
    print(f"  POST rating: p50 {pct(paced['submit'], 50):.1f} ms  p95 {pct(paced['submit'], 95):.1f} ms  "
          f"(target p95 < 100 ms: {'met' if pct(paced['submit'], 95) < 100 else 'NOT met'})")
    rate = busy["rated"] / busy_s
    cpus = os.cpu_count() or 1
    print(f"CPU per rating cycle (one annotator, one request at a time, {args.cycles} cycles): gunicorn "
          f"{web_ms:.1f} ms + PostgreSQL {db_ms:.1f} ms = {web_ms + db_ms:.1f} ms; ceiling with all {cpus} CPUs "
          f"for the server {cpus * 1000 / (web_ms + db_ms):.0f} ratings/s")
    print(f"saturated (no pauses, {busy_s:.1f} s): {busy['rated']} ratings, {rate:.1f} ratings/s "
          f"(target >= 100: {'met' if rate >= 100 else 'NOT met'}), errors {len(busy['errors'])}; "
          f"GET next p95 {pct(busy['next'], 95):.1f} ms, POST rating p95 {pct(busy['submit'], 95):.1f} ms")
    used = {"gunicorn": web1 - web0, "PostgreSQL": db1 - db0, "load generator": gen1 - gen0}
    per_rating = {name: secs / max(busy["rated"], 1) * 1000 for name, secs in used.items()}
    print(f"  CPU during it ({cpus} CPUs x {busy_s:.1f} s = {cpus * busy_s:.1f} CPU s): "
          + ", ".join(f"{name} {secs:.1f} s" for name, secs in used.items())
          + f"; per rating: server (gunicorn + PostgreSQL) {per_rating['gunicorn'] + per_rating['PostgreSQL']:.1f} "
          f"CPU ms, load generator {per_rating['load generator']:.1f} CPU ms")
    lost = stored_201 - check["ratings"]
    print(f"after the run: {check['ratings']} ratings stored for {stored_201} answers 201 (lost: {lost}); "
          f"most ratings on one pair {check['max_ratings_per_pair']} (overlap {args.overlap}; pairs over it: "
          f"{check['pairs_over_overlap']}); taken != live leases + ratings on {check['taken_mismatches']} pairs; "
          f"most live leases held by one annotator {check['max_live_leases_per_annotator']}")
    print(f"baseline /healthz/ ({health_s:.1f} s): {len(health['next']) / health_s:.1f} requests/s, "
          f"p50 {pct(health['next'], 50):.1f} ms, p95 {pct(health['next'], 95):.1f} ms, errors {len(health['errors'])}")
    if lost or check["pairs_over_overlap"] or check["taken_mismatches"] or check["max_live_leases_per_annotator"] > 1:
        sys.exit("integrity check failed (see above)")


if __name__ == "__main__":
    main()
