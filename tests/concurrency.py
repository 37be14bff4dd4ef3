"""Run one callable in several threads released at once: the harness of every race test.

Each thread opens its own database connection (Django gives every thread one) and closes it
when done, so a transactional PostgreSQL test leaves no connection behind to block the
database's teardown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def race(n: int, work: Callable[[int], Any], *, timeout: float = 120) -> list[Any]:
    """Call ``work(i)`` for i in 0..n-1 in n threads that pass a barrier together.

    Returns a list of length n: ``work(i)``'s return value, or the exception it raised (the
    outcome under test, so it is returned rather than re-raised). A thread still running after
    ``timeout`` seconds leaves ``None`` in its slot.
    """
    barrier, outcomes = threading.Barrier(n), [None] * n

    def one(i: int) -> None:
        try:
            barrier.wait()
            outcomes[i] = work(i)
        except Exception as exc:  # noqa: BLE001 (returned to the test)
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return outcomes
