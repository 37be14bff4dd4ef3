"""What every LLM-backed reward model shares (the pairwise and pointwise judges, P-GenRM): the
backend built from the platform's runtime settings, scoring pairs concurrently, one counted
call per LLM answer, the token bill (`usage`) and `close`.

A subclass names its `kind`, its `unit` (what one LLM call produces: "judgment", "chain") and
implements `judge_pair`; it may extend `check_pair` (checked for every pair before any request
is paid for) and `load`.

Plain Python; no Django.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from prblib.llm.answers import AnswerError
from prblib.rewards.base import ModelSpec, PairInput, PairResult, ProgressFn, check_setting
from prblib.registry import DEFAULT_PROFILE_K
from prblib.llm.client import CachedBackend, Messages, ask, build_backend, run_unordered, runtime_backend

# Answers that came back but cannot be used (`llm.ask` after its one retry, or the backend's
# normaliser): the call counts, the answer is unusable, the pair is scored without it.
# ("aborted" and "endpoint_error" are the server's failures: they raise like a 5xx.)
UNUSABLE = ("truncated", "refused", "no_answer", "filtered", "unfinished")


class GenerativeRewardModel:
    """Base of the reward models that ask an LLM. Thread-safe counters: pairs are judged
    concurrently (`llm.run_unordered`)."""

    kind: ClassVar[str] = ""
    scores_groups: ClassVar[bool] = False  # samples are scored against a reference answer
    unit: ClassVar[str] = "call"  # what one LLM call produces, named in usage()

    def __init__(self, backend: Any, *, temperature: float = 0.0, max_tokens: int = 512, seed: int | None = 0,
                 profile_k: int = DEFAULT_PROFILE_K):
        self.backend = backend
        self.backends = [backend]
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.seed = seed
        self.profile_k = profile_k
        self._lock = threading.Lock()
        self._calls = self._call_prompt_tokens = self._call_completion_tokens = 0

    @staticmethod
    def backend_for(spec: ModelSpec) -> Any:
        """The chat backend of `spec`: a staff endpoint or a local causal-LM folder, from the
        trusted `spec.runtime` (`llm.build_backend`), never from the options."""
        return build_backend(runtime_backend(spec.runtime), path=spec.path, device=spec.device, dtype=spec.dtype)

    # -- scoring -------------------------------------------------------------------------------

    def check_pair(self, pair: PairInput, setting: str) -> None:
        """Refuse (ModelError) a pair this model cannot judge in `setting`."""
        check_setting(setting, pair)

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """One PairResult per pair, in the order they finish; every pair is checked before the
        first request is paid for."""
        pairs = list(pairs)
        for pair in pairs:
            self.check_pair(pair, setting)
        for result in run_unordered(self.backend, lambda pair: self.judge_pair(pair, setting), pairs):
            if progress is not None:
                progress(1)
            yield result

    def judge_pair(self, pair: PairInput, setting: str) -> PairResult:
        raise NotImplementedError

    def call(self, messages: Messages, *, seed: int | None, what: str) -> str:
        """One answer's text from the backend (`call_answer`)."""
        return self.call_answer(messages, seed=seed, what=what).text

    def call_answer(self, messages: Messages, *, seed: int | None, what: str) -> Any:
        """One answer (`answers.Answer`: the text, and the reasoning kept apart) from the backend
        (`llm.ask`: a cut answer asked again with twice the budget, a refusal once more), counted
        in usage() with its tokens. An AnswerError whose reason is in UNUSABLE is counted and
        raised; other request failures raise uncounted."""
        try:
            answers = ask(self.backend, messages, temperature=self.temperature, max_tokens=self.max_tokens,
                          seed=seed, n=1, what=what)
        except AnswerError as exc:
            if exc.reason in UNUSABLE:
                with self._lock:
                    self._calls += 1
            raise
        with self._lock:
            self._calls += 1
            for answer in answers:
                self._call_prompt_tokens += answer.prompt_tokens
                self._call_completion_tokens += answer.completion_tokens
        return answers[0]

    # -- accounting and clean-up ---------------------------------------------------------------

    def usage(self) -> dict[str, Any]:
        """Requests and tokens billed by the backends (summed), requests_without_usage (answered
        without a token count), cost (None without prices, and None when any request's usage is
        unknown: never a partial bill), cache hits and misses, and per unit (e.g. `chains`, `chain_prompt_tokens`,
        `chain_completion_tokens`): the calls made and the tokens of their answers, cached ones
        included (what they would cost uncached)."""
        total: dict[str, Any] = {"requests": 0, "requests_without_usage": 0, "prompt_tokens": 0,
                                 "completion_tokens": 0, "cost": None, "cache_hits": 0, "cache_misses": 0}
        for backend in self.backends:
            inner, hits = backend, 0
            if isinstance(backend, CachedBackend):
                inner, hits = backend.inner, backend.hits
                total["cache_hits"] += backend.hits
                total["cache_misses"] += backend.misses
            if callable(getattr(inner, "usage", None)):
                used = inner.usage()
                requests = used.get("requests", 0)
            else:  # a backend that keeps no bill: every call not answered from the cache ran it
                used = {"prompt_tokens": getattr(inner, "prompt_tokens", 0),
                        "completion_tokens": getattr(inner, "completion_tokens", 0)}
                with self._lock:
                    requests = self._calls - hits
            total["requests"] += int(requests or 0)
            total["prompt_tokens"] += int(used.get("prompt_tokens") or 0)
            total["completion_tokens"] += int(used.get("completion_tokens") or 0)
            total["requests_without_usage"] += int(used.get("requests_without_usage") or 0)
            if used.get("cost") is not None:
                total["cost"] = (total["cost"] or 0.0) + float(used["cost"])
        if total["requests_without_usage"]:
            total["cost"] = None
        with self._lock:
            total.update({f"{self.unit}s": self._calls, f"{self.unit}_prompt_tokens": self._call_prompt_tokens,
                          f"{self.unit}_completion_tokens": self._call_completion_tokens})
        return total

    def reusable(self) -> bool:
        """False once any backend was cancelled (it refuses every request from then on)."""
        return not any(backend.cancelled for backend in self.backends)

    def close(self) -> None:
        """Close every backend (connections, a local model's memory)."""
        for backend in self.backends:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
