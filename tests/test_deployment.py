"""The deployment as documented: it starts from nothing, and slow clients do not take it down.

- docker-compose.yml's `web` command line, run as written (its environment adapted to this
  machine, explicitly, below), collects the static files into an empty folder, migrates a
  fresh PostgreSQL database and serves /healthz/ with DEBUG off and .env.example's settings;
- the management commands that run the system checks work with DEBUG off before collectstatic
  (the URLconf once looked a hashed static name up at import), and `check --deploy` is clean
  with .env.example's settings;
- gunicorn with gunicorn.conf.py answers /healthz/ within ANSWER_WITHIN while more clients than
  its workers have threads send their request heads byte by byte, and answers those clients 408
  after WEB_HEADER_TIMEOUT; the same probe against the sync workers compose served before gets
  no answer at all.
"""

import contextlib
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import is_postgres

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
WEB = COMPOSE["services"]["web"]
PUBLISHED = "0.0.0.0:8000"  # the bind address in the web command, replaced by a free loopback port

WORKERS, THREADS = 2, 2
SLOW_CLIENTS = 3 * WORKERS * THREADS  # heads sent byte by byte: three times the threads there are
ANSWER_WITHIN = 1.0  # seconds: /healthz/ meanwhile (README, "docker compose")
HEADER_TIMEOUT = 2  # WEB_HEADER_TIMEOUT for the probe (default 10 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file, as compose reads .env (comments and blank lines skipped)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def production_env(var: Path, **overrides: str) -> dict[str, str]:
    """This machine's environment without the test session's Django settings (pytest's
    PYTEST_VERSION would select plain static storage; the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE
    fails check --deploy), with .env.example as compose's env_file (SECRET_KEY filled in: the
    example leaves it empty) and PRBENCH_VAR_DIR=var."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTEST_VERSION", "DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL", "DJANGO_SETTINGS_MODULE",
                        "DJANGO_ALLOW_ASYNC_UNSAFE"}}
    env.update(env_file(ROOT / ".env.example"))
    env.update(SECRET_KEY=secrets.token_urlsafe(50), PRBENCH_VAR_DIR=str(var),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.update(overrides)
    return env


class Output:
    """A process's stdout and stderr, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            self.chunks.append(chunk)

    def size(self) -> int:
        return sum(map(len, self.chunks))

    def text(self, chars: int = 6000) -> str:
        return b"".join(self.chunks).decode(errors="replace")[-chars:]


def wait_until_serving(proc: subprocess.Popen, out: Output, base: str, *, stall: float = 30, cap: float = 180) -> None:
    """Poll /healthz/ until it answers 200. Give up, with the process's output, when it exits,
    when it prints nothing new for `stall` seconds (collectstatic, each migration and each
    gunicorn step print a line), or after `cap` seconds in all."""
    start = last_progress = time.monotonic()
    seen = out.size()
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{base}/healthz/", timeout=2) as resp:
                if resp.status == 200:
                    return
        now = time.monotonic()
        if out.size() != seen:
            seen, last_progress = out.size(), now
        if proc.poll() is not None:
            pytest.fail(f"the web command exited with {proc.returncode} before /healthz/ answered:\n{out.text()}")
        if now - last_progress > stall or now - start > cap:
            pytest.fail(f"/healthz/ did not answer after {now - start:.0f} s ({now - last_progress:.0f} s without "
                        f"new output):\n{out.text()}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url: str, **headers: str) -> tuple[int, dict[str, str]]:
    """(status, headers) of a GET, redirects not followed."""
    try:
        with urllib.request.build_opener(NoRedirect).open(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


# --- compose's web command, from an empty var/ and a fresh database ---------------------------

@pytest.fixture
def fresh_postgres_url():
    """The URL of a new, empty PostgreSQL database on the test server; dropped afterwards."""
    if not is_postgres():
        pytest.skip("needs PostgreSQL (set DATABASE_URL): compose's web command migrates a PostgreSQL database")
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    server = {"host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432, "user": s["USER"],
              "password": s.get("PASSWORD") or None}
    name = f"prbench_deploy_{secrets.token_hex(4)}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    try:
        yield f"postgres://{auth}@{server['host']}:{server['port']}/{name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_compose_web_command_starts_from_an_empty_var_folder_and_a_fresh_database(tmp_path, fresh_postgres_url):
    argv = shlex.split(WEB["command"])  # compose splits a string command the same way, no shell of its own
    assert argv[:2] == ["sh", "-c"] and argv[2].count(PUBLISHED) == 1, argv
    port = free_port()
    argv[2] = argv[2].replace(PUBLISHED, f"127.0.0.1:{port}")
    # x-app's environment, adapted: this test's database server, no broker or shared cache (the
    # start uses neither), local folders; one web worker; and, as .env.example says to set it
    # behind a TLS-terminating proxy, BEHIND_TLS_PROXY=1. Everything else as compose sets it.
    environment = {**WEB["environment"], "DATABASE_URL": fresh_postgres_url, "CELERY_BROKER_URL": "memory://",
                   "CACHE_URL": "", "MODELS_ROOT": str(tmp_path / "models"), "DATA_ROOT": str(tmp_path / "data"),
                   "WEB_CONCURRENCY": "1", "BEHIND_TLS_PROXY": "1"}
    var = tmp_path / "var"
    proc = subprocess.Popen(argv, cwd=ROOT, env=production_env(var, **environment), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    out = Output(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, out, base)
        # Served as .env.example configures production: plain HTTP redirects to HTTPS (/healthz/
        # is exempt); through the proxy, the favicon redirect names the hashed file collectstatic
        # wrote, and whitenoise serves it.
        status, headers = fetch(f"{base}/")
        assert (status, headers.get("Location")) == (301, f"https://127.0.0.1:{port}/")
        status, headers = fetch(f"{base}/favicon.ico", **{"X-Forwarded-Proto": "https"})
        assert status == 301 and re.fullmatch(r"/static/img/favicon\.[0-9a-f]{12}\.svg", headers["Location"]), headers
        assert fetch(base + headers["Location"], **{"X-Forwarded-Proto": "https"})[0] == 200
        assert (var / "staticfiles" / headers["Location"].removeprefix("/static/")).is_file()
    finally:
        stop(proc)
    output = out.text(100_000)
    assert "Traceback" not in output, out.text()
    for first in ("leaderboard.0001_initial", "pipeline.0001_initial", "annotation.0001_initial", "prbench.0001_role_groups"):
        assert f"Applying {first}... OK" in output, out.text()


@pytest.mark.parametrize("command", [["check", "--deploy"], ["migrate", "--plan"]], ids=" ".join)
def test_commands_that_run_the_system_checks_work_with_debug_off_before_collectstatic(tmp_path, command):
    env = production_env(tmp_path / "var")
    assert env["DEBUG"] == "0"
    done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "var" / "staticfiles" / "staticfiles.json").exists()  # nothing was collected
    if command[0] == "check":
        # .env.example is secure by default: no warning about cookies, SSL redirect or HSTS.
        assert done.stdout.strip() == "System check identified no issues (0 silenced).", done.stdout + done.stderr


# --- slow clients --------------------------------------------------------------------------------

@contextlib.contextmanager
def gunicorn(tmp_path: Path, *flags: str):
    """gunicorn with the project's gunicorn.conf.py (and `flags` after it, which override it) on a
    free loopback port, WORKERS workers of THREADS threads, DEBUG off, SQLite in tmp_path (/healthz/
    runs SELECT 1). PYTEST_VERSION stays set here, so the static files need no collecting."""
    port = free_port()
    env = {**production_env(tmp_path / "var"), "PYTEST_VERSION": os.environ.get("PYTEST_VERSION", "1"),
           "WEB_CONCURRENCY": str(WORKERS), "WEB_THREADS": str(THREADS), "WEB_HEADER_TIMEOUT": str(HEADER_TIMEOUT)}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "gunicorn.conf.py", *flags,
                             "prbench.wsgi:application", "--bind", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out = Output(proc)
    try:
        wait_until_serving(proc, out, f"http://127.0.0.1:{port}", stall=60, cap=90)
        yield port, out
    finally:
        stop(proc, signal.SIGINT)  # a quick stop: the sync workers may still be stuck reading


def healthz_while_heads_trickle(port: int, rounds: int = 3) -> tuple[list[float | None], list[socket.socket]]:
    """Open SLOW_CLIENTS connections that send a request head byte by byte, never finishing it;
    each round, one more byte from each, then GET /healthz/ waiting at most ANSWER_WITHIN.
    Returns each round's answer time (None: no answer in time) and the slow connections."""
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW_CLIENTS)]
    for conn in slow:
        conn.sendall(b"GET /healthz/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    times: list[float | None] = []
    for _ in range(rounds):
        for conn in slow:
            conn.sendall(b"a")
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz/", timeout=ANSWER_WITHIN) as resp:
                times.append(time.monotonic() - started if resp.status == 200 else None)
        except OSError:
            times.append(None)
    return times, slow


HEALTHZ = b"GET /healthz/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
OK = b'{"status": "ok"}'


def exchange(port: int, *pieces: bytes, answers: int = 1) -> bytes:
    """Send the pieces in turn on one connection (0.01 s apart), then read until `answers`
    /healthz/ bodies came back (at most 5 s per read)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        for piece in pieces:
            conn.sendall(piece)
            time.sleep(0.01)
        data = b""
        while data.count(OK) < answers and (chunk := conn.recv(65536)):
            data += chunk
    return data


def test_healthz_answers_while_more_slow_clients_than_threads_send_their_heads(tmp_path):
    with gunicorn(tmp_path) as (port, out):
        # Heads that arrive in pieces, pipelined or on a kept-alive connection are served as before.
        assert exchange(port, *[HEALTHZ[i:i + 1] for i in range(len(HEALTHZ))]).startswith(b"HTTP/1.1 200 OK\r\n")
        assert exchange(port, HEALTHZ + HEALTHZ, answers=2).count(b"HTTP/1.1 200 OK\r\n") == 2
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            for _ in range(2):
                conn.sendall(HEALTHZ)
                data = b""
                while OK not in data and (chunk := conn.recv(65536)):
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200 OK\r\n"), data
                time.sleep(0.3)  # idle in gunicorn's keep-alive poller, then the next request
        times, slow = healthz_while_heads_trickle(port)
        opened = time.monotonic()
        try:
            assert None not in times and max(times) < ANSWER_WITHIN, (times, out.text())
            # The slow clients still hold their connections (nothing was refused or dropped) ...
            for conn in slow:
                conn.setblocking(False)
                with pytest.raises(BlockingIOError):
                    conn.recv(1)
            # ... until their head is WEB_HEADER_TIMEOUT late: then each is told so and closed.
            for conn in slow:
                conn.settimeout(max(HEADER_TIMEOUT + 3 - (time.monotonic() - opened), 0.1))
                answer = conn.recv(4096)
                assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
                assert answer.endswith(b"\r\n\r\nthe request head did not arrive within 2 s\n"), answer
        finally:
            for conn in slow:
                conn.close()


def test_the_same_probe_gets_no_answer_from_the_sync_workers_compose_served_before(tmp_path):
    """The check above can fail: one thread per worker, as before, is held by the first slow
    client it accepts, and /healthz/ waits behind the rest."""
    with gunicorn(tmp_path, "--worker-class", "sync", "--threads", "1") as (port, out):
        times, slow = healthz_while_heads_trickle(port, rounds=2)
        for conn in slow:
            conn.close()  # frees the stuck workers for the stop
    assert times == [None, None], (times, out.text())
