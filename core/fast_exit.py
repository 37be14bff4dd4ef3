"""Ending a model command's process without waiting for the interpreter's teardown.

After a command has written its output and closed its database connections, CPython still
finalises every module before the process ends. Once torch is imported that takes 0.45-0.7 s on
a 2-core machine, and 1.1-1.6 s once transformers' model modules (which import torch._dynamo
and torch.distributed) are loaded too: freeing every module's objects and libtorch's own static
destructors, none of it work anyone waits for. Measured with `python -c "import torch"`, and in
`manage.py evaluate_rm` as the time between the command's last line and the process's end
(benchmarks/README.md, round 4).

Opt-in, command-line only: a command that loads models derives from `ModelCommand`, whose
`run_from_argv` (the command-line path; `call_command` never takes it) asks for the fast exit
once the command succeeded, and `manage.py` calls `exit_skipping_teardown` after the command.
Other commands (`shell`, whose code may hold unclosed files in globals, included) end as usual.

`exit_skipping_teardown` keeps what a normal exit does that matters to anyone (the atexit
callbacks: logging's flush, weakref finalizers such as temporary folders, file-lock release;
then flushing Python's and C's standard streams) and skips the rest with `os._exit`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading

from django.core.management.base import BaseCommand

_requested = False


def request() -> None:
    """Ask `exit_skipping_teardown` to end the process (ModelCommand, after a success)."""
    global _requested
    _requested = True


class ModelCommand(BaseCommand):
    """A management command that loads torch models: run from `manage.py`, its process ends
    without the interpreter's teardown once it succeeded (see the module's docstring)."""

    def run_from_argv(self, argv):
        super().run_from_argv(argv)  # a failure exits (CommandError) or raises before this line
        request()


def exit_skipping_teardown(code: int = 0) -> None:
    """End the process now with exit status `code`, running atexit callbacks and flushing the
    standard streams first, when a ModelCommand asked for it and torch was imported.

    Returns without ending the process, for the caller to exit the usual way, when not asked,
    when torch is not loaded, under a profiler, tracer or debugger (cProfile, coverage, pdb
    write or act at the normal exit), with `python -i`, when another non-daemon thread is still
    running (a normal exit waits for it), when this Python has no `atexit._run_exitfuncs`
    (CPython's, since 3.0), or when flushing a stream fails (e.g. a closed pipe: the normal exit
    reports that and sets status 120, as it always has).
    """
    if not _requested or "torch" not in sys.modules:
        return
    if sys.getprofile() is not None or sys.gettrace() is not None or sys.flags.interactive:
        return
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None or not _flushed():
        return
    run_exitfuncs()  # clears the registry: a normal exit after this runs none of them twice
    if not _flushed():
        return
    try:  # C's stdio buffers (output written by C or C++ code), which os._exit does not flush
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        return
    os._exit(code)


def _flushed() -> bool:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return False
    return True
