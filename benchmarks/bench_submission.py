"""Submission create latency: POST /api/submissions/ and the /submit/ form, in-process.

Set-up (not timed): a throwaway SQLite database, var folder and Celery filesystem broker; a
researcher; a 45-pair benchmark; the ~10M-parameter tiny Llama reward model (benchmarks/common.py)
under MODELS_ROOT and, per request, a copy of it (weights hard-linked, config.json made distinct,
so no request is refused as a duplicate of another).

Timed: `--requests` POSTs to each of /api/submissions/ (JSON, token auth) and /submit/ (form,
session), through Django's test client in this process (URL routing, middleware, DRF, the
service, the database and the broker publish; no network server). As a plain baseline in the
same run, the same client GETs /healthz/. The first API request of the process is timed on
its own too (one-off costs a fresh web worker pays), after `prbench.warmup.warm_up()`, which
prbench/wsgi.py runs before a web process serves (timed and printed as well). Prints p50/p95/max in milliseconds of
wall time and of this process's CPU time (what a request costs, whatever else the machine
is running; on a busy shared machine the wall time is mostly waiting for a core).

    .venv/bin/python benchmarks/bench_submission.py               # 30 requests each (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, TextMaker, build_tiny_llama_rm, load_average, machine  # noqa: E402


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"p50 {statistics.median(ms):7.1f} ms   p95 {p95:7.1f} ms   max {ms[-1]:7.1f} ms"


class Clock:
    """Wall and CPU time (this process: the test client runs the whole request in it) of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def model_copy(source: Path, folder: Path, n: int) -> str:
    """A copy of the model whose fingerprint differs: weights hard-linked, config.json distinct."""
    folder.mkdir(parents=True)
    for file in source.iterdir():
        if file.name != "config.json":
            os.link(file, folder / file.name)
    config = json.loads((source / "config.json").read_text())
    config["bench_copy"] = n
    (folder / "config.json").write_text(json.dumps(config))
    return folder.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    if args.requests < 2:
        sys.exit("--requests must be at least 2")

    tmp = Path(tempfile.mkdtemp(prefix="prbench-bench-submit-"))
    try:
        for key in ("DATABASE_URL", "CELERY_BROKER_URL"):
            os.environ.pop(key, None)
        os.environ.update(PRBENCH_VAR_DIR=str(tmp / "var"), MODELS_ROOT=str(tmp / "models"),
                          SUBMISSIONS_PER_HOUR=str(10 * args.requests), DJANGO_SETTINGS_MODULE="prbench.settings")
        import django

        django.setup()
        from prbench.warmup import warm_up

        with Clock() as warm:
            warm_up()  # what prbench/wsgi.py does before a web process serves (gunicorn: once, preloaded)
        from django.core.management import call_command
        from django.test import Client
        from rest_framework.authtoken.models import Token

        from django.contrib.auth.models import Group, User

        call_command("migrate", verbosity=0)
        maker = TextMaker(0)
        data = tmp / "bench.jsonl"
        with open(data, "w", encoding="utf-8") as fh:
            for i in range(45):
                fh.write(json.dumps({
                    "id": f"s{i}", "question": maker.question(), "category": "Society_and_Culture",
                    "profile": [{"id": f"s{i}-{j}", "text": t, "category": "x"} for j, t in enumerate(maker.profile())],
                    "rubric_aspects": [{"aspect": "a", "evidence": "e", "reason": "r"}], "narrative": "n",
                    "chosen": maker.response(), "rejected": maker.response()}) + "\n")
        call_command("import_benchmark", str(data), name="bench-submit", verbosity=0)
        source = build_tiny_llama_rm(tmp / "source-rm")
        models = tmp / "models"
        names = [model_copy(source, models / f"rm-{n}", n) for n in range(2 * args.requests + 1)]

        user = User.objects.create_user("bench-researcher", password="bench-password-1")
        user.groups.add(Group.objects.get_or_create(name="researcher")[0])
        token = Token.objects.create(user=user).key
        api = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")
        page = Client(HTTP_HOST="127.0.0.1")
        page.force_login(user)

        def api_post(name: str) -> Clock:
            body = {"display_name": name, "benchmark": "bench-submit", "kind": "scalar", "settings": ["profile"],
                    "model_path": name}
            with Clock() as clock:
                response = api.post("/api/submissions/", body, content_type="application/json")
            if response.status_code != 201:
                sys.exit(f"POST /api/submissions/ gave {response.status_code}: {response.content[:300]!r}")
            return clock

        def form_post(name: str) -> Clock:
            body = {"display_name": name, "benchmark": "bench-submit", "kind": "scalar", "settings": ["profile"],
                    "model_path": name, "dtype": "auto", "max_length": 4096, "batch_size": 8, "profile_k": 10}
            with Clock() as clock:
                response = page.post("/submit/", body)
            if response.status_code != 302:
                sys.exit(f"POST /submit/ gave {response.status_code} (expected a redirect to the submission)")
            return clock

        def healthz() -> Clock:
            with Clock() as clock:
                response = api.get("/healthz/")
            if response.status_code != 200:
                sys.exit(f"GET /healthz/ gave {response.status_code}")
            return clock

        print(f"machine: {machine()}; {load_average()}")
        first = api_post(names[0])
        print(f"warm-up before serving (prbench.warmup, run by wsgi.py): {warm.wall * 1000:.1f} ms "
              f"({warm.cpu * 1000:.1f} ms CPU)")
        print(f"first POST /api/submissions/ of the process: {first.wall * 1000:.1f} ms "
              f"({first.cpu * 1000:.1f} ms CPU)")
        timings: dict[str, list[Clock]] = {"POST /api/submissions/": [], "POST /submit/ (form)": [],
                                           "GET /healthz/ (baseline)": []}
        for i in range(args.requests):  # interleaved, so load bursts hit all three alike
            timings["POST /api/submissions/"].append(api_post(names[1 + 2 * i]))
            timings["POST /submit/ (form)"].append(form_post(names[2 + 2 * i]))
            timings["GET /healthz/ (baseline)"].append(healthz())
        print(f"{args.requests} requests each, interleaved")
        for label, samples in timings.items():
            print(f"{label:26s} wall {percentiles([c.wall for c in samples])}")
            print(f"{'':26s} CPU  {percentiles([c.cpu for c in samples])}")
        print(f"({load_average()})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
