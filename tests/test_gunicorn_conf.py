"""gunicorn.conf.py: the settings production serves with (see benchmarks/README.md for figures)."""

import gc
import runpy
from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parent.parent / "gunicorn.conf.py"


@pytest.mark.parametrize("hook", ["when_ready", "pre_fork"])
def test_the_application_is_preloaded_and_its_heap_frozen_before_workers_fork(hook):
    conf = runpy.run_path(str(CONF))
    assert conf["preload_app"] is True
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        conf[hook](*[None] * conf[hook].__code__.co_argcount)
        # Everything alive in the "master" now sits in the permanent generation, out of the collector's reach.
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def test_workers_are_threaded_and_read_request_heads_in_their_event_loop(monkeypatch):
    """Behaviour under slow clients: tests/test_deployment.py. Here the settings it reads."""
    from gunicorn.workers.gthread import ThreadWorker

    monkeypatch.setenv("WEB_THREADS", "3")
    monkeypatch.setenv("WEB_HEADER_TIMEOUT", "7")
    conf = runpy.run_path(str(CONF))
    assert conf["threads"] == 3 and conf["HEADER_TIMEOUT"] == 7.0
    assert issubclass(conf["worker_class"], ThreadWorker) and conf["worker_class"] is not ThreadWorker
    assert conf["TIMEOUT_RESPONSE"].startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert conf["TIMEOUT_RESPONSE"].endswith(b"\r\n\r\nthe request head did not arrive within 7 s\n")
    monkeypatch.delenv("WEB_THREADS")
    monkeypatch.delenv("WEB_HEADER_TIMEOUT")
    conf = runpy.run_path(str(CONF))
    assert (conf["threads"], conf["HEADER_TIMEOUT"]) == (4, 10.0)


@pytest.mark.parametrize("name, value", [("WEB_THREADS", "four"), ("WEB_CONCURRENCY", "0"),
                                         ("WEB_HEADER_TIMEOUT", "-1")])
def test_a_malformed_setting_stops_the_start_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        runpy.run_path(str(CONF))
    kind = "a positive number" if name == "WEB_HEADER_TIMEOUT" else "a positive whole number"
    assert str(err.value) == f"{name}={value!r} must be {kind}"
