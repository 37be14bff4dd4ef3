"""Slow clients against gunicorn: /healthz/ while `--slow` connections send their heads byte by byte.

Collects static files into a throwaway var folder (SQLite there: /healthz/ runs SELECT 1) and
starts gunicorn three ways, one after the other, on a loopback port, as in production (DEBUG
off), each with 2 workers: the plain baseline, the sync workers compose served before
(`--worker-class sync --threads 1`); gunicorn's own gthread worker with the same threads
(`--worker-class gthread`: what threads alone give); and gunicorn.conf.py as it is. For each:
`--requests` GETs of /healthz/ one at a time with nothing else connected (idle), then the same
while `--slow` connections (default 4 x workers x threads) each send a request head one byte
every 0.5 s and never finish it (a connection the server closes is opened again, as a slowloris
does), spread over at least `--seconds`, each GET waiting at most `--wait` seconds. Prints per server the answers within the wait,
p50/p95 of the answered, their p50 against the same server idle, and the 408s the slow clients
received; then the answers against the baseline's.

    .venv/bin/python benchmarks/bench_slow_clients.py [--slow 32] [--requests 10] [--wait 2] [--seconds 12]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _server import PRODUCTION, pct, start_gunicorn
from common import load_average, machine

ROOT = Path(__file__).resolve().parent.parent
WORKERS, THREADS = 2, 4
SERVERS = [("sync, as compose served before (baseline)", "--worker-class sync --threads 1"),
           ("gthread alone", "--worker-class gthread"),
           ("gunicorn.conf.py", "")]
HEAD = b"GET /healthz/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


class Slowloris:
    """`count` connections that each send one more byte of a never-ending head every 0.5 s."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.conns: list[socket.socket] = []
        self.reopened = self.timeouts = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port))
        conn.sendall(HEAD)
        conn.setblocking(False)
        return conn

    def _run(self) -> None:
        while not self.stopping.wait(0.5):
            for i, conn in enumerate(self.conns):
                try:
                    answer = conn.recv(4096)  # the server answered (a 408) or closed it
                except BlockingIOError:
                    answer = None
                except OSError:
                    answer = b""
                if answer is None:
                    try:
                        conn.send(b"a")
                        continue
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                self.timeouts += answer.startswith(b"HTTP/1.1 408") if answer else 0
                conn.close()
                self.conns[i] = self._open()
                self.reopened += 1

    def __enter__(self) -> "Slowloris":
        self.conns = [self._open() for _ in range(self.count)]
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()
        for conn in self.conns:
            conn.close()


def healthz(base: str, requests: int, wait: float, spacing: float = 0.05) -> list[float | None]:
    """Seconds each GET /healthz/ took, None where no answer came within `wait`; one GET
    starts every `spacing` seconds at most."""
    times: list[float | None] = []
    for _ in range(requests):
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"{base}/healthz/", timeout=wait) as resp:
                resp.read()
                times.append(time.perf_counter() - started)
        except OSError:
            times.append(None)
        time.sleep(max(spacing - (time.perf_counter() - started), 0))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=4 * WORKERS * THREADS)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--wait", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=12.0,
                        help="the GETs under slow clients spread over at least this long (default: past "
                             "gunicorn.conf.py's 10-s head timeout, so the slow clients are dropped and reconnect)")
    args = parser.parse_args()
    print(machine())
    results = []
    with tempfile.TemporaryDirectory(prefix="prbench-bench-") as var:
        env = {**os.environ, **PRODUCTION, "PRBENCH_VAR_DIR": var, "DJANGO_SETTINGS_MODULE": "prbench.settings",
               "WEB_THREADS": str(THREADS)}
        for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL"):
            env.pop(name, None)
        subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env,
                       check=True)
        for label, flags in SERVERS:
            server, base = start_gunicorn({**env, "GUNICORN_CMD_ARGS": flags}, workers=WORKERS,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                idle = healthz(base, args.requests, args.wait)
                with Slowloris(int(base.rsplit(":", 1)[1]), args.slow) as attack:
                    time.sleep(1.0)  # every slow connection accepted and holding whatever it holds
                    attacked = healthz(base, args.requests, args.wait, args.seconds / args.requests)
                results.append((label, idle, attacked, attack))
            finally:
                server.send_signal(2)  # SIGINT: a quick stop (stuck sync workers are killed)
                server.wait(60)
    print(f"{args.slow} slow connections (a byte every 0.5 s each), {WORKERS} workers x {THREADS} threads; "
          f"{args.requests} GETs of /healthz/ over at least {args.seconds:g} s, each waiting at most {args.wait:g} s; "
          f"{load_average()}")
    baseline_answered = None
    for label, idle, attacked, attack in results:
        idle_ok = [t for t in idle if t is not None]
        ok = [t for t in attacked if t is not None]
        answered = len(ok)
        if baseline_answered is None:
            baseline_answered = answered
        spread = (f", p50 {pct(ok, 50):.1f} / p95 {pct(ok, 95):.1f} ms ({pct(ok, 50) / pct(idle_ok, 50):.1f}x its "
                  f"idle p50)" if len(ok) >= 2 and len(idle_ok) >= 2 else "")
        print(f"{label}: idle p50 {pct(idle_ok, 50):.1f} / p95 {pct(idle_ok, 95):.1f} ms; under slow clients "
              f"{answered}/{len(attacked)} answered{spread}; "
              f"slow connections answered 408: {attack.timeouts}, reopened: {attack.reopened}; "
              f"answers against the baseline: {answered} vs {baseline_answered}")


if __name__ == "__main__":
    main()
