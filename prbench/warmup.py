"""One-off costs of a fresh web process, paid before it serves rather than by its first request.

`warm_up()` imports the URLconf and every view, serializer and service module it reaches, the
statistics the correlation and report pages compute with (prblib.stats.correlation: scipy.stats
and scikit-learn, ~1.3 CPU s, imported lazily by those views: a worker's first chart page took
~5 s), and reads the model-folder check's architecture table (transformers' source parsed as
data, ~60 ms of CPU). prbench/wsgi.py calls it; with gunicorn's `preload_app` (gunicorn.conf.py) that happens
once in the master and the forked workers share the result. Nothing here opens a database
connection (forked workers must not share one).
"""

from __future__ import annotations


def warm_up() -> None:
    """Import the URLconf and its views, build the resolver, import the statistics modules,
    read the architecture table."""
    from django.urls import get_resolver

    import prblib.stats.correlation  # noqa: F401
    from prblib.modelcheck import task_architectures

    get_resolver()._populate()  # imports prbench.urls and every view module it names
    task_architectures()
