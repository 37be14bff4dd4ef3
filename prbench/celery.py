"""Celery application.

Two queues: `default` for light work and `gpu` for model work. GPU workers run
`celery -A prbench worker -Q gpu --concurrency 1`; delivery settings (late acks,
requeue when a worker dies, prefetch of one, time limits) live in settings.py.
"""

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "prbench.settings")

app = Celery("prbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("default"), Queue("gpu"))
app.autodiscover_tasks()
