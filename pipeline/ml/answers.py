"""What the product expects of a model's answer, in one place.

- `Answer`: one generated answer as every LLM backend returns it (text, finish reason, token
  usage, refusal flag). Produced only by `pipeline.ml.llm`; every caller (generation, planner,
  judges, P-GenRM, Best-of-N sampling, PPO judging) receives this type.
- `is_refusal(text)`: the one refusal rule (below), shared by generation, planning and judging.
- `parse_structured(text, schema)`: the one parser for every structured (JSON) answer we ask
  for: a bare or fenced JSON value, validated against a pydantic-compatible schema.
- `AnswerError`: an answer that cannot be used, with a machine-readable `reason` from
  `REASONS`, so builds and runs can count and show why items failed.

Plain Python (pydantic only): no Django, no torch, no openai.

The refusal rule
----------------
An answer is a refusal when the endpoint says so (a non-empty `refusal` field on the message,
or finish reason "content_filter"), or when its opening (the first two sentences of the text,
reasoning blocks removed) has the speaker decline the task: a first-person subject ("I", "I'm",
"we") followed, within the same sentence, by an inability or refusal ("can't", "cannot", "can
not", "won't", "will not", "am unable to", "not able to", "must decline", "have to decline")
and a verb of doing the task ("help", "assist", "provide", "answer", "write", "comply", ...).
"I can't help but ..." is not a refusal; nor is an apology that goes on to answer ("I'm sorry
to hear that. Here is ..."), nor "you can't" / "if you cannot" (not first person).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.ml.base import ModelError
from pipeline.ml.rows import json_limit_reason, load_json

REASONS = ("truncated", "refused", "unparseable", "rate_limited", "timed_out", "cancelled")
REASON_LABELS = {
    "truncated": "stopped at the token limit",
    "refused": "the model refused",
    "unparseable": "the answer could not be parsed",
    "rate_limited": "rate-limited by the endpoint",
    "timed_out": "the endpoint did not answer in time",
    "cancelled": "stopped by the time limit",
}

T = TypeVar("T")


class AnswerError(ModelError):
    """An answer that cannot be used (a ModelError, so callers that handle model failures handle
    it). `reason` is one of REASONS (or "" for other failures), `str(error)` a sentence for people,
    `text` the unusable answer's text when there was one (kept for inspection, never used)."""

    def __init__(self, reason: str, message: str, *, text: str = ""):
        super().__init__(message)
        self.reason = reason
        self.text = text


@dataclass(frozen=True)
class Answer:
    """One generated answer.

    text: the answer text as the model wrote it.
    prompt_tokens, completion_tokens: token usage. For a request with n > 1 the request's usage
      is attributed to the first answer and the others carry 0, so sums stay exact.
    finish_reason: why generation stopped, as the endpoint reported it ("stop", "length",
      "content_filter", ...); None when the backend does not say.
    refused: True when the endpoint flagged a refusal or the text meets `is_refusal`.
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    refused: bool = False

    @property
    def truncated(self) -> bool:
        """The answer stopped at the token cap (finish reason "length")."""
        return self.finish_reason == "length"


# --------------------------------------------------------------------------------------------
# Refusals

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_APOSTROPHE = "['\u2019]"
_SUBJECT = rf"\b(?:i|we)(?:{_APOSTROPHE}m|{_APOSTROPHE}re|\s+am|\s+are)?"
_DECLINE = (rf"(?:can{_APOSTROPHE}?t|cannot|can\s+not|won{_APOSTROPHE}t|will\s+not|(?:am\s+|are\s+)?unable\s+to|"
            rf"(?:am\s+|are\s+)?not\s+able\s+to|must\s+decline|have\s+to\s+decline|(?:must|have\s+to)\s+refuse)")
_TASK_VERB = (r"(?:help|assist|provide|comply|fulfil+|do|answer|create|write|generate|complete|support|engage|"
              r"share|give|offer|respond|continue|produce|rate|judge|evaluate|comment|discuss|to)")
_REFUSAL = re.compile(
    rf"{_SUBJECT}\s+(?:(?:really|truly|afraid|sorry|just|simply)\s+(?:that\s+)?(?:i\s+)?)*{_DECLINE}"
    rf"(?:\s+(?:be\s+able\s+to|really|fully))?\s+{_TASK_VERB}\b(?!\s+but\b)",
    re.IGNORECASE)


def is_refusal(text: str) -> bool:
    """Whether a text declines the task, by the module's refusal rule (see the docstring)."""
    opening = _THINK.sub("", text or "").strip()[:600]
    sentences = [s for s in _SENTENCE_END.split(opening) if s.strip()][:2]
    return any(_REFUSAL.search(sentence) for sentence in sentences)


# --------------------------------------------------------------------------------------------
# Structured answers

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON value in an answer: the body of its first ``` fence (```json or plain) when it has
    one, else the whole text, else the first JSON object or array inside the text. Reasoning blocks
    (<think>...</think>) are ignored. Raises AnswerError("unparseable") when there is none, or
    when the text nests deeper than rows.MAX_JSON_DEPTH (an endpoint's answer is not trusted to
    stay within what the parser can read)."""
    body = _THINK.sub("", text or "").strip()
    fenced = _FENCE.search(body)
    candidates = [fenced.group(2).strip()] if fenced else []
    candidates.append(body)
    decoder = json.JSONDecoder()
    for candidate in candidates:
        limit = json_limit_reason(candidate)
        if limit:
            raise AnswerError("unparseable", f"the answer's JSON is refused: {limit}")
        try:
            return load_json(candidate, constants=True)
        except ValueError:
            pass
        for start, char in enumerate(candidate):
            if char in "{[":
                try:
                    return decoder.raw_decode(candidate, start)[0]
                except ValueError:
                    continue
    if fenced and not fenced.group(0).rstrip().endswith("```"):
        raise AnswerError("unparseable", "the JSON block is not closed (was the answer cut short?)")
    raise AnswerError("unparseable", f"the answer has no JSON value: {_preview(body)}")


def parse_structured(text: str, schema: Any) -> Any:
    """The answer's JSON value (see `extract_json`: fenced or bare), validated against `schema`
    (a pydantic model class or any type pydantic's TypeAdapter accepts, e.g. list[str]).

    Returns the validated value (a model instance for a model class). Raises
    AnswerError("unparseable", "... at FIELD: MESSAGE") naming the first invalid field."""
    from pydantic import TypeAdapter, ValidationError

    value = extract_json(text)
    try:
        return TypeAdapter(schema).validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "the top level"
        raise AnswerError("unparseable", f"the JSON answer is invalid at {where}: {first.get('msg')}") from None


def json_schema_of(schema: Any) -> dict[str, Any]:
    """The JSON Schema of a pydantic-compatible schema (what is sent as response_format)."""
    from pydantic import TypeAdapter

    return TypeAdapter(schema).json_schema()


def _preview(text: str, limit: int = 120) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")
