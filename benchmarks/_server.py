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
    """(process, base URL) of `gunicorn prbench.wsgi` once /healthz/ answers (or after 60 s: with
    gunicorn.conf.py's preload_app the application and its warm-up load before the port opens)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "prbench.wsgi:application", "--bind",
                               f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning"],
                              cwd=ROOT, env=env, **popen)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{base}/healthz/", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    return server, base


# --- a throwaway PostgreSQL database behind gunicorn (annotation and report benchmarks) -----------

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import urllib.error  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
# Served as in production (DEBUG off: no SQL recorded per statement), on plain HTTP over
# loopback; `private_redis` gives the web workers one shared cache, as compose's CACHE_URL does.
PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "bench-" + "x" * 44, "ALLOWED_HOSTS": "127.0.0.1",
              "SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0",
              "SECURE_HSTS_SECONDS": "0"}


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """The URL of a redis-server of this run's own on a free loopback port, keeping nothing on
    disk: no figure comes from an earlier run's cache and no one else's database is touched.
    Exits with a clear message when redis-server is not installed."""
    port = free_port()
    try:
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        sys.exit("redis-server is not installed: the web benchmarks serve with a Redis cache, as production does")
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


SUBSETS = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")


def text_of(chars: int, sentence: str) -> str:
    """`sentence` repeated and cut to `chars` characters (at least one)."""
    chars = max(chars, 1)
    return (sentence * (chars // len(sentence) + 1))[:chars]


def make_benchmark(path: Path, pairs: int, *, narrative_chars: int = 1) -> None:
    """`pairs` synthetic personalised pairs as JSON lines; `narrative_chars` sizes each pair's
    narrative (the answer key: stored, never shown to annotators or models)."""
    narrative = text_of(narrative_chars, "The user keeps a steady weekly routine and plans ahead. ")
    with open(path, "w") as fh:
        for i in range(pairs):
            fh.write(json.dumps({
                "id": f"b{i}", "question": f"Question {i}: how should I plan my week?",
                "profile": [{"id": f"b{i}-p{j}", "text": f"Past post {j} about routines.", "category": SUBSETS[i % 3]}
                            for j in range(10)],
                "rubric_aspects": [{"aspect": "Mentions routines", "evidence": "posts", "reason": "habit"}],
                "narrative": narrative, "category": SUBSETS[i % 3],
                "chosen": f"Build on your routine {i}.", "rejected": f"Try a generic plan {i}."}) + "\n")


@dataclass
class Server:
    base: str
    env: dict[str, str]
    pid: int = 0  # gunicorn's master; its workers are its children

    def django(self, code: str, *args: str) -> dict:
        """Run `code` in a Django process on the benchmark database; its last stdout line is JSON."""
        out = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code, *args], cwd=ROOT,
                             env=self.env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


@contextlib.contextmanager
def serve(*, pairs: int, workers: int, setup: str, setup_args: tuple[str, ...] = ()) -> Iterator[tuple[Server, dict]]:
    """A fresh database with `pairs` synthetic pairs imported as benchmark "bench", `setup`
    run in Django (its JSON result is yielded), and gunicorn with `workers` processes, served
    as in production (PRODUCTION, a private Redis cache)."""
    db = f"prbench_bench_{secrets.token_hex(4)}"
    subprocess.run(["psql", PG + "/postgres", "-qc", f"CREATE DATABASE {db}"], check=True)
    server = None
    try:
        with tempfile.TemporaryDirectory(prefix="prbench-bench-") as tmp, private_redis() as cache:
            env = dict(os.environ, DATABASE_URL=f"{PG}/{db}", PRBENCH_VAR_DIR=tmp, CACHE_URL=cache,
                       DJANGO_SETTINGS_MODULE="prbench.settings", PYTHONPATH=str(ROOT), **PRODUCTION)
            data = Path(tmp) / "bench.jsonl"
            make_benchmark(data, pairs)
            for command in (["collectstatic", "--noinput", "-v0"], ["migrate", "-v", "0"]):
                subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True)
            handle = Server(base="", env=env)
            result = handle.django("from pipeline.services import benchmark_import\n"
                                   "import sys\nbenchmark_import(path=sys.argv[1], name='bench')\n" + setup,
                                   str(data), *setup_args)
            server, handle.base = start_gunicorn(env, workers=workers)
            handle.pid = server.pid
            yield handle, result
    finally:
        if server:
            server.terminate()
            server.wait(60)  # gunicorn's master takes 5-10 s to stop on a busy machine
        subprocess.run(["psql", PG + "/postgres", "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=False)


def request(url: str, headers: dict[str, str], body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def pct(values: list[float], q: int) -> float:
    """The q-th percentile in milliseconds (statistics.quantiles, exclusive method)."""
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) >= 2 else float("nan")


def cpu_seconds(server: Server) -> tuple[float, float]:
    """(gunicorn: master and workers, PostgreSQL: the backends connected to the benchmark's
    database) CPU seconds so far, user + system, read from this machine's process table: the
    database must run on this machine. Backends that closed are not counted, so measure
    between requests of one phase (the workers keep their connections: CONN_MAX_AGE)."""
    import psutil

    web = psutil.Process(server.pid)
    web_s = sum(sum(p.cpu_times()[:2]) for p in [web, *web.children(recursive=True)])
    backends = server.django("import json\nfrom django.db import connection\n"
                             "with connection.cursor() as cur:\n"
                             "    cur.execute('SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                             "AND pid <> pg_backend_pid()')\n"
                             "    print(json.dumps([row[0] for row in cur.fetchall()]))")
    db_s = 0.0
    for pid in backends:
        try:
            db_s += sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return web_s, db_s


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.1f} (1 min) / {five:.1f} (5 min)"
