"""gunicorn.conf.py: the settings production serves with (see benchmarks/README.md for figures)."""

import gc
import runpy
from pathlib import Path

CONF = Path(__file__).resolve().parent.parent / "gunicorn.conf.py"


def test_the_application_is_preloaded_and_its_heap_frozen_before_each_fork():
    conf = runpy.run_path(str(CONF))
    assert conf["preload_app"] is True
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        conf["pre_fork"](None, None)
        # Everything alive in the "master" now sits in the permanent generation, out of the collector's reach.
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
