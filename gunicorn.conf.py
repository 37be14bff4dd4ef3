"""gunicorn settings for `gunicorn prbench.wsgi:application` (read from the working directory;
command-line flags override them).

preload_app: the application (Django set-up, the URLconf and views, prbench.warmup) is loaded
once in the master before forking, so no worker's first request pays ~0.5 CPU s of imports and
the workers share those pages of memory. Workers: WEB_CONCURRENCY (gunicorn's own variable),
default 2 x CPUs + 1.
"""

import multiprocessing
import os

preload_app = True
workers = int(os.environ.get("WEB_CONCURRENCY") or 2 * multiprocessing.cpu_count() + 1)
timeout = 120
