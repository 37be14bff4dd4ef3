"""The one client module through which every LLM call goes.

A `ChatBackend` turns chat messages into answers (`answers.Answer`: text, finish reason, token
usage, refusal flag). Callers go through `ask`, the one answer policy (truncated answers asked
again with a larger budget, refusals once more with the next seed, then AnswerError with that
reason). Three implementations:

- `OpenAIChatBackend`: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, ...),
  through the openai SDK and its own retries (server-directed waits honoured up to a cap), a
  request timeout, a concurrency limit, token/cost/wait accounting and cancellation.
- `LocalCausalLMBackend`: a causal LM in a local folder (safetensors only, no remote code).
- `CachedBackend`: wraps either and stores each successful answer as one JSON file keyed by
  a hash of everything that determines it, so a rerun sends no request it already paid for.

Tests replace the endpoint (a fake server on a loopback socket) or the model folder (a tiny
random model), never this module. Heavy imports (openai, torch, transformers) happen only
when a backend is built, so importing this module is cheap. No Django here.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from prblib.llm.answers import (Answer, AnswerError, clean_answer, finish_failure, is_refusal, json_schema_of,
                                 message_parts)
from prblib.errors import ModelError
from prblib.files import KeyedFiles
from prblib.rows import load_json

Messages = list[dict[str, str]]
T = TypeVar("T")
R = TypeVar("R")


Completion = Answer  # the name callers knew before the answer type moved to answers.py


@runtime_checkable
class ChatBackend(Protocol):
    backend_id: str  # identifies the endpoint or model folder (part of cache keys)
    model: str
    concurrency: int  # how many requests may usefully run at once (1 = run in the caller's thread)

    def complete(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None,
                 n: int = 1, schema: Any = None, top_p: float | None = None) -> list[Answer]:
        """Return n answers for the messages; raise ModelError (AnswerError with a reason where one
        applies) when none can be had. `schema` (a pydantic-compatible type): the caller wants JSON
        of that shape, and a backend that can ask for it does. `top_p` in (0, 1]: nucleus sampling
        (None: not set, the backend's default, which is 1 for OpenAI-compatible servers)."""

    def record_event(self, name: str) -> None:
        """Count one answer event (e.g. "truncated_retried"); shown in `usage()["events"]`."""

    def cancel(self) -> None:
        """Stop waiting and sending: used when a job must stop (time limit, cancel)."""

    @property
    def cancelled(self) -> bool:
        """True once cancel() stopped this backend for good: a new job needs a new one."""


def chat_template_of(tokenizer: Any) -> tuple[str | None, dict[str, str]]:
    """(the tokenizer's chat template source or None, its special tokens by name: bos_token, ...)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default")
    special = {k: v for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items() if isinstance(v, str)}
    return (template if isinstance(template, str) and template.strip() else None), special


def messages_as_text(messages: Sequence[dict[str, str]]) -> str:
    """A readable rendering of chat messages (for --dump-inputs and the plain prompt format)."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` must stop the whole job rather than be reported for one item: a time limit
    raised into this thread (Celery's SoftTimeLimitExceeded, from billiard; recognised by its class
    name because this module imports no Celery) or anything that is not an Exception (KeyboardInterrupt,
    SystemExit). Per-item error handlers (`generate_many`, `plan_many`, `sample_responses`,
    `judge_answers`) re-raise these: with one request at a time an item runs in the caller's
    thread, where the time limit lands."""
    if not isinstance(exc, Exception):
        return True
    return any(cls.__name__ == "SoftTimeLimitExceeded" for cls in type(exc).__mro__)


def run_unordered(backend: Any, fn: Callable[[T], R], items: Iterable[T], *,
                  idle: Callable[[], None] | None = None) -> Iterator[R]:
    """Apply fn to every item and yield the results as they finish (any order).

    With a backend whose concurrency is above 1, up to that many items run at once on a thread
    pool; the backend's own semaphore bounds in-flight requests in any case. Otherwise the items
    run one by one in the caller's thread (a local model is not shared between threads). The
    first exception stops the work: items not yet started are cancelled and it is re-raised.
    `idle`, when given, is called in the caller's thread at least once a second while items run
    (e.g. to show a retry wait that a worker thread is in; worker threads must not write to the
    caller's database connection).

    Stopping does not wait for requests in flight. When anything interrupts the caller (an
    exception from fn, Celery's soft time limit raised in the caller's thread, the consumer
    closing the generator, the backend cancelled from another thread: checked every second), the backend is cancelled (its retry waits end and it sends no further
    attempt) and control returns at once; a request already on the wire runs out in its thread,
    bounded by the backend's timeout, and a cached backend still stores its answer.
    """
    workers = max(1, int(getattr(backend, "concurrency", 1) or 1))
    if workers == 1:
        for item in items:
            yield fn(item)
        return
    pending_items = iter(items)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm")
    running: set[Future] = set()
    finished = False
    try:
        # Keep at most 2x workers submitted so a huge benchmark is not queued all at once.
        for item in pending_items:
            running.add(pool.submit(fn, item))
            if len(running) >= 2 * workers:
                break
        while running:
            done, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            if idle is not None:
                idle()
            if getattr(backend, "cancelled", False) and not done:
                # Cancelled from another thread (a job's cancel, seen by its heartbeat): return now,
                # without waiting for requests still on the wire to time out.
                raise AnswerError("cancelled", "the requests were cancelled (the job was stopped)")
            for future in done:
                result = future.result()
                for item in pending_items:
                    running.add(pool.submit(fn, item))
                    break
                yield result
        finished = True
    finally:
        if not finished:
            cancel = getattr(backend, "cancel", None)
            if cancel is not None:
                cancel()
        pool.shutdown(wait=finished, cancel_futures=True)


# --------------------------------------------------------------------------------------------
# The answer policy every caller goes through


def ask(backend: Any, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None, n: int = 1,
        what: str = "answer", refusals: str = "retry", schema: Any = None,
        top_p: float | None = None) -> list[Answer]:
    """n answers from `backend`, none of them truncated or (unless refusals="keep") refused.

    - An answer that stopped at the token cap (finish reason "length") is never returned: the
      request is sent once more with twice the budget (max_tokens * 2); if an answer is still
      truncated, AnswerError("truncated").
    - A refusal (`answers.is_refusal`, or flagged by the endpoint) is asked once more with the next
      seed (seed + 1; a different request, so a cache does not answer it with the same refusal);
      still refused -> AnswerError("refused"). refusals="keep" returns refusals as they are (a
      policy's refusal is a legitimately bad Best-of-N sample).
    - An empty answer (`Answer.empty`: nothing but reasoning, or nothing at all) is never
      returned: AnswerError("no_answer"), with the reasoning kept on the error for display.
      refusals="keep" returns it as it is (a policy's empty answer is a bad Best-of-N sample).
    - `schema`: the caller wants JSON of that shape; passed to the backend (response_format).
    - `top_p`: nucleus sampling, passed to the backend only when set (None: the backend's default).

    Each retry and each failure is counted on the backend (`record_event`: "truncated_retried",
    "truncated", "refused_retried", "refused", "no_answer"), so a job's summary shows how often it
    happened.
    `what` names the answer in messages ("chosen answer", "plan", "judge verdict", ...).
    """
    if refusals not in ("retry", "keep"):
        raise ModelError(f"refusals must be 'retry' or 'keep', not {refusals!r}")
    params = dict(temperature=temperature, max_tokens=max_tokens, seed=seed, n=n, schema=schema)
    if top_p is not None:
        params["top_p"] = top_p
    answers = backend.complete(messages, **params)
    if not answers:
        raise ModelError(f"the model returned no {what}")
    if any(a.truncated for a in answers):
        backend.record_event("truncated_retried")
        params["max_tokens"] = max_tokens * 2
        answers = backend.complete(messages, **params)
        if not answers or any(a.truncated for a in answers):
            backend.record_event("truncated")
            raise AnswerError("truncated", f"the {what} stopped at the token limit twice "
                                           f"({max_tokens} then {max_tokens * 2} tokens)",
                              text=answers[0].text if answers else "")
    if refusals == "retry" and any(a.refused for a in answers):
        backend.record_event("refused_retried")
        params["seed"] = (seed or 0) + 1
        answers = backend.complete(messages, **params)
        if not answers or any(a.refused for a in answers) or any(a.truncated for a in answers):
            reason = "truncated" if answers and not any(a.refused for a in answers) else "refused"
            backend.record_event(reason)
            first = next((a.text for a in answers if a.refused), answers[0].text if answers else "")
            raise AnswerError(reason, f"the model refused the {what} twice: {_short(first, 120)!r}"
                              if reason == "refused" else f"the {what} stopped at the token limit", text=first)
    if refusals == "retry" and any(a.empty for a in answers):
        backend.record_event("no_answer")
        empty = next(a for a in answers if a.empty)
        only = " (the endpoint sent only reasoning)" if empty.reasoning else ""
        raise AnswerError("no_answer", f"the model gave an empty {what}{only}", reasoning=empty.reasoning)
    return answers


# --------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints

DEFAULT_MAX_RETRY_WAIT = 120.0  # seconds: the longest server-directed wait (Retry-After) honoured


def _openai_client_class() -> type:
    """The openai SDK client with its own retry loop kept (it decides what to retry and parses
    Retry-After in all three forms: retry-after-ms, seconds and HTTP-date) and three changes:
    the backoff and the cap on a server-directed wait come from the backend, every attempt and
    wait is counted, and a wait ends at once when the backend is cancelled."""
    import openai

    class Client(openai.OpenAI):
        owner: "OpenAIChatBackend"

        def _prepare_request(self, request: Any) -> None:  # one call per HTTP attempt
            self.owner._before_attempt()
            return super()._prepare_request(request)

        def _server_wait(self, headers: Any) -> float | None:
            wait = self._parse_retry_after_header(headers)
            return wait if wait is not None and math.isfinite(wait) and wait > 0 else None

        def _should_retry(self, response: Any) -> bool:
            wait = self._server_wait(response.headers)
            if wait is not None and wait > self.owner.max_retry_wait:
                response.close()
                raise AnswerError("rate_limited", f"endpoint {self.owner.base_url} answered {response.status_code} "
                                                  f"and asked to wait {wait:g} s, more than max_retry_wait "
                                                  f"({self.owner.max_retry_wait:g} s)")
            if wait is not None:  # within our cap, which may be above the SDK's own
                return True
            return super()._should_retry(response)

        def _calculate_retry_timeout(self, remaining_retries: int, options: Any, response_headers: Any = None) -> float:
            wait = self._server_wait(response_headers)
            if wait is not None and wait <= self.owner.max_retry_wait:
                return wait
            return self.owner.backoff_delay(self.owner.max_retries - remaining_retries)

        def _sleep_for_retry(self, *, retries_taken: int, max_retries: int, options: Any, response: Any) -> None:
            headers = response.headers if response is not None else None
            delay = self._calculate_retry_timeout(max_retries - retries_taken, options, headers)
            self.owner._check_deadline(delay, retries_taken + 1, server_directed=self._server_wait(headers) is not None)
            self.owner._wait(delay, server_directed=self._server_wait(headers) is not None,
                             status=response.status_code if response is not None else None)

    return Client


class OpenAIChatBackend:
    """An OpenAI-compatible chat-completions endpoint, through the openai SDK and its retries.

    The SDK retries (up to `max_retries` after the first attempt) 408, 409, 429, 5xx, timeouts and
    connection errors. A server-directed wait (headers retry-after-ms, Retry-After in seconds or
    as an HTTP-date) is honoured up to `max_retry_wait` seconds; a longer one fails the request at
    once with reason "rate_limited". Without one, the wait is `min(backoff_max, backoff_base *
    2**attempt)` times a random factor in [0.5, 1]. Other errors (400, 401, 404, ...) fail at once.
    `deadline` (seconds, default twice `timeout`) bounds one request with all its retries and
    waits: a retry that could not start before it fails the request with reason "timed_out",
    so a hanging endpoint costs a wave of concurrent requests about `deadline`, not
    (max_retries + 1) x timeout plus the backoff. `concurrency` bounds requests in flight across all threads. Prices, when given, are per 1,000
    tokens and make `cost` a number. `on_wait(seconds, why)` (settable) hears of every wait before
    it starts, so a job can show it; `cancel()` ends every wait and refuses further attempts.

    Requests that ask for JSON (`schema`) carry `response_format` as the endpoint declares it
    (`response_format`: "json_schema", the default, sends the schema; "json_object" asks for any
    JSON object; "none" sends nothing). An endpoint that answers 400 naming response_format is
    asked once more without it and never again with it (`response_format` becomes "none", event
    "response_format_refused"), so the caller can remember that for the endpoint. The answer is
    read by the caller's structured-answer parser either way (fenced or bare JSON).

    Capabilities, learned the same way (`capabilities()` gives them, so the caller can store
    them on the endpoint): `token_parameter` ("max_tokens", or "max_completion_tokens" which
    hosted reasoning models want), `accepts_temperature` (False: temperature is not sent, the
    server's default 1 applies), `accepts_seed` (False: no seed is sent), `accepts_n` (False: n
    answers are n requests, sample i seeded `sample_seed(seed, i)`), `reasoning_effort` (sent
    when set; None once refused). A 400 or 422 whose `param` or message names one of these
    parameters as not supported (`_refused_parameter`) switches it, counts event
    "<parameter>_refused" and sends the request again, once per parameter.

    Every answer goes through the one normaliser (`_read`, `answers.message_parts`,
    `answers.clean_answer`, `answers.finish_failure`) before it is returned, so a cache
    never sees a raw one: a finish reason other than complete or cut raises (abort and error
    are sent again up to max_retries times, event "aborted_retried"); an HTTP 200 whose body is
    an error and has no choices raises AnswerError("endpoint_error") with the server's own
    message; choices without an index keep the order received; a response without usage counts
    in `requests_without_usage` and makes `cost` unknown (None).
    """

    RESPONSE_FORMATS = ("json_schema", "json_object", "none")
    TOKEN_PARAMETERS = ("max_tokens", "max_completion_tokens")

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 60.0,
                 deadline: float | None = None, max_retries: int = 4, concurrency: int = 8, backoff_base: float = 1.0,
                 backoff_max: float = 30.0, max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
                 price_prompt_per_1k: float | None = None, price_completion_per_1k: float | None = None,
                 response_format: str = "json_schema", token_parameter: str = "max_tokens",
                 accepts_temperature: bool = True, accepts_seed: bool = True, accepts_n: bool = True,
                 reasoning_effort: str | None = None,
                 sleep: Callable[[float], None] | None = None, rng: random.Random | None = None):
        if not base_url:
            raise ModelError("an OpenAI-compatible backend needs a base_url")
        if not model:
            raise ModelError("an OpenAI-compatible backend needs a model name")
        if timeout <= 0 or max_retries < 0 or concurrency < 1 or max_retry_wait < 0 or (deadline is not None
                                                                                        and deadline <= 0):
            raise ModelError("timeout and deadline must be > 0, max_retries >= 0, concurrency >= 1 and "
                             "max_retry_wait >= 0")
        if response_format not in self.RESPONSE_FORMATS:
            raise ModelError(f"response_format must be one of {', '.join(self.RESPONSE_FORMATS)}, "
                             f"not {response_format!r}")
        if token_parameter not in self.TOKEN_PARAMETERS:
            raise ModelError(f"token_parameter must be one of {', '.join(self.TOKEN_PARAMETERS)}, "
                             f"not {token_parameter!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.backend_id = f"openai:{self.base_url}"
        self.timeout = float(timeout)
        self.deadline = float(deadline) if deadline is not None else 2 * self.timeout
        self._started = threading.local()  # when the current thread's request began (monotonic)
        self.max_retries = int(max_retries)
        self.concurrency = int(concurrency)
        self.backoff_base, self.backoff_max = float(backoff_base), float(backoff_max)
        self.max_retry_wait = float(max_retry_wait)
        self.price_prompt_per_1k, self.price_completion_per_1k = price_prompt_per_1k, price_completion_per_1k
        self.on_wait: Callable[[float, str], None] | None = None
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._semaphore = threading.BoundedSemaphore(self.concurrency)
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self.response_format = response_format  # becomes "none" when the endpoint refuses it
        self.token_parameter = token_parameter
        self.accepts_temperature, self.accepts_seed, self.accepts_n = (bool(accepts_temperature), bool(accepts_seed),
                                                                       bool(accepts_n))
        self.reasoning_effort = reasoning_effort or None
        self.requests = 0  # HTTP attempts, failed ones included
        self.successes = 0
        self.requests_without_usage = 0  # answered requests whose response reported no token usage
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.waits = 0
        self.waited_seconds = 0.0
        self.server_waits = 0  # waits the endpoint directed (Retry-After and friends)
        self.events: collections.Counter[str] = collections.Counter()
        # Local endpoints often need no key; the SDK insists on one, so send a placeholder.
        self._client = _openai_client_class()(base_url=self.base_url, api_key=api_key or "no-key",
                                               timeout=self.timeout, max_retries=self.max_retries)
        self._client.owner = self

    @property
    def json_mode(self) -> bool:
        """Whether JSON requests still carry response_format."""
        return self.response_format != "none"

    def capabilities(self) -> dict[str, Any]:
        """What the endpoint takes, as configured and learned so far (the LLMEndpoint fields)."""
        return {"response_format": self.response_format, "token_parameter": self.token_parameter,
                "accepts_temperature": self.accepts_temperature, "accepts_seed": self.accepts_seed,
                "accepts_n": self.accepts_n, "reasoning_effort": self.reasoning_effort or ""}

    @property
    def cost(self) -> float | None:
        """The bill from the tokens the endpoint reported; None without prices, and None (unknown,
        never a guess) once any answered request reported no usage."""
        if self.price_prompt_per_1k is None and self.price_completion_per_1k is None:
            return None
        if self.requests_without_usage:
            return None
        return (self.prompt_tokens * (self.price_prompt_per_1k or 0.0)
                + self.completion_tokens * (self.price_completion_per_1k or 0.0)) / 1000.0

    def usage(self) -> dict[str, Any]:
        """requests (HTTP attempts), successes, requests_without_usage (answered without token
        usage: their tokens are unknown, and so is the cost), prompt/completion tokens (those
        reported), cost (None without prices or when unknown), waits and waited_seconds (retry
        waits; server_waits of them directed by the endpoint), events (answers retried or failed,
        by reason: see `ask`; parameters the endpoint refused; finish reasons missing)."""
        with self._lock:
            return {"requests": self.requests, "successes": self.successes,
                    "requests_without_usage": self.requests_without_usage,
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                    "cost": self.cost, "waits": self.waits, "waited_seconds": round(self.waited_seconds, 3),
                    "server_waits": self.server_waits, "events": dict(self.events)}

    def record_event(self, name: str) -> None:
        with self._lock:
            self.events[name] += 1

    def backoff_delay(self, attempt: int) -> float:
        return min(self.backoff_max, self.backoff_base * (2 ** attempt)) * self._rng.uniform(0.5, 1.0)

    def cancel(self) -> None:
        """Stop: waits end at once and no further attempt is sent (requests in flight run out)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        """True once cancel() was called: this backend sends nothing more; build a new one."""
        return self._cancelled.is_set()

    def _check_deadline(self, delay: float, attempt: int, *, server_directed: bool) -> None:
        """Refuse a retry that would start after this request's deadline (AnswerError "timed_out").
        Waits the server directed (Retry-After) do not count: max_retry_wait bounds each of them."""
        started = getattr(self._started, "at", None)
        if started is None:
            return
        if server_directed:
            self._started.directed += delay
            return
        if time.monotonic() + delay - started - self._started.directed > self.deadline:
            self.record_event("deadline")
            raise AnswerError("timed_out", f"endpoint {self.base_url} gave no answer within the request deadline "
                                           f"of {self.deadline:g} s ({attempt} attempt{'s' if attempt != 1 else ''}, "
                                           f"timeout {self.timeout:g} s each)")

    def _before_attempt(self) -> None:
        if self._cancelled.is_set():
            raise AnswerError("cancelled", f"requests to {self.base_url} were cancelled")
        with self._lock:
            self.requests += 1

    def _wait(self, seconds: float, *, server_directed: bool, status: int | None, why: str | None = None) -> None:
        why = why or (f"the endpoint answered {status} and asked to wait {seconds:g} s" if server_directed
                      else f"retrying after {'status ' + str(status) if status else 'a failed attempt'}")
        with self._lock:
            self.waits += 1
            self.server_waits += int(server_directed)
            self.waited_seconds += seconds
        if self.on_wait is not None:
            self.on_wait(seconds, why)
        if self._sleep is not None:
            self._sleep(seconds)
        if self._cancelled.wait(0 if self._sleep is not None else seconds):
            raise AnswerError("cancelled", f"requests to {self.base_url} were cancelled")

    def complete(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None,
                 n: int = 1, schema: Any = None, top_p: float | None = None) -> list[Answer]:
        if self._cancelled.is_set():  # before waiting for a slot that requests in flight may hold
            raise AnswerError("cancelled", f"requests to {self.base_url} were cancelled")
        if n > 1 and not self.accepts_n:
            answers = []
            for i in range(n):
                answers += self.complete(messages, temperature=temperature, max_tokens=max_tokens,
                                         seed=sample_seed(seed, i), n=1, schema=schema, top_p=top_p)
            return answers
        aborted = 0
        while True:
            try:
                return self._send(messages, temperature=temperature, max_tokens=max_tokens, seed=seed, n=n,
                                  schema=schema, top_p=top_p)
            except AnswerError as exc:
                if exc.reason != "aborted":
                    raise
                if aborted >= self.max_retries:
                    self.record_event("aborted")
                    raise AnswerError("aborted", f"{exc} ({aborted + 1} attempts)", text=exc.text,
                                      reasoning=exc.reasoning) from None
                self.record_event("aborted_retried")
                self._wait(self.backoff_delay(aborted), server_directed=False, status=None,
                           why="retrying: the endpoint aborted the answer")
                aborted += 1

    def _params(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None, n: int,
                schema: Any, top_p: float | None) -> dict[str, Any]:
        """The request's parameters, as far as the endpoint takes them (its capabilities)."""
        params: dict[str, Any] = {"model": self.model, "messages": messages, self.token_parameter: max_tokens,
                                  "timeout": self.timeout}
        if self.accepts_n:
            params["n"] = n
        if self.accepts_temperature:
            params["temperature"] = temperature
        if seed is not None and self.accepts_seed:
            params["seed"] = seed
        if top_p is not None:
            params["top_p"] = top_p
        if self.reasoning_effort:
            params["reasoning_effort"] = self.reasoning_effort
        if schema is not None and self.response_format == "json_schema":
            params["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": json_schema_of(schema)}}
        elif schema is not None and self.response_format == "json_object":
            params["response_format"] = {"type": "json_object"}
        return params

    def _send(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None, n: int,
              schema: Any, top_p: float | None) -> list[Answer]:
        """One request (the SDK's retries included), sent again without each parameter the
        endpoint refuses (once per parameter); the answer normalised (`_read`)."""
        import openai

        attempts = self.max_retries + 1
        plural = "s" if attempts != 1 else ""
        adapted: set[str] = set()
        while True:
            params = self._params(messages, temperature=temperature, max_tokens=max_tokens, seed=seed, n=n,
                                  schema=schema, top_p=top_p)
            try:
                with self._semaphore:
                    self._started.at = time.monotonic()  # the deadline counts from a slot, not the queue for one
                    self._started.directed = 0.0
                    raw = self._client.chat.completions.with_raw_response.create(**params)
                    body = raw.text
            except openai.APITimeoutError:
                raise AnswerError("timed_out", f"endpoint {self.base_url} did not answer within {self.timeout:g} s "
                                               f"after {attempts} attempt{plural}") from None
            except openai.APIConnectionError as exc:
                raise ModelError(f"endpoint {self.base_url} could not be reached ({exc.__cause__ or exc}) "
                                 f"after {attempts} attempt{plural}") from None
            except openai.APIStatusError as exc:
                status = exc.status_code
                refused = self._refused_parameter(exc, params) if status in (400, 422) else None
                if refused is not None and refused not in adapted:
                    adapted.add(refused)
                    self._adapt(refused)
                    if refused == "n" and n > 1:  # n answers are now n requests
                        return self.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=seed,
                                             n=n, schema=schema, top_p=top_p)
                    continue
                if status in (408, 409, 429) or status >= 500:
                    reason = "rate_limited" if status == 429 else ""
                    message = f"endpoint {self.base_url} answered {status} after {attempts} attempt{plural}"
                    raise (AnswerError(reason, message) if reason else ModelError(message)) from None
                body = exc.body if isinstance(exc.body, dict) else {}
                message = _error_message(body) or str(exc.message)  # the server's words, not the SDK's prefix
                raise ModelError(f"endpoint {self.base_url} answered {status} for model {self.model!r}: "
                                 f"{_short(message)}") from None
            except openai.OpenAIError as exc:  # malformed answers and the like: not worth retrying
                raise ModelError(f"endpoint {self.base_url} gave an unusable answer: {_short(str(exc))}") from None
            return self._read(body)

    # A refusal of a parameter in an error message (beyond naming it): the words servers use.
    _REFUSAL_WORDS = re.compile(r"unsupported|not supported|does not support|doesn't support|not allowed|"
                                r"not permitted|unknown|unrecognized|unrecognised|extra inputs|extra_forbidden|"
                                r"only the default|must be 1\b|instead", re.IGNORECASE)

    def _refused_parameter(self, exc: Any, params: dict[str, Any]) -> str | None:
        """The parameter of `params` that a 400/422 refuses, when it is one the backend can do
        without or spell otherwise: named by the error's `param` field, or in its message (which
        must also say it is not supported, except for response_format, refused by being named)."""
        message = str(getattr(exc, "message", "") or "")
        param = str(getattr(exc, "param", "") or "")
        for name in ("response_format", "max_completion_tokens", "max_tokens", "reasoning_effort", "temperature",
                     "seed", "n"):
            if name not in params:
                continue
            if name == "n":
                named = param == "n" or re.search(r"['\"`]n['\"`]|\bn\s+(?:must|should|is|>|<|=)", message)
            else:
                named = param == name or re.search(rf"(?<![\w]){name}(?![\w])", message)
            if not named:
                continue
            if name == "response_format" or param == name or self._REFUSAL_WORDS.search(message):
                if name == "max_tokens" and "max_completion_tokens" not in message and param != name:
                    continue  # "max_tokens is too large" is not a refusal of the name
                return name
        return None

    def _adapt(self, name: str) -> None:
        """Stop sending (or respell) the refused parameter `name` from now on; counted as an event."""
        if name == "response_format":
            self.response_format = "none"
        elif name == "max_tokens":
            self.token_parameter = "max_completion_tokens"
        elif name == "max_completion_tokens":
            self.token_parameter = "max_tokens"
        elif name == "temperature":
            self.accepts_temperature = False
        elif name == "seed":
            self.accepts_seed = False
        elif name == "n":
            self.accepts_n = False
        elif name == "reasoning_effort":
            self.reasoning_effort = None
        self.record_event(f"{name}_refused")

    def _read(self, text: str) -> list[Answer]:
        """The answers in a chat-completions response body: the one normaliser (see the class
        docstring). Token usage is accounted before a failed answer raises: it was billed."""
        where = f"endpoint {self.base_url}"
        try:
            body = load_json(text or "", constants=True)
        except ValueError:
            raise ModelError(f"{where} gave an unusable answer: not JSON ({_short(text or '', 120)!r})") from None
        if not isinstance(body, dict):
            raise ModelError(f"{where} gave an unusable answer: not a JSON object")
        choices = body.get("choices")
        if not choices:
            error = _error_message(body)
            if error:
                raise AnswerError("endpoint_error", f"{where} answered with an error: {_short(error)}")
            raise ModelError(f"{where} answered with no choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise ModelError(f"{where} gave an unusable answer: choices is not a list of objects")
        if all(_count(c.get("index")) is not None for c in choices):
            choices = sorted(choices, key=lambda c: c["index"])  # else: the order received
        usage = body.get("usage")
        prompt = _count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
        completion = _count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
        known = prompt is not None and completion is not None
        with self._lock:
            self.successes += 1
            if known:
                self.prompt_tokens += prompt
                self.completion_tokens += completion
            else:
                self.requests_without_usage += 1
        answers = []
        for i, choice in enumerate(choices):
            message = choice.get("message")
            if message is None and isinstance(choice.get("text"), str):  # a completions-style choice
                message = {"content": choice["text"]}
            raw_text, reasoning, refusal = message_parts(message)
            text = clean_answer(raw_text)
            finish = choice.get("finish_reason")
            failure = finish_failure(finish, where=where)
            if failure is not None:
                failure.text, failure.reasoning = text, reasoning
                raise failure
            if finish is None:
                self.record_event("finish_reason_missing")
            answers.append(Answer(text, (prompt or 0) if i == 0 else 0, (completion or 0) if i == 0 else 0,
                                  finish_reason=None if finish is None else str(finish),
                                  refused=bool(refusal) or is_refusal(text), reasoning=reasoning))
        return answers


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` asked on its own (index 0 keeps `seed`; None stays None)."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.sha256(f"sample:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _count(value: Any) -> int | None:
    """A token count or index as the endpoint sent it: a non-negative integer, else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return int(value) if value == int(value) else None


def _error_message(body: dict[str, Any]) -> str:
    """The server's own message in an error body: {"error": {"message": ...}}, {"error": "..."},
    vLLM's {"object": "error", "message": ...} or {"detail": ...}; "" when there is none."""
    error = body.get("error")
    if isinstance(error, dict):
        message = error.get("message") or error.get("msg") or json.dumps(error)[:300]
        code = error.get("code") or error.get("type")
        return f"{message} ({code})" if code and str(code) not in str(message) else str(message)
    if isinstance(error, str) and error.strip():
        return error
    if body.get("object") == "error" or "message" in body:
        return str(body.get("message") or "")
    if isinstance(body.get("detail"), (str, list)):
        return str(body["detail"])
    return ""


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------
# Local causal LMs


class LocalCausalLMBackend:
    """A causal LM loaded from a local folder: safetensors weights only, no remote code, no
    downloads. Decoding by transformers' `generate` (see `_decode`): greedy at temperature 0,
    else plain temperature sampling seeded with `seed` (so a seeded request is reproducible).
    Returns only the newly generated tokens, decoded without special tokens; finish_reason
    "stop" when an answer ended with an end-of-sequence token, "length" at the token cap.
    """

    concurrency = 1

    def __init__(self, path: str | os.PathLike, device: str = "cpu", dtype: str = "auto",
                 models_root: str | os.PathLike | None = None):
        from prblib.modelcheck import check_model_folder

        # Refused before transformers opens anything: custom code, pickles, files outside the root.
        folder, _, _ = check_model_folder(Path(path), task="causal-lm",
                                          models_root=Path(models_root) if models_root else None)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from prblib.devices import resolve_device, resolve_dtype

        self.torch = torch
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model = str(folder)
        self.backend_id = f"local:{folder.resolve()}"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            self.lm = AutoModelForCausalLM.from_pretrained(
                folder, use_safetensors=True, local_files_only=True, trust_remote_code=False, dtype=self.dtype)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot load a causal LM from {folder}: {_short(str(exc))}") from None
        self.lm.to(self.device)
        self.lm.eval()
        eos = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.lm.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        self.eos_ids = eos
        self.context_length = int(getattr(self.lm.config, "max_position_embeddings", 0) or 0) or None
        # The chat template, rendered bounded (`chat.render_chat`); one that refuses a system message
        # gets the system text folded into the first user turn (`chat.fold_system`).
        self.chat_template, self.special_tokens = chat_template_of(self.tokenizer)
        self.system_role = True
        if self.chat_template is not None:
            from prblib.chat import ChatTemplateError, system_role_supported

            try:
                self.system_role = system_role_supported(self.chat_template, self.special_tokens)
            except ChatTemplateError as exc:
                raise ModelError(f"model folder {folder.name}: {exc}") from None
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.events: collections.Counter[str] = collections.Counter()

    def render_prompt(self, messages: Messages) -> str:
        """The prompt text: the folder's chat template rendered within bounds (`chat.render_chat`;
        the system text folded into the first user turn when the template refuses a system
        message), or without a template a plain transcript ending where the assistant's turn
        starts. ModelError (one line) when the template refuses these messages or goes past a bound."""
        if self.chat_template is not None:
            from prblib.chat import render_for_model

            return render_for_model(self.chat_template, messages, special_tokens=self.special_tokens)
        return messages_as_text(messages) + "\n\n[assistant]\n"

    def complete(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None,
                 n: int = 1, schema: Any = None, top_p: float | None = None) -> list[Answer]:
        """n answers; finish_reason "stop" when a row ended with an end-of-sequence token, "length"
        when it used all max_tokens (or the model's context). `schema` is not enforced here.
        top_p < 1 samples from the smallest set of tokens whose probability reaches top_p."""
        if self.lm is None:
            raise ModelError("the local model was closed")
        templated = self.chat_template is not None
        # A chat template already writes the special tokens it wants.
        ids = self.tokenizer(self.render_prompt(messages), add_special_tokens=not templated,
                             return_tensors="pt")["input_ids"]
        prompt_len = ids.shape[1]
        if self.context_length is not None:
            if prompt_len >= self.context_length:
                raise ModelError(f"the prompt has {prompt_len} tokens, more than the model's context of "
                                 f"{self.context_length}")
            max_tokens = min(max_tokens, self.context_length - prompt_len)
        new_tokens = self._decode(ids.to(self.device).repeat(n, 1), temperature, max_tokens, seed,
                                  top_p=1.0 if top_p is None else top_p)
        completions = []
        special = list(getattr(self.tokenizer, "all_special_tokens", None) or ())
        for i, (row, ended) in enumerate(new_tokens):
            # The one normaliser, as for endpoints: a reasoning block apart, end-of-turn and the
            # tokenizer's special tokens (also when spelled by ordinary tokens) removed.
            raw_text, reasoning, _ = message_parts({"content": self.tokenizer.decode(row, skip_special_tokens=True)})
            text = clean_answer(raw_text, special)
            completions.append(Answer(text, prompt_len if i == 0 else 0, len(row),
                                      finish_reason="stop" if ended else "length", refused=is_refusal(text),
                                      reasoning=reasoning))
        self.requests += 1
        self.prompt_tokens += prompt_len
        self.completion_tokens += sum(len(r) for r, _ in new_tokens)
        return completions

    def usage(self) -> dict[str, Any]:
        """requests: generate calls run; the rest as OpenAIChatBackend.usage (no cost, no waits)."""
        return {"requests": self.requests, "successes": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cost": None, "events": dict(self.events)}

    def record_event(self, name: str) -> None:
        self.events[name] += 1

    def cancel(self) -> None:
        """Nothing to cancel: a local model runs in the caller's thread, where a time limit lands."""

    @property
    def cancelled(self) -> bool:
        """Always False: cancel() stops nothing here, so the backend stays usable."""
        return False

    def _decode(self, ids: Any, temperature: float, max_tokens: int, seed: int | None,
                top_p: float = 1.0) -> list[tuple[list[int], bool]]:
        """Decode every row of `ids` (LongTensor (rows, prompt tokens), on self.device) with
        transformers' `generate`: greedy at temperature 0, else temperature sampling, with nucleus
        (top-p) filtering when top_p < 1 and no other processor (no top-k; the model's own
        generation_config.json is not applied)
        from torch's generator seeded with `seed` inside `torch.random.fork_rng`, so the caller's
        random state is untouched and a seeded request is reproducible. A row stops at its first
        end-of-sequence id (`eos_ids`) or after max_tokens new tokens.

        Returns one (new token ids, ended) per row: the ids before the end-of-sequence token
        (which is not included), and ended = True when the row stopped at an end-of-sequence
        token, False when it stopped at the token cap (so its answer may be cut off)."""
        torch = self.torch
        from transformers import GenerationConfig

        sample = temperature > 0
        eos = sorted(self.eos_ids)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
        # Every processor is set explicitly: None would be filled from the model's generation_config.json.
        config = GenerationConfig(
            max_new_tokens=int(max_tokens), min_new_tokens=0, do_sample=sample,
            temperature=float(temperature) if sample else 1.0, top_k=0,
            top_p=float(top_p) if sample else 1.0, min_p=0.0, typical_p=1.0,
            epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
            eos_token_id=eos or None, pad_token_id=pad, bos_token_id=None, use_cache=True)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.inference_mode(), torch.random.fork_rng(devices=devices):
            if sample:
                torch.manual_seed(seed if seed is not None else random.randrange(2 ** 63))
            sequences = self.lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                         generation_config=config)
        rows = []
        for row in sequences[:, ids.shape[1]:].tolist():
            end = next((i for i, token in enumerate(row) if token in self.eos_ids), None)
            rows.append((row, False) if end is None else (row[:end], True))
        return rows

    def close(self) -> None:
        if getattr(self, "lm", None) is not None:
            self.lm = None
            import gc

            gc.collect()
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# Cache


class CachedBackend:
    """Answers repeated requests from disk.

    The key is the sha256 of (backend id, model, messages, temperature, max_tokens, seed, n, and the
    JSON schema when one is asked for); an entry keeps each answer's text, usage, finish reason
    and refusal flag (entries written before finish reasons were stored read back as None);
    each answer is one JSON file `<key>.json` under cache_dir (`files.KeyedFiles`: written to a
    temporary file and renamed into place, so concurrent writers and crashes never leave a
    half-written entry; an unreadable entry is asked again and overwritten).
    Only answers are stored: a failure raises in the inner backend before anything is written
    (aborted, filtered, an error body, ...), and a response with an empty answer (nothing left
    but reasoning; `Answer.empty`) is not written either, so a rerun after the server is fixed
    sends the request again. Answers cut at the token cap or refused are stored as what they
    are (their finish reason and flag read back; `llm.ask` decides). Sampling without a seed
    (temperature > 0, seed None) is never cached: such a request asks for a fresh sample each time.
    """

    def __init__(self, inner: Any, cache_dir: str | os.PathLike, backend_id: str | None = None):
        self.inner = inner
        self.cache_dir = Path(cache_dir)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelError(f"cannot create the LLM cache folder {self.cache_dir}: {exc.strerror}") from None
        self._files = KeyedFiles(self.cache_dir, ".json")
        self.backend_id = backend_id or inner.backend_id
        self.model = inner.model
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    @property
    def concurrency(self) -> int:
        return getattr(self.inner, "concurrency", 1)

    def usage(self) -> dict[str, Any]:
        """The inner backend's usage plus cache_hits and cache_misses."""
        return {**self.inner.usage(), "cache_hits": self.hits, "cache_misses": self.misses}

    def record_event(self, name: str) -> None:
        self.inner.record_event(name)

    def cancel(self) -> None:
        self.inner.cancel()

    @property
    def cancelled(self) -> bool:
        return self.inner.cancelled

    @property
    def on_wait(self) -> Callable[[float, str], None] | None:
        return getattr(self.inner, "on_wait", None)

    @on_wait.setter
    def on_wait(self, listener: Callable[[float, str], None] | None) -> None:
        if hasattr(self.inner, "on_wait"):
            self.inner.on_wait = listener

    def key(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None, n: int,
            schema: Any = None, top_p: float | None = None) -> str:
        payload = {"backend": self.backend_id, "model": self.model, "messages": messages,
                   "temperature": temperature, "max_tokens": max_tokens, "seed": seed, "n": n}
        if top_p is not None:  # unset keeps the keys of answers cached before top_p existed
            payload["top_p"] = top_p
        if schema is not None:
            payload["schema"] = json_schema_of(schema)
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def complete(self, messages: Messages, *, temperature: float, max_tokens: int, seed: int | None,
                 n: int = 1, schema: Any = None, top_p: float | None = None) -> list[Answer]:
        params = dict(temperature=temperature, max_tokens=max_tokens, seed=seed, n=n, schema=schema)
        if top_p is not None:
            params["top_p"] = top_p
        if temperature > 0 and seed is None:
            return self.inner.complete(messages, **params)
        key = self.key(messages, **params)
        cached = self._files.read(key, self._load)  # a missing or unreadable entry: ask again and overwrite it
        if cached is not None:
            with self._lock:
                self.hits += 1
            return cached
        completions = self.inner.complete(messages, **params)
        with self._lock:
            self.misses += 1
        if not completions or any(c.empty for c in completions):
            return completions
        entry = {"key": key, "model": self.model, "completions": [asdict(c) for c in completions]}
        self._files.write(key, lambda fh: fh.write(json.dumps(entry, ensure_ascii=False).encode("utf-8")))
        return completions

    @staticmethod
    def _load(fh: Any) -> list[Answer] | None:
        data = json.loads(fh.read().decode("utf-8"))
        answers = []
        for c in data["completions"]:
            # Entries written before answers were normalised are normalised as they are read.
            raw_text, reasoning, _ = message_parts({"content": str(c["text"])})
            text = clean_answer(raw_text)
            answers.append(Answer(text, int(c["prompt_tokens"]), int(c["completion_tokens"]),
                                  finish_reason=c.get("finish_reason"),
                                  refused=bool(c.get("refused")) or is_refusal(text),
                                  reasoning=str(c.get("reasoning") or reasoning)))
        # An entry holding an empty answer (written before empty answers were refused): asked again.
        return answers if answers and not any(a.empty for a in answers) else None

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


# --------------------------------------------------------------------------------------------
# Building a backend from a model spec's options

BACKEND_OPTIONS = ("backend", "base_url", "model", "api_key_env", "timeout", "deadline", "max_retries", "concurrency",
                   "backoff_base", "backoff_max", "max_retry_wait", "price_prompt_per_1k", "price_completion_per_1k",
                   "response_format", "token_parameter", "accepts_temperature", "accepts_seed", "accepts_n",
                   "reasoning_effort", "cache_dir", "cache_key", "models_root")


def runtime_backend(runtime: dict[str, Any] | None) -> dict[str, Any]:
    """The build_backend keys of a ModelSpec.runtime (trusted: set by the platform from a
    staff-configured endpoint, or by an operator's `evaluate_rm --endpoint`)."""
    return {k: v for k, v in (runtime or {}).items() if k in BACKEND_OPTIONS}


def build_backend(options: dict[str, Any], *, path: str = "", device: str = "cpu", dtype: str = "auto") -> Any:
    """The backend described by trusted connection settings (keys in BACKEND_OPTIONS).

    These come from a staff-configured `LLMEndpoint` or an operator, never from a submission's
    options (a researcher choosing base_url or api_key_env could send the worker's secrets
    anywhere): model loaders pass `runtime_backend(spec.runtime)`.

    - {"backend": "openai", "base_url": URL, "model": NAME (default: `path`), "api_key_env": VAR,
      "timeout", "deadline", "max_retries", "concurrency", "backoff_base", "backoff_max", "max_retry_wait" (seconds),
      "price_prompt_per_1k", "price_completion_per_1k", "response_format", and the capabilities
      "token_parameter", "accepts_temperature", "accepts_seed", "accepts_n", "reasoning_effort"
      (see OpenAIChatBackend)}: an OpenAI-compatible endpoint. The key
      is read from the environment variable named by api_key_env; a key itself is never
      accepted.
    - {"backend": "local", "models_root": ROOT}: the causal LM in the folder `path`, on `device`
      with `dtype`; every file it opens must resolve inside ROOT (default: the folder itself).
    "backend" defaults to "openai" when base_url is given, else "local".
    "cache_dir": wrap the backend in a CachedBackend on that folder ("cache_key" joins its key).
    """
    if "api_key" in options:
        raise ModelError("an API key is never accepted in the model options; put it in an environment "
                         "variable on the worker and give that variable's name as api_key_env")
    kind = options.get("backend") or ("openai" if options.get("base_url") else "local")
    if kind == "openai":
        base_url = options.get("base_url")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ModelError("the openai backend needs base_url, an http:// or https:// address")
        model = options.get("model") or path
        if not isinstance(model, str) or not model:
            raise ModelError("the openai backend needs a model name (option 'model')")
        api_key = None
        env_name = options.get("api_key_env")
        if env_name:
            api_key = os.environ.get(str(env_name))
            if not api_key:
                raise ModelError(f"environment variable {env_name} (api_key_env) is not set on this worker")
        numbers = {}
        for name, cast in (("timeout", float), ("deadline", float), ("max_retries", int), ("concurrency", int),
                           ("backoff_base", float), ("backoff_max", float), ("max_retry_wait", float),
                           ("price_prompt_per_1k", float), ("price_completion_per_1k", float)):
            if options.get(name) is not None:
                numbers[name] = _number_option(options, name, cast)
        for name in ("response_format", "token_parameter", "reasoning_effort"):
            if options.get(name) is not None:
                numbers[name] = str(options[name])
        for name in ("accepts_temperature", "accepts_seed", "accepts_n"):
            if options.get(name) is not None:
                if not isinstance(options[name], bool):
                    raise ModelError(f"option {name} must be true or false, not {options[name]!r}")
                numbers[name] = options[name]
        backend: Any = OpenAIChatBackend(base_url, model, api_key, **numbers)
    elif kind == "local":
        if not path:
            raise ModelError("the local backend needs the model folder as the model path")
        backend = LocalCausalLMBackend(path, device=device, dtype=dtype, models_root=options.get("models_root"))
    else:
        raise ModelError(f"unknown LLM backend {kind!r} (known: openai, local)")
    if options.get("cache_dir"):
        # cache_key (e.g. the weights hash) keeps answers of replaced weights in the same
        # folder, or of a redeployed endpoint model, from being served from the cache.
        backend_id = backend.backend_id + (f"@{options['cache_key']}" if options.get("cache_key") else "")
        backend = CachedBackend(backend, options["cache_dir"], backend_id=backend_id)
    return backend


def _number_option(options: dict[str, Any], name: str, cast: type) -> Any:
    value = options[name]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (cast is int and value != int(value))):
        raise ModelError(f"option {name} must be {'an integer' if cast is int else 'a number'}, not {value!r}")
    return cast(value)
