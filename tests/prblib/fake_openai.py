"""A fake OpenAI-compatible chat-completions server on a loopback socket, for tests.

    server = FakeOpenAIServer(responder=lambda request: "Verdict: A").start()
    backend = OpenAIChatBackend(server.base_url, "fake-model", ...)
    ...
    server.requests          # every request: {"path", "headers", "body"} (body = parsed JSON)
    server.max_in_flight     # the most requests handled at once (a request counts until its answer starts
                             # to be written: the client cannot send its next one before that)
    server.stop()

What the server answers, per request, in this order of precedence:
1. the next entry of the script queue (`server.script(...)`, consumed one per request);
2. otherwise `responder(body)`, a callable given the request's JSON body;
3. otherwise the default text "OK".
An entry is a `Reply`, or a plain string (a 200 answer with that text). Helpers build the other
kinds: `status(429)`, `status(500)`, `hang(seconds)` (sleeps, then drops the connection without
answering; use a duration longer than the client timeout), `text(..., delay=, usage=)`,
`truncated(text)` (finish reason "length", as an answer cut at the token cap), `refusal(text)`
(the message's `refusal` field set, content empty, as hosted APIs flag refusals),
`fenced(json_text)` (the text inside a ```json fence) and `rate_limited(seconds=|ms=|date=)`
(a 429 with Retry-After in seconds, retry-after-ms, or Retry-After as an HTTP-date that many
seconds ahead). A body with "response_format" the server cannot take is refused with 400 when
`server.reject_response_format` is set. `raw(body, status=200)` sends `body` exactly (a dict or
list as JSON, a string as it is): the answer shapes real servers send (content chunks, reasoning
fields, null usage, choices without index, an error body with status 200, ...), and `choice(...)`
/ `completion(...)` build such bodies with only the fields a test names.

`fake_openai` below is a pytest fixture that starts one server per test; no import needed in a test
module: tests/conftest.py registers this module as a plugin, so every test can ask for it).
"""

from __future__ import annotations

import collections
import email.utils
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Reply:
    text: str | list[str] = "OK"  # a list gives one choice per entry
    status: int = 200
    delay: float = 0.0  # seconds to wait before answering
    hang: float = 0.0  # > 0: wait this long, then close the connection without an answer
    prompt_tokens: int | None = None  # default: 10
    completion_tokens: int | None = None  # default: number of words in the answer
    headers: dict[str, str] | None = None
    finish_reason: str = "stop"
    refusal: str | None = None
    retry_after_date: float | None = None  # seconds ahead: Retry-After as an HTTP-date, made when sent
    raw: Any = None  # not None: the response body exactly (dict/list as JSON, str as it is)


_UNSET = object()


def raw(body: Any, **kwargs: Any) -> Reply:
    """A reply whose body is `body` exactly (status 200 unless `status=` says otherwise)."""
    return Reply(raw=body, **kwargs)


def choice(content: Any = _UNSET, *, finish_reason: Any = "stop", index: Any = _UNSET, **message: Any) -> dict:
    """One choice: `content` (omitted when not given), extra message fields (reasoning_content=...,
    refusal=...), finish_reason (None sends null, ... omits it) and index (None sends null; not
    given: `completion` numbers it unless indexed=False)."""
    msg: dict[str, Any] = {"role": "assistant"}
    if content is not _UNSET:
        msg["content"] = content
    msg.update(message)
    out: dict[str, Any] = {"message": msg}
    if finish_reason is not ...:
        out["finish_reason"] = finish_reason
    if index is not _UNSET:
        out["index"] = index
    return out


def completion(*choices: dict, usage: Any = _UNSET, indexed: bool = True, **fields: Any) -> dict:
    """A chat-completion body with these choices (numbered 0.. unless indexed=False or a choice has
    its own index), usage {"prompt_tokens": 10, "completion_tokens": 5} unless `usage=` (None sends
    null, ... omits it), and any other top-level fields."""
    body: dict[str, Any] = {"id": "chatcmpl-raw", "object": "chat.completion", "model": "fake-model",
                            "choices": [c if "index" in c or not indexed else {**c, "index": i}
                                        for i, c in enumerate(choices)]}
    if usage is _UNSET:
        body["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    elif usage is not ...:
        body["usage"] = usage
    body.update(fields)
    return body


def truncated(value: str, **kwargs: Any) -> Reply:
    return Reply(text=value, finish_reason="length", **kwargs)


def refusal(message: str = "I can't help with that.", **kwargs: Any) -> Reply:
    return Reply(text="", refusal=message, **kwargs)


def fenced(json_text: str, **kwargs: Any) -> Reply:
    return Reply(text=f"```json\n{json_text}\n```", **kwargs)


def rate_limited(*, seconds: float | None = None, ms: float | None = None, date: float | None = None) -> Reply:
    """A 429 naming a wait in one of the three forms real servers use."""
    if seconds is not None:
        headers = {"Retry-After": f"{seconds:g}"}
    elif ms is not None:
        headers = {"retry-after-ms": f"{ms:g}"}
    else:
        headers = {}
    return Reply(text="fake rate limit", status=429, headers=headers, retry_after_date=date)


def text(value: str | list[str], **kwargs: Any) -> Reply:
    return Reply(text=value, **kwargs)


def status(code: int, **kwargs: Any) -> Reply:
    return Reply(text=f"fake error {code}", status=code, **kwargs)


def hang(seconds: float = 5.0) -> Reply:
    return Reply(hang=seconds)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 drops bursts of parallel connections (1 s SYN retries)


Responder = Callable[[dict], "Reply | str"]


class FakeOpenAIServer:
    def __init__(self, responder: Responder | None = None, *, model: str = "fake-model"):
        self.responder = responder
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.reject_response_format = False
        self.in_flight = 0
        self.max_in_flight = 0
        self._queue: collections.deque[Reply | str] = collections.deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FakeOpenAIServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                server._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes hanging handlers
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    # -- scripting ---------------------------------------------------------------------------
    def script(self, *replies: Reply | str) -> "FakeOpenAIServer":
        with self._lock:
            self._queue.extend(replies)
        return self

    @property
    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests]

    def user_messages(self) -> list[str]:
        """The last user message of every request, in arrival order."""
        return [next(m["content"] for m in reversed(b["messages"]) if m["role"] == "user") for b in self.bodies]

    # -- serving -----------------------------------------------------------------------------
    def _next_reply(self, body: dict) -> Reply:
        with self._lock:
            reply = self._queue.popleft() if self._queue else None
        if reply is None:
            reply = self.responder(body) if self.responder is not None else "OK"
        return Reply(text=reply) if isinstance(reply, str) else reply

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        with self._lock:
            self.requests.append({"path": handler.path, "headers": dict(handler.headers), "body": body})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        counted = [True]

        def release() -> None:
            # Before the answer is written, not after: once the client has it, it may send its next
            # request while this thread has not yet been scheduled to reach `finally`.
            with self._lock:
                if counted[0]:
                    self.in_flight -= 1
                    counted[0] = False

        try:
            if self.reject_response_format and "response_format" in body:
                self._send(handler, Reply(text="response_format is not supported by this server", status=400), body,
                           release)
                return
            reply = self._next_reply(body)
            if reply.hang:
                self._stopping.wait(reply.hang)
                handler.close_connection = True
                return
            if reply.delay:
                self._stopping.wait(reply.delay)
            self._send(handler, reply, body, release)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            release()

    def _send(self, handler: BaseHTTPRequestHandler, reply: Reply, body: dict, release=lambda: None) -> None:
        if reply.raw is not None:
            payload = reply.raw
        elif reply.status != 200:
            payload = {"error": {"message": str(reply.text), "type": "fake_error", "code": reply.status}}
        else:
            n = int(body.get("n") or 1)
            texts = reply.text if isinstance(reply.text, list) else [reply.text] * n
            completion_tokens = (reply.completion_tokens if reply.completion_tokens is not None
                                 else sum(len(t.split()) for t in texts))
            prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else 10
            payload = {
                "id": f"chatcmpl-fake-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [{"index": i, "finish_reason": reply.finish_reason,
                             "message": {"role": "assistant", "content": t, "refusal": reply.refusal}}
                            for i, t in enumerate(texts)],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
            }
        data = payload.encode("utf-8") if isinstance(payload, str) else json.dumps(payload).encode("utf-8")
        release()
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (reply.headers or {}).items():
            handler.send_header(key, value)
        if reply.retry_after_date is not None:
            handler.send_header("Retry-After", email.utils.formatdate(time.time() + reply.retry_after_date,
                                                                      usegmt=True))
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture
def fake_openai():
    server = FakeOpenAIServer().start()
    yield server
    server.stop()
