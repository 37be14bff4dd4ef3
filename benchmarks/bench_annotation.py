"""Annotation throughput: N concurrent annotators against a real server on PostgreSQL.

Creates a throwaway PostgreSQL database, a synthetic benchmark and a campaign, starts
gunicorn on a loopback port, then runs N annotator threads for a bounded time, each doing
GET /api/annotation/next/ + POST /api/annotation/ratings/ in a loop. As a plain baseline
measured in the same run, the same threads then call /healthz/ (one trivial query) for the
same time. Prints throughput and p50/p95 latencies, and the ratio to the baseline.

    .venv/bin/python benchmarks/bench_annotation.py --annotators 20 --seconds 20
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from _server import start_gunicorn

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")


SETUP = r"""
import json, sys
import django
django.setup()
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from annotation.services import campaign_create
from pipeline.services import benchmark_import
benchmark_import(path=sys.argv[1], name="bench")
staff = User.objects.create(username="staff", is_staff=True)
campaign = campaign_create(user=staff, benchmark="bench", guidelines="g", overlap=3)
group = Group.objects.get(name="annotator")
tokens = []
for i in range(int(sys.argv[2])):
    user = User.objects.create(username=f"annotator{i}")
    user.groups.add(group)
    tokens.append(Token.objects.create(user=user).key)
print(json.dumps({"campaign": campaign.pk, "tokens": tokens}))
"""


def make_benchmark(path: Path, pairs: int) -> None:
    subsets = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
    with open(path, "w") as fh:
        for i in range(pairs):
            fh.write(json.dumps({
                "id": f"b{i}", "question": f"Question {i}: how should I plan my week?",
                "profile": [{"id": f"b{i}-p{j}", "text": f"Past post {j} about routines.", "category": subsets[i % 3]}
                            for j in range(10)],
                "rubric_aspects": [{"aspect": "Mentions routines", "evidence": "posts", "reason": "habit"}],
                "narrative": "n", "category": subsets[i % 3],
                "chosen": f"Build on your routine {i}.", "rejected": f"Try a generic plan {i}."}) + "\n")


def request(url: str, token: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Authorization": f"Token {token}",
                                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def annotate_loop(base: str, campaign: int, token: str, deadline: float, out: dict) -> None:
    ratings = {k: 3 for k in ("factuality", "relevance", "helpfulness", "personal_rubrics")}
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        status, body = request(f"{base}/api/annotation/next/?campaign={campaign}", token)
        out["next"].append(time.perf_counter() - t0)
        if status == 204:
            return
        if status != 200:
            out["errors"].append(status)
            continue
        assignment = json.loads(body)["assignment"]
        t0 = time.perf_counter()
        status, _ = request(f"{base}/api/annotation/ratings/", token,
                            {"assignment": assignment, "ratings": {"1": ratings, "2": ratings}, "seconds": 5})
        out["submit"].append(time.perf_counter() - t0)
        if status != 201:
            out["errors"].append(status)
        else:
            out["rated"] += 1


def baseline_loop(base: str, token: str, deadline: float, out: dict) -> None:
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        status, _ = request(f"{base}/healthz/", token)
        out["healthz"].append(time.perf_counter() - t0)
        if status != 200:
            out["errors"].append(status)


def run_threads(target, args_for, n: int) -> float:
    threads = [threading.Thread(target=target, args=args_for(i)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000 if len(values) >= 2 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
    args = parser.parse_args()

    db = f"prbench_bench_{secrets.token_hex(4)}"
    subprocess.run(["psql", PG + "/postgres", "-qc", f"CREATE DATABASE {db}"], check=True)
    server = None
    try:
        with tempfile.TemporaryDirectory(prefix="prbench-bench-") as tmp:
            env = dict(os.environ, DATABASE_URL=f"{PG}/{db}", PRBENCH_VAR_DIR=tmp, DEBUG="1",
                       DJANGO_SETTINGS_MODULE="prbench.settings", PYTHONPATH=str(ROOT))
            data = Path(tmp) / "bench.jsonl"
            make_benchmark(data, args.pairs)
            subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
            setup = json.loads(subprocess.run([sys.executable, "-c", SETUP, str(data), str(args.annotators)],
                                              cwd=ROOT, env=env, check=True, capture_output=True, text=True)
                               .stdout.strip().splitlines()[-1])
            server, base = start_gunicorn(env, workers=args.workers)
            tokens, campaign = setup["tokens"], setup["campaign"]

            work = {"next": [], "submit": [], "errors": [], "rated": 0}
            # One result dict per thread: no shared lists between threads.
            lock_free = [{"next": [], "submit": [], "errors": [], "rated": 0} for _ in tokens]
            deadline = time.monotonic() + args.seconds
            elapsed = run_threads(annotate_loop, lambda i: (base, campaign, tokens[i], deadline, lock_free[i]),
                                  len(tokens))
            for part in lock_free:
                for key in ("next", "submit", "errors"):
                    work[key].extend(part[key])
                work["rated"] += part["rated"]

            base_parts = [{"healthz": [], "errors": []} for _ in tokens]
            deadline = time.monotonic() + args.seconds
            base_elapsed = run_threads(baseline_loop, lambda i: (base, tokens[i], deadline, base_parts[i]),
                                       len(tokens))
            healthz = [x for p in base_parts for x in p["healthz"]]
            base_errors = [x for p in base_parts for x in p["errors"]]
    finally:
        if server:
            server.terminate()
            server.wait(10)
        subprocess.run(["psql", PG + "/postgres", "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=False)

    pairs_per_s = work["rated"] / elapsed
    requests_per_s = (len(work["next"]) + len(work["submit"])) / elapsed
    healthz_per_s = len(healthz) / base_elapsed
    print(f"{args.annotators} concurrent annotators, {elapsed:.1f} s, gunicorn x{args.workers}, PostgreSQL, loopback")
    print(f"rated pairs: {work['rated']} ({pairs_per_s:.1f} pairs/s, {requests_per_s:.1f} requests/s), "
          f"errors: {len(work['errors'])}")
    print(f"GET next:    p50 {pct(work['next'], 50):.1f} ms  p95 {pct(work['next'], 95):.1f} ms")
    print(f"POST rating: p50 {pct(work['submit'], 50):.1f} ms  p95 {pct(work['submit'], 95):.1f} ms")
    print(f"baseline /healthz/: {healthz_per_s:.1f} requests/s, p50 {pct(healthz, 50):.1f} ms, "
          f"p95 {pct(healthz, 95):.1f} ms, errors: {len(base_errors)}")
    print(f"annotation requests/s relative to the baseline: {requests_per_s / healthz_per_s:.2f}")


if __name__ == "__main__":
    main()
