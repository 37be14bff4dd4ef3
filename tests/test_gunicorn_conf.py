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
