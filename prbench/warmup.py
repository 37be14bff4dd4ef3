"""One-off costs of a fresh web process, paid before it serves rather than by its first request.

`warm_up()` imports the URLconf and every view, serializer and service module it reaches, and
reads the model-folder check's architecture table (transformers' source parsed as data, ~60 ms
of CPU). prbench/wsgi.py calls it; with gunicorn's `preload_app` (gunicorn.conf.py) that happens
once in the master and the forked workers share the result. Nothing here opens a database
connection (forked workers must not share one).
"""

from __future__ import annotations


def warm_up() -> None:
    """Import the URLconf and its views, build the resolver, read the architecture table."""
    from django.urls import get_resolver

    from pipeline.ml.modelcheck import task_architectures

    get_resolver()._populate()  # imports prbench.urls and every view module it names
    task_architectures()
