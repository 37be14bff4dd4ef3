"""What the product expects of a model's answer, in one place.

- `Answer`: one generated answer as every LLM backend returns it (text, finish reason, token
  usage, refusal flag). Produced only by `prblib.llm.client`; every caller (generation, planner,
  judges, P-GenRM, Best-of-N sampling, PPO judging) receives this type.
- `is_refusal(text)`: the one refusal rule (below), shared by generation, planning and judging.
- `parse_structured(text, schema)`: the one parser for every structured (JSON) answer we ask
  for: a bare or fenced JSON value, validated against a pydantic-compatible schema.
- `AnswerError`: an answer that cannot be used, with a machine-readable `reason` from
  `REASONS`, so builds and runs can count and show why items failed.
- `message_parts`, `clean_answer`, `finish_failure`: the one normaliser of what endpoints send
  (below), applied by every backend before an answer is returned or cached.

Plain Python (pydantic only): no Django, no torch, no openai.

The refusal rule
----------------
An answer is a refusal when the endpoint says so (a non-empty `refusal` field on the message,
or a "refusal" chunk), or when its opening (the first two sentences of the text,
reasoning blocks removed) has the speaker decline the task: a first-person subject ("I", "I'm",
"we") followed, within the same sentence, by an inability or refusal ("can't", "cannot", "can
not", "won't", "will not", "am unable to", "not able to", "must decline", "have to decline")
and a verb of doing the task ("help", "assist", "provide", "answer", "write", "comply", ...).
"I can't help but ..." is not a refusal; nor is an apology that goes on to answer ("I'm sorry
to hear that. Here is ..."), nor "you can't" / "if you cannot" (not first person).

Normalising answers
-------------------
Real servers put an answer in different places; `message_parts` reads all of them into
(final answer, reasoning, refusal):
- `content` as a string, or as a list of chunks: "text" / "output_text" chunks (and bare
  strings) are the answer, "thinking" / "reasoning" / "redacted_thinking" chunks the reasoning
  (their text under "thinking", "text", "reasoning" or "content", nested chunks read alike),
  a "refusal" chunk a refusal; other chunk types (images, tool calls) are not text.
- `reasoning_content` or `reasoning` (vLLM's reasoning parsers, DeepSeek, OpenRouter): the
  reasoning, never the answer, also when `content` is null.
- a `<think>...</think>` block opening the content (or text ending in `</think>` whose
  opening tag the chat template wrote) is moved to the reasoning.
The reasoning is kept apart: it is stored and shown with a judge's output, never parsed as a
verdict, score or sample. `clean_answer` then cuts the answer at the first end-of-turn token
(END_OF_TURN: a server that does not stop at one goes on with a turn nobody asked for),
drops end-of-sequence spellings that also occur in ordinary text (`</s>`, `<eos>`) only where
they end the answer, and drops the model tokenizer's special tokens where one is known (a
local model). An answer left empty is not an answer: `llm.ask` fails it (reason
"no_answer") and the cache never stores it.

Finish reasons (`finish_failure`): "stop" (and the synonyms in COMPLETE_FINISH some servers
send, e.g. TGI's "eos_token") is complete; so is a missing finish reason (None: several
servers omit it; the answer cannot be told apart from a complete one, and the backend counts
it as event "finish_reason_missing"). "length" (CUT_FINISH) is an answer cut at the token
cap: `llm.ask` asks again with twice the budget. Every other value is a failure with that
reason, never an answer: "abort" (vLLM aborts on shutdown, scale-down or sleep) and "error"
are sent again (reason "aborted" once the retries are spent), "content_filter" is
"filtered", anything else ("tool_calls", "recitation", ...) is "unfinished" naming the value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from prblib.errors import ModelError
from prblib.rows import json_limit_reason, load_json

REASONS = ("truncated", "refused", "unparseable", "rate_limited", "timed_out", "cancelled", "no_answer",
           "filtered", "unfinished", "aborted", "endpoint_error")
REASON_LABELS = {
    "truncated": "stopped at the token limit",
    "refused": "the model refused",
    "unparseable": "the answer could not be parsed",
    "rate_limited": "rate-limited by the endpoint",
    "timed_out": "the endpoint did not answer in time",
    "cancelled": "stopped by the time limit",
    "no_answer": "no final answer (empty, or reasoning only)",
    "filtered": "stopped by the endpoint's content filter",
    "unfinished": "the endpoint did not finish the answer",
    "aborted": "the endpoint aborted the request",
    "endpoint_error": "the endpoint answered with an error",
}

T = TypeVar("T")


class AnswerError(ModelError):
    """An answer that cannot be used (a ModelError, so callers that handle model failures handle
    it). `reason` is one of REASONS (or "" for other failures), `str(error)` a sentence for people,
    `text` the unusable answer's text when there was one (kept for inspection, never used),
    `reasoning` its reasoning when the endpoint sent one apart (shown, never parsed)."""

    def __init__(self, reason: str, message: str, *, text: str = "", reasoning: str = ""):
        super().__init__(message)
        self.reason = reason
        self.text = text
        self.reasoning = reasoning


@dataclass(frozen=True)
class Answer:
    """One generated answer.

    text: the final answer, normalised (see the module docstring: reasoning and end-of-turn
      tokens removed).
    prompt_tokens, completion_tokens: token usage. For a request with n > 1 the request's usage
      is attributed to the first answer and the others carry 0, so sums stay exact; 0 when the
      endpoint reported none (the backend counts such requests: `requests_without_usage`).
    finish_reason: why generation stopped, as the endpoint reported it ("stop", "length", ...);
      None when the backend does not say. Only complete and cut answers exist: every other
      finish reason is an AnswerError in the backend.
    refused: True when the endpoint flagged a refusal or the text meets `is_refusal`.
    reasoning: the reasoning the endpoint sent apart from the answer ("" when none).
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    refused: bool = False
    reasoning: str = ""

    @property
    def truncated(self) -> bool:
        """The answer stopped at the token cap (finish reason "length", or a synonym in CUT_FINISH)."""
        return self.finish_reason in CUT_FINISH

    @property
    def empty(self) -> bool:
        """No final answer: nothing left once reasoning and end-of-turn tokens are removed."""
        return not self.text.strip()


# --------------------------------------------------------------------------------------------
# Normalising what endpoints send (see the module docstring)

COMPLETE_FINISH = ("stop", "eos", "eos_token", "stop_sequence", "end_turn")
CUT_FINISH = ("length", "model_length", "max_tokens")
RETRY_FINISH = ("abort", "error")  # a server-side stop: the same request may well succeed
# Cut at the first occurrence: nothing past an end of turn belongs to the answer.
END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
               "<|eom_id|>", "<|return|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<|END_OF_TURN_TOKEN|>")
# Also ordinary text (`</s>` closes HTML strikethrough): removed only where they end the answer.
END_OF_SEQUENCE = ("</s>", "<eos>", "<|eos|>")
_REASONING_CHUNKS = ("thinking", "reasoning", "redacted_thinking", "reasoning_text")
_TEXT_CHUNKS = ("text", "output_text")
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def _chunk_text(value: Any) -> str:
    """The text in a chunk's field: a string, or chunks (dicts or strings) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_chunk_text(v) for v in value)
    if isinstance(value, dict):
        for field in ("text", "thinking", "reasoning", "content", "summary"):
            if field in value:
                return _chunk_text(value[field])
    return ""


def message_parts(message: Any) -> tuple[str, str, str]:
    """(answer, reasoning, refusal) of an OpenAI-style chat message dict (see the module
    docstring); the answer is not yet cleaned (`clean_answer`). A message that is not a dict
    has no parts."""
    if not isinstance(message, dict):
        return "", "", ""
    content = message.get("content")
    answer, reasoning, refusal = [], [], []
    if isinstance(content, str):
        answer.append(content)
    elif isinstance(content, list):
        for chunk in content:
            if isinstance(chunk, str):
                answer.append(chunk)
                continue
            if not isinstance(chunk, dict):
                continue
            kind = str(chunk.get("type") or "text")
            if kind in _TEXT_CHUNKS:
                answer.append(_chunk_text(chunk.get("text")))
            elif kind in _REASONING_CHUNKS:
                reasoning.append(_chunk_text({k: v for k, v in chunk.items() if k != "type"}))
            elif kind == "refusal":
                refusal.append(_chunk_text(chunk.get("refusal") or chunk.get("text")))
    for field in ("reasoning_content", "reasoning"):
        value = message.get(field)
        if value:
            reasoning.append(_chunk_text(value))
            break
    if isinstance(message.get("refusal"), str):
        refusal.append(message["refusal"])
    text = "".join(answer)
    # A reasoning block written into the content (no reasoning parser on the server).
    closed = _THINK_CLOSE.search(text)
    if closed is not None:
        before = text[:closed.start()]
        opened = before.lower().rfind("<think>")
        if opened >= 0 and not before[:opened].strip():
            reasoning.insert(0, before[opened + len("<think>"):])
            text = text[closed.end():]
        elif opened < 0:  # the chat template wrote the opening tag into the prompt
            reasoning.insert(0, before)
            text = text[closed.end():]
    elif text.lstrip().lower().startswith("<think>"):  # never closed: all of it is reasoning
        reasoning.insert(0, text.lstrip()[len("<think>"):])
        text = ""
    return text, "\n\n".join(r.strip() for r in reasoning if r.strip()), " ".join(r for r in refusal if r.strip())


def clean_answer(text: str, special_tokens: Any = ()) -> str:
    """The answer without what follows its first end-of-turn token (END_OF_TURN), without
    trailing end-of-sequence spellings (END_OF_SEQUENCE, and the tokenizer's own among them),
    and without the tokenizer's other `special_tokens` wherever they occur (never text), stripped."""
    text = text or ""
    special = [t for t in special_tokens if isinstance(t, str) and t]
    for token in special:
        if token not in END_OF_TURN and token not in END_OF_SEQUENCE:
            text = text.replace(token, "")
    cut = min((i for i in (text.find(t) for t in END_OF_TURN) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    trailing = END_OF_SEQUENCE + tuple(t for t in special if t in END_OF_SEQUENCE)
    text = text.rstrip()
    while any(text.endswith(t) for t in trailing):
        token = next(t for t in trailing if text.endswith(t))
        text = text[:-len(token)].rstrip()
    return text.strip()


def finish_failure(finish_reason: Any, *, where: str) -> AnswerError | None:
    """None for a complete answer (COMPLETE_FINISH or no finish reason) or a cut one (CUT_FINISH);
    else the AnswerError for it: "aborted" (RETRY_FINISH: the caller may send it again),
    "filtered" (content_filter) or "unfinished" naming the value. `where` names the endpoint."""
    if finish_reason is None or finish_reason in COMPLETE_FINISH or finish_reason in CUT_FINISH:
        return None
    value = str(finish_reason)[:40]
    if value in RETRY_FINISH:
        return AnswerError("aborted", f"{where} stopped the answer (finish reason {value!r})")
    if value == "content_filter":
        return AnswerError("filtered", f"{where} stopped the answer with its content filter "
                                       f"(finish reason 'content_filter')")
    return AnswerError("unfinished", f"{where} did not finish the answer (finish reason {value!r})")


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
