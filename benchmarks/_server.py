"""A gunicorn server on a free loopback port, for the benchmarks that measure pages or APIs."""

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(env: dict, *, workers: int, **popen) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of `gunicorn prbench.wsgi` once /healthz/ answers (or after 20 s)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "prbench.wsgi:application", "--bind",
                               f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning"],
                              cwd=ROOT, env=env, **popen)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{base}/healthz/", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    return server, base
