"""Ending a command-line process that loaded torch without waiting for the interpreter's teardown.

After a command has written its output and closed its database connections, CPython still
finalises every module before the process ends. Once torch is imported that takes 0.5 s on a
2-core machine, and 1.0-1.5 s once transformers' model modules (which import torch._dynamo and
torch.distributed) are loaded too: freeing every module's objects and libtorch's own static
destructors, none of it work anyone waits for. Measured with `python -c "import torch"`, and
in `manage.py evaluate_rm` as the time between the command's last line and the process's end
(benchmarks/README.md, round 4).

`exit_skipping_teardown` keeps what a normal exit does that matters to anyone (the atexit
callbacks: logging's flush, weakref finalizers such as temporary folders, file-lock release,
coverage's data file; then flushing stdout and stderr) and skips the rest with `os._exit`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_skipping_teardown(code: int = 0) -> None:
    """End the process now with exit status `code`, running atexit callbacks and flushing the
    standard streams first, when torch was imported (the teardown worth skipping).

    Returns without ending the process, for the caller to exit the usual way, when torch is not
    loaded, when another non-daemon thread is still running (a normal exit waits for it), when
    this Python has no `atexit._run_exitfuncs` (CPython's, since 3.0), or when flushing a
    stream fails (e.g. a closed pipe: the normal exit reports that as it always has).
    """
    if "torch" not in sys.modules:
        return
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    run_exitfuncs()  # clears the registry: nothing runs twice
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
