"""gunicorn settings for `gunicorn prbench.wsgi:application` (read from the working directory;
command-line flags override them).

preload_app: the application (Django set-up, the URLconf and views, prbench.warmup) is loaded
once in the master before forking, so no worker's first request pays ~0.5 CPU s of imports and
the workers share those pages of memory; when_ready and pre_fork freeze that heap for the
garbage collector (below). Workers: WEB_CONCURRENCY (gunicorn's own variable), default
2 x CPUs + 1, each with WEB_THREADS threads (default 4): every thread may hold a database
connection, so PostgreSQL sees up to workers x threads connections from the web service.

Slow clients: the worker class below reads each request head (request line and headers) in the
worker's event loop, without a thread, and hands the connection to a thread only once the head
is complete, so a client that sends its headers byte by byte, or never finishes them, holds a
socket and a buffer but no thread (gunicorn's own gthread worker gives a new connection a
thread as soon as its first byte arrives, and that thread then waits for the rest for as long
as the client takes). A head that has not arrived within WEB_HEADER_TIMEOUT seconds (default
10) is answered 408 and closed. Request bodies and responses are still read and written by
the thread that serves the request. Figures: benchmarks/bench_slow_clients.py.
"""

import errno
import gc
import multiprocessing
import os
import re
import selectors
import time
from collections import deque
from functools import partial

from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import TConn, ThreadWorker


def env_number(name, default, kind=int):
    """A positive number from the environment, or a start-up error naming the variable."""
    raw = os.environ.get(name) or str(default)
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive {'whole ' if kind is int else ''}number")
    return value


HEADER_TIMEOUT = env_number("WEB_HEADER_TIMEOUT", 10, float)
# gunicorn's default limits allow a head of at most ~0.8 MiB (a 4,094-byte request line and 100
# fields of 8,190 bytes): past this the thread's parser answers the limit error by itself.
MAX_HEAD_BYTES = 1 << 20
_BARE_LF = re.compile(rb"(?<!\r)\n")  # gunicorn refuses these heads at once (400): hand them over
_TIMED_OUT = (f"the request head did not arrive within {HEADER_TIMEOUT:g} s\n").encode()
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                    b"Content-Type: text/plain; charset=utf-8\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(_TIMED_OUT), _TIMED_OUT))


class HeadBufferingWorker(ThreadWorker):
    """gunicorn's gthread worker, but a connection reaches a thread only with a whole request
    head: new connections, and kept-alive ones once readable, wait in the event loop (the
    poller gthread already keeps idle kept-alive connections in) while their head arrives."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reading_heads = deque()  # connections whose head is arriving, oldest deadline first

    def buffers_heads(self, conn):
        # TLS and HTTP/2 prior knowledge read their first bytes in the thread (gthread's way).
        return not self.cfg.is_ssl and not negotiation.prior_knowledge_allowed(self.cfg, conn.client)

    def accept(self, listener):
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())  # non-blocking
        if self.buffers_heads(conn):
            self.await_head(conn)
        else:
            self.enqueue_req(conn)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request has begun."""
        if not self.buffers_heads(conn):
            return super().on_client_socket_readable(conn, client)
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self.await_head(conn)

    def await_head(self, conn):
        conn.head = bytearray()
        conn.head_deadline = time.monotonic() + HEADER_TIMEOUT
        self.reading_heads.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.read_head, conn))

    def read_head(self, conn, _sock):
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away before its request was complete
            self.drop_head(conn)
            return
        start = len(conn.head)
        conn.head += data
        if (conn.head.find(b"\r\n\r\n", max(start - 3, 0)) >= 0 or _BARE_LF.search(conn.head, start)
                or len(conn.head) > MAX_HEAD_BYTES):
            self.poller.unregister(conn.sock)
            self.reading_heads.remove(conn)
            conn.data_ready = True  # gthread's handle() then reads at once instead of waiting
            self.enqueue_req(conn)

    def drop_head(self, conn, answer=b""):
        self.poller.unregister(conn.sock)
        self.reading_heads.remove(conn)
        if answer:
            try:
                conn.sock.send(answer)
            except OSError:
                pass
        self.nr_conns -= 1
        conn.close()

    def handle(self, conn):
        """In a thread: give the buffered head to the connection's parser, then serve as gthread."""
        head = getattr(conn, "head", None)
        if head is not None:
            conn.head = None
            conn.sock.setblocking(True)
            conn.init()  # the parser of a new connection (a kept-alive one keeps its own)
            conn.parser.unreader.unread(bytes(head))
        return super().handle(conn)

    def murder_pending(self):
        """Called by gthread's event loop at least once a second: also drop the heads past their
        deadline (408 where a request had begun), and a stopping worker's idle new connections."""
        super().murder_pending()
        now = time.monotonic()
        while self.reading_heads and self.reading_heads[0].head_deadline <= now:
            conn = self.reading_heads[0]
            self.drop_head(conn, TIMEOUT_RESPONSE if conn.head else b"")
        if not self.alive:
            for conn in [c for c in self.reading_heads if not c.head]:
                self.drop_head(conn)


preload_app = True
workers = env_number("WEB_CONCURRENCY", 2 * multiprocessing.cpu_count() + 1)
worker_class = HeadBufferingWorker
threads = env_number("WEB_THREADS", 4)
timeout = 120


def when_ready(server):
    """Once the preloaded application is in the master, before the first worker is forked:
    collect what start-up left unreachable (a frozen cycle would never be freed), then freeze."""
    gc.collect()
    gc.freeze()


def pre_fork(server, worker):
    """Freeze the master's heap (~220,000 objects after the warm-up: Django, the views, the
    statistics modules) before each worker is forked, re-spawned ones included. The cyclic
    garbage collector then never traverses it: a full collection measured ~85 CPU ms before
    freezing and ~0.003 ms after (benchmarks/README.md), and one landing inside a request held it
    up that long. Frozen objects are still freed by reference counting; only cycles among them
    are never collected."""
    gc.freeze()
