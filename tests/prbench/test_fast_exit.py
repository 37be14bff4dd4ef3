"""manage.py ends a model command's process without the interpreter's teardown, losing nothing.

The mechanism is checked in child processes with a stand-in `torch` module (the function only
asks whether torch was imported): what a normal exit would do that matters still happens
(atexit callbacks, weakref finalizers, buffered output), the teardown itself does not (a module
global's __del__, which only the teardown runs), and the exit status is the one asked for.
"""

import os
import subprocess
import sys

from tests.conftest import BASE_DIR

SCRIPT = """
import atexit, sys, threading, types, weakref
marker, torch_loaded, worker, mode = sys.argv[1], sys.argv[2] == "torch", sys.argv[3] == "thread", sys.argv[4]
if torch_loaded:
    sys.modules["torch"] = types.ModuleType("torch")

def note(text):
    with open(marker, "a") as fh:
        fh.write(text + "\\n")

atexit.register(note, "atexit")
class Thing:
    pass
thing = Thing()
weakref.finalize(thing, note, "finalizer")
class Loud:
    def __del__(self, path=marker, open=open):  # its own references: the teardown clears the globals
        with open(path, "a") as fh:
            fh.write("teardown\\n")
loud = Loud()  # a module global: only the interpreter's teardown deletes it
release = threading.Event()
if worker:  # a non-daemon thread still running: a normal exit waits for it
    threading.Thread(target=lambda: (release.wait(10), note("thread done"))).start()
sys.stdout.write("summary, no newline yet")
import ctypes
ctypes.CDLL(None).printf(b"C-level line, no newline")  # in C's stdio buffer: os._exit alone loses it
from core import fast_exit
if mode != "not asked":
    fast_exit.request()  # what ModelCommand.run_from_argv does after a success
if mode == "traced":
    sys.settrace(lambda *args: None)
fast_exit.exit_skipping_teardown(3)
note("returned")
release.set()
"""


PY_OUT, C_OUT = "summary, no newline yet", "C-level line, no newline"


def run(tmp_path, *, torch: bool, thread: bool = False, mode: str = "asked"
        ) -> tuple[subprocess.CompletedProcess, list[str]]:
    marker = tmp_path / "marker.txt"
    # Buffered output, as in a developer's shell (the Dockerfile and CI may set PYTHONUNBUFFERED).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(marker), "torch" if torch else "-",
                           "thread" if thread else "-", mode], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, marker.read_text().splitlines()


def test_after_torch_the_process_ends_with_callbacks_and_output_but_no_teardown(tmp_path):
    proc, notes = run(tmp_path, torch=True)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout in (PY_OUT + C_OUT, C_OUT + PY_OUT)
    assert proc.stderr == ""
    # atexit callbacks run last-registered first: weakref's own exit hook came after ours.
    assert notes == ["finalizer", "atexit"]


def test_without_torch_it_returns_and_the_process_exits_as_usual(tmp_path):
    proc, notes = run(tmp_path, torch=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout in (PY_OUT + C_OUT, C_OUT + PY_OUT)
    assert notes == ["returned", "finalizer", "atexit", "teardown"]


def test_a_running_non_daemon_thread_is_waited_for(tmp_path):
    proc, notes = run(tmp_path, torch=True, thread=True)
    assert proc.returncode == 0, proc.stderr
    assert notes == ["returned", "thread done", "finalizer", "atexit", "teardown"]


def test_it_returns_unless_a_model_command_asked_or_under_a_tracer(tmp_path):
    """`shell` and the other commands do not ask; cProfile, coverage and pdb act at the normal exit."""
    for mode in ("not asked", "traced"):
        proc, notes = run(tmp_path, torch=True, mode=mode)
        assert proc.returncode == 0, proc.stderr
        assert notes[:3] == ["returned", "finalizer", "atexit"], mode
        assert proc.stdout in (PY_OUT + C_OUT, C_OUT + PY_OUT)
        (tmp_path / "marker.txt").unlink()
