"""gunicorn settings for `gunicorn prbench.wsgi:application` (read from the working directory;
command-line flags override them).

preload_app: the application (Django set-up, the URLconf and views, prbench.warmup) is loaded
once in the master before forking, so no worker's first request pays ~0.5 CPU s of imports and
the workers share those pages of memory; when_ready and pre_fork freeze that heap for the
garbage collector (below). Workers: WEB_CONCURRENCY (gunicorn's own variable), default
2 x CPUs + 1.
"""

import gc
import multiprocessing
import os

preload_app = True
workers = int(os.environ.get("WEB_CONCURRENCY") or 2 * multiprocessing.cpu_count() + 1)
timeout = 120


def when_ready(server):
    """Once the preloaded application is in the master, before the first worker is forked:
    collect what start-up left unreachable (a frozen cycle would never be freed), then freeze."""
    gc.collect()
    gc.freeze()


def pre_fork(server, worker):
    """Freeze the master's heap (~220,000 objects after the warm-up: Django, the views, the
    statistics modules) before each worker is forked, re-spawned ones included. The cyclic
    garbage collector then never traverses it: a full collection measured ~85 CPU ms before
    freezing and ~0.003 ms after (benchmarks/README.md), and one landing inside a request held it
    up that long. Frozen objects are still freed by reference counting; only cycles among them
    are never collected."""
    gc.freeze()
