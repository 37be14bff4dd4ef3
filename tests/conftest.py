"""Shared fixtures.

PRBENCH_REQUIRE_SERVICES=1 (set by .ci/run) turns every skipped test into a failure, so
CI cannot go green while a test that needs PostgreSQL, Redis, a worker or Chromium
quietly skipped.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.factories import UserFactory

# The fake OpenAI-compatible server fixture (`fake_openai`) for every test that needs one.
pytest_plugins = ["tests.prblib.fake_openai"]

BASE_DIR = Path(__file__).resolve().parent.parent
REQUIRE_SERVICES = os.environ.get("PRBENCH_REQUIRE_SERVICES") == "1"


def _own_broker_per_xdist_worker() -> None:
    """Under pytest-xdist (`make test` runs `-n auto`), each test process gets its own Redis
    database as broker, so one process's Celery worker never takes another's tasks (and a
    purge never drops them). The PostgreSQL test database is per process already (pytest-django
    suffixes it with the worker id), as is the var/ folder (settings: one per session process).
    Settings are loaded before this conftest, so the URL is replaced in the environment (the
    worker subprocesses' settings), in Django's settings and in the Celery app's config."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    url = os.environ.get("CELERY_BROKER_URL", "")
    if not worker.startswith("gw") or not url.startswith(("redis://", "rediss://")):
        return
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    own = urlunsplit(parts._replace(path=f"/{(base + 1 + int(worker[2:])) % 16}"))
    os.environ["CELERY_BROKER_URL"] = own
    from django.conf import settings

    settings.CELERY_BROKER_URL = own
    from prbench.celery import app

    app.conf.broker_url = own


_own_broker_per_xdist_worker()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_SERVICES and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under PRBENCH_REQUIRE_SERVICES=1 (CI must exercise this): {reason}"


def pytest_sessionfinish(session, exitstatus):
    """Remove this session's own var/ folder (database file, broker queue, media)."""
    import shutil

    from django.conf import settings

    if settings.VAR_DIR.parent.name == "test" and settings.VAR_DIR.name.startswith("session-"):
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Login throttles count in the cache: every test starts with none."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def _generous_submission_limit(settings):
    """Refused submission attempts count toward SUBMISSIONS_PER_HOUR: a test that sends many
    refusals as one researcher would reach the default 10. Tests about the limit set their own."""
    settings.SUBMISSIONS_PER_HOUR = 1000


def is_postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny forward passes gain nothing from threads, and on a busy shared machine OpenMP
    threads spin against other processes (8x slower here under load); restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def require_postgres():
    if not is_postgres():
        pytest.skip("needs PostgreSQL (set DATABASE_URL)")


@pytest.fixture
def researcher(db):
    return UserFactory(roles=["researcher"])


@pytest.fixture
def annotator(db):
    return UserFactory(roles=["annotator"])


@pytest.fixture
def staff_user(db):
    return UserFactory(is_staff=True, is_superuser=True)


def database_url_for_subprocess() -> str:
    """A URL for the database the running test uses, to hand to subprocesses."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    if connection.vendor == "postgresql":
        auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
        return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    raise RuntimeError(f"no URL form for {connection.vendor}")


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a manage.py or celery subprocess that shares this test's database."""
    from django.conf import settings

    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url_for_subprocess(),
        "PRBENCH_VAR_DIR": str(settings.VAR_DIR),
        "DJANGO_SETTINGS_MODULE": "prbench.settings",
    })
    env.update(overrides)
    return env


class WorkerProcess:
    """A real `celery worker` subprocess consuming the configured broker."""

    def __init__(self, queues: str = "default,gpu", name: str = "test-worker", *, beat: bool = False,
                 env: dict[str, str] | None = None):
        self.queues, self.name, self.beat, self.env = queues, name, beat, env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path = None

    def start(self, log_path) -> "WorkerProcess":
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "prbench", "worker", "-Q", self.queues, "--pool", "solo",
             "--concurrency", "1", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "-n", f"{self.name}-{uuid.uuid4().hex[:6]}@%h", *(["--beat"] if self.beat else [])],
            cwd=BASE_DIR, env=subprocess_env(**self.env), stdout=self._log, stderr=subprocess.STDOUT,
        )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else ""


def purge_broker() -> None:
    """Drop messages left in the test broker by an earlier, interrupted run."""
    from prbench.celery import app

    with app.connection_for_write() as conn:
        for queue in ("default", "gpu"):
            conn.default_channel.queue_declare(queue=queue, durable=True, auto_delete=False)
            conn.default_channel.queue_purge(queue)


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    """Start a worker subprocess on this test's database; stopped after the test."""
    purge_broker()
    worker = WorkerProcess().start(tmp_path / "worker.log")
    yield worker
    worker.stop()


def wait_for(predicate, *, timeout: float, interval: float = 0.2, worker: WorkerProcess | None = None,
             what: str = "condition", progress=None):
    """Poll until predicate() is truthy; fail with the worker's log tail otherwise.

    Without `progress`, fail after `timeout` seconds. With `progress` (a callable whose value
    changes whenever the awaited work advances: a job's status or units done, a worker saying
    it is ready; see progress_of), `timeout` is the longest wait WITHOUT progress: every change
    restarts the clock, so a loaded machine that is slow but moving is waited for, and work that
    is stuck still fails after `timeout` quiet seconds. (A test's own limit, pytest-timeout's,
    bounds the whole wait; worker tests raise it with WORKER_TEST_TIMEOUT.)"""
    deadline = time.monotonic() + timeout
    last = progress() if progress else None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if worker and worker.proc.poll() is not None:
            pytest.fail(f"worker exited with {worker.proc.returncode} while waiting for {what}:\n{worker.log_tail()}")
        time.sleep(interval)
        if progress:
            now = progress()
            if now != last:
                last, deadline = now, time.monotonic() + timeout
    quiet = " without progress" if progress else ""
    pytest.fail(f"timed out after {timeout}s{quiet} waiting for {what}" + (f":\n{worker.log_tail()}" if worker else ""))


def progress_of(model, pk, *workers: WorkerProcess):
    """A wait_for `progress` for one job row: its status, attempts and units done, and how many of
    `workers` have said they are ready (a worker's start-up is progress too)."""

    def state():
        row = model.objects.filter(pk=pk).values_list("status", "attempts", "progress_done").first()
        return row, sum("ready." in w.log_tail(100_000) for w in workers if w is not None and w.log_path)

    return state


def wait_for_job(row, *, worker: WorkerProcess | None, what: str, until=("SUCCEEDED",),
                 timeout: float = 240):
    """Wait until the job row `row` (a model instance with `status`) has one of the statuses in
    `until`, with its status, attempts, units done and the worker's start-up as progress (see
    wait_for: `timeout` is the longest wait without progress). Returns the status reached."""
    model = type(row)
    return wait_for(lambda: (status := model.objects.filter(pk=row.pk).values_list("status", flat=True).first())
                    in until and status, timeout=timeout, worker=worker, what=what,
                    progress=progress_of(model, row.pk, worker))


# The pytest-timeout limit of a test that runs real workers (pytest.ini's 300 s is for the rest):
# their waits are bounded by progress (wait_for), so this only stops a test that keeps moving
# for too long on a very loaded machine.
WORKER_TEST_TIMEOUT = 1200
