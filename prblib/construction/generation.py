"""Benchmark construction: chosen/rejected answer pairs and planner aspects, written by an LLM.

For one item (question q, ranked profile posts u, personal rubric aspects R_u):

- chosen   = generator(q, u, R_u) with a prompt that asks it to serve the listed aspects;
- rejected = the same generator, same q, u and R_u, with a prompt that asks it to stay
  correct, relevant and helpful but NOT to serve those aspects (two variants: answer for an
  average person, or make choices the listed needs would not fit).

So a pair differs in personal-rubric fit, and as little as possible in anything else: both
prompts ask for the same length, and `generate_pair_balanced` regenerates one side when the
word counts drift apart.

The planner (for the `plan` RM setting) turns (q, u) alone into rubric-like aspects.

The narrative is the answer key and is never sent to any LLM here. That is structural, not a
convention: no function, template or request type in this module has a field or parameter
for it, and `GenerationRequest.from_row` does not read it. The planner's template may not
even name the rubric ({{ aspects }} is refused for purpose "planner"), and `plan_aspects` has no
aspects parameter.

All calls go through `prblib.llm.client.ask` (retries, concurrency, cache, and the answer policy:
a truncated answer is asked again with twice the budget, a refusal once more with the next seed,
then the item fails with AnswerError and that reason). Seeds are
fixed by default, so a `CachedBackend` answers a rerun without sending a request. Plain
Python: no Django here.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel

from prblib.registry import DEFAULT_PROFILE_K
from prblib.errors import ModelError
from prblib.llm.answers import AnswerError, extract_json, is_refusal, parse_structured
from prblib.context import numbered
from prblib.llm.client import ask, is_interrupt, run_unordered
from prblib.templates import TemplateError, compile_template

PURPOSES = ("chosen", "avoid", "planner")
DEFAULT_TARGET_WORDS = 150
DEFAULT_BOUNDS = (0.8, 1.25)
PLAN_MIN_ASPECTS, PLAN_MAX_ASPECTS = 3, 6
MIN_REGENERATION_WORDS = 20  # never ask a regeneration for fewer words than this

# Which placeholders a template may use, and which it must use, per purpose.
_ALLOWED = {
    "chosen": frozenset({"question", "profile", "aspects", "target_words"}),
    "avoid": frozenset({"question", "profile", "aspects", "target_words"}),
    "planner": frozenset({"question", "profile"}),
}
_REQUIRED = {
    "chosen": frozenset({"question", "profile", "aspects"}),
    "avoid": frozenset({"question", "profile", "aspects"}),
    "planner": frozenset({"question", "profile"}),
}


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Aspect:
    """One personal rubric aspect: what the person needs, the evidence for it, and why."""

    aspect: str
    evidence: str = ""
    reason: str = ""

    @classmethod
    def coerce(cls, value: Any) -> "Aspect":
        """An Aspect from an Aspect, a mapping with aspect/evidence/reason, or a plain string."""
        if isinstance(value, Aspect):
            return value
        if isinstance(value, str):
            return cls(value.strip())
        if isinstance(value, Mapping):
            text = value.get("aspect")
            if not isinstance(text, str) or not text.strip():
                raise ModelError(f"a rubric aspect needs a non-empty 'aspect' text, got {value!r}")
            return cls(text.strip(), str(value.get("evidence") or "").strip(), str(value.get("reason") or "").strip())
        raise ModelError(f"a rubric aspect must be a mapping or a string, not {type(value).__name__}")


def _aspects(values: Iterable[Any] | None) -> tuple[Aspect, ...]:
    aspects = tuple(Aspect.coerce(v) for v in (values or ()))
    return tuple(a for a in aspects if a.aspect)


def _profile_texts(values: Iterable[Any] | None) -> tuple[str, ...]:
    """Post texts from strings or {text: ...} mappings (LaMP-QA profile entries), order kept."""
    texts = []
    for value in values or ():
        if isinstance(value, Mapping):
            value = value.get("text")
        if not isinstance(value, str):
            raise ModelError(f"a profile post must be a string or a mapping with 'text', got {value!r}")
        texts.append(value)
    return tuple(texts)


@dataclass(frozen=True)
class GenerationRequest:
    """What generation may see of one benchmark item. There is deliberately no narrative field."""

    id: str
    question: str
    profile_texts: tuple[str, ...] = ()  # ranked, most relevant first
    aspects: tuple[Aspect, ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, profile_k: int = DEFAULT_PROFILE_K) -> "GenerationRequest":
        """A request from a benchmark/LaMP-QA row (id, question, profile or profile_texts,
        rubric_aspects or aspects). The profile is taken in the order given, so rank it first,
        and cut to its top `profile_k`. Other keys (narrative among them) are not read."""
        item_id = row.get("id")
        if item_id is None or str(item_id) == "":
            raise ModelError("an item needs an id")
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ModelError(f"item {item_id!r} has no question")
        posts = row.get("profile_texts") if row.get("profile_texts") is not None else row.get("profile")
        aspects = row.get("rubric_aspects") if row.get("rubric_aspects") is not None else row.get("aspects")
        return cls(str(item_id), question, _profile_texts(posts)[:profile_k], _aspects(aspects))


def _as_request(item: Any) -> GenerationRequest:
    if isinstance(item, GenerationRequest):
        return item
    if isinstance(item, Mapping):
        return GenerationRequest.from_row(item)
    raise ModelError(f"an item must be a GenerationRequest or a mapping, not {type(item).__name__}")


def _item_id(item: Any, index: int) -> str:
    value = item.get("id") if isinstance(item, Mapping) else getattr(item, "id", None)
    return str(value) if value is not None and str(value) != "" else f"#{index}"


# --------------------------------------------------------------------------------------------
# Formatting


NO_POSTS = "(no past posts are available)"


def format_profile(texts: Iterable[str]) -> str:
    """Numbered posts, most relevant first (`context.numbered` with flatten=True): each post's
    whitespace is collapsed to single spaces so a multi-line post cannot break the numbering;
    empty posts are skipped; NO_POSTS when none is left."""
    return numbered(texts, flatten=True, empty=NO_POSTS)


def format_aspects(aspects: Iterable[Any]) -> str:
    """Numbered aspects, each followed by its evidence and reason lines (when given)."""
    blocks = []
    for i, aspect in enumerate(_aspects(aspects), start=1):
        lines = [f"{i}. {' '.join(aspect.aspect.split())}"]
        if aspect.evidence:
            lines.append(f"   Evidence: {' '.join(aspect.evidence.split())}")
        if aspect.reason:
            lines.append(f"   Why it matters: {' '.join(aspect.reason.split())}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


# --------------------------------------------------------------------------------------------
# Templates


@dataclass(frozen=True)
class PromptTemplate:
    """A versioned prompt: a system text and a user text, both jinja2 templates rendered in
    jinja2's sandbox (`prblib.templates`), as staff may write them.

    Variables: {{ question }}, {{ profile }} (numbered posts), {{ aspects }} (numbered rubric
    aspects with evidence and reason) and {{ target_words }}. A "chosen" or "avoid" template must
    use question, profile and aspects; a "planner" template must use question and profile and
    may not use aspects or target_words (the planner never sees the rubric). Anything else, and
    any syntax error, is refused when the template is built (ModelError naming the variables or
    the line). A template written for str.format ({question}) converts with
    `templates.format_to_jinja`.
    """

    name: str
    purpose: str
    version: int
    system: str
    user: str

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ModelError("a prompt template needs a name")
        where = f"prompt template {self.name!r}"
        if self.purpose not in PURPOSES:
            raise ModelError(f"{where} has unknown purpose {self.purpose!r} (known: {', '.join(PURPOSES)})")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ModelError(f"{where} needs a version that is an integer >= 1, not {self.version!r}")
        if not isinstance(self.user, str) or not self.user.strip():
            raise ModelError(f"{where} has an empty user text")
        known = _ALLOWED["chosen"]
        try:
            system = compile_template(self.system or "", where=f"{where} (system)", allowed=known)
            user = compile_template(self.user, where=f"{where} (user)", allowed=known)
        except TemplateError as exc:
            raise ModelError(str(exc)) from None
        used = system.variables | user.variables
        if self.purpose == "planner" and "aspects" in used:
            raise ModelError(f"{where} is a planner template and uses {{{{ aspects }}}}: the planner must never see "
                             "the rubric, only the question and the profile")
        unknown = sorted(used - _ALLOWED[self.purpose])
        if unknown:
            raise ModelError(f"{where} ({self.purpose}) has unknown variables "
                             f"{', '.join('{{ ' + n + ' }}' for n in unknown)} (allowed: "
                             f"{', '.join('{{ ' + n + ' }}' for n in sorted(_ALLOWED[self.purpose]))})")
        missing = sorted(_REQUIRED[self.purpose] - used)
        if missing:
            raise ModelError(f"{where} ({self.purpose}) is missing the variables "
                             f"{', '.join('{{ ' + n + ' }}' for n in missing)}")
        object.__setattr__(self, "_compiled", (system, user))

    @property
    def key(self) -> str:
        """name@vN: what is recorded with every output, so a prompt change is traceable."""
        return f"{self.name}@v{self.version}"

    def render(self, question: str, profile_texts: Sequence[str], aspects: Sequence[Any] | None = None, *,
               target_words: int = DEFAULT_TARGET_WORDS) -> list[dict[str, str]]:
        """Chat messages for one item. A planner template takes no aspects (passing some is an
        error, not silently dropped); a chosen/avoid template needs at least one."""
        if not isinstance(question, str) or not question.strip():
            raise ModelError("cannot render a prompt for an empty question")
        values: dict[str, Any] = {"question": question.strip(), "profile": format_profile(profile_texts)}
        if self.purpose == "planner":
            if aspects:
                raise ModelError(f"planner template {self.name!r} was given rubric aspects; the planner "
                                 "sees only the question and the profile")
        else:
            parsed = _aspects(aspects)
            if not parsed:
                raise ModelError(f"template {self.name!r} ({self.purpose}) needs at least one rubric aspect")
            if isinstance(target_words, bool) or not isinstance(target_words, int) or target_words < 1:
                raise ModelError(f"target_words must be a positive integer, not {target_words!r}")
            values["aspects"] = format_aspects(parsed)
            values["target_words"] = target_words
        system, user = self._compiled
        try:
            messages = []
            if self.system and self.system.strip():
                messages.append({"role": "system", "content": system.render(values)})
            messages.append({"role": "user", "content": user.render(values)})
        except TemplateError as exc:
            raise ModelError(str(exc)) from None
        return messages


_ANSWER_RULES = (
    "Write about {{ target_words }} words of plain prose (a short list inside the answer is fine if it "
    "truly helps). Reply with the answer itself and nothing else: no title, no preface, no note on "
    "how you wrote it, and no mention of the posts or of any list you were given."
)

_GENERATOR_SYSTEM = (
    "You write answers to questions that people ask online. Your answers are accurate, stay on the "
    "question, and give the asker something they can actually use."
)

_ITEM_BLOCKS = (
    "Question:\n{{ question }}\n\n"
    "Some past posts by the person who asked (most relevant first):\n{{ profile }}\n\n"
    "Needs of this person that were worked out from their posts, each with its evidence and why it "
    "matters:\n{{ aspects }}\n\n"
)

CHOSEN_TEMPLATE = PromptTemplate(
    name="chosen",
    purpose="chosen",
    version=1,
    system=_GENERATOR_SYSTEM,
    user=(
        _ITEM_BLOCKS
        + "Answer the question for this person in particular. Let each of the needs above shape the "
        "answer: what you cover, which examples and suggestions you pick, how deep you go and the "
        "tone you take. Work them in naturally rather than ticking them off one by one. The answer "
        "must be correct, relevant and helpful.\n\n" + _ANSWER_RULES
    ),
)

AVOID_GENERIC_TEMPLATE = PromptTemplate(
    name="avoid-generic",
    purpose="avoid",
    version=1,
    system=_GENERATOR_SYSTEM,
    user=(
        _ITEM_BLOCKS
        + "Answer the question as you would for a typical person who asked it, not for this one. "
        "Do not serve the needs listed above: leave out the focus, examples, depth and tone they "
        "call for, and do not draw on anything from the posts. Keep the answer a good general one: "
        "correct, on the question and genuinely helpful, with the same care and length you would "
        "give a tailored answer.\n\n" + _ANSWER_RULES
    ),
)

AVOID_CONTRARY_TEMPLATE = PromptTemplate(
    name="avoid-contrary",
    purpose="avoid",
    version=1,
    system=_GENERATOR_SYSTEM,
    user=(
        _ITEM_BLOCKS
        + "Write a good answer to the question that makes different choices from the ones the needs "
        "above call for. Where a need points to a particular focus, kind of example, level of "
        "detail, budget, style or priority, pick another reasonable option that would suit someone "
        "else but fit this person poorly. Do not state anything false, do not drift off the "
        "question and do not be dismissive or unhelpful: the answer must stay correct, relevant "
        "and useful in itself, only not tailored to this person.\n\n" + _ANSWER_RULES
    ),
)

PLANNER_TEMPLATE = PromptTemplate(
    name="planner",
    purpose="planner",
    version=1,
    system=(
        "You study what a person has written before and work out what they would want from an "
        "answer to a new question."
    ),
    user=(
        "Question:\n{{ question }}\n\n"
        "Some past posts by the person who asked (most relevant first):\n{{ profile }}\n\n"
        f"From the posts, work out what an ideal answer to this question would take into account "
        f"for this person: their circumstances, experience, interests, constraints, and what they "
        f"seem to prefer in depth and style. Write {PLAN_MIN_ASPECTS} to {PLAN_MAX_ASPECTS} such "
        f"aspects, each one short, specific and understandable on its own.\n\n"
        f"Reply with the aspects only, one per line, each line starting with \"- \". No introduction, "
        f"no headings, no closing remark."
    ),
)

DEFAULT_TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t for t in (CHOSEN_TEMPLATE, AVOID_GENERIC_TEMPLATE, AVOID_CONTRARY_TEMPLATE, PLANNER_TEMPLATE)
}
DEFAULT_AVOID_TEMPLATES: tuple[PromptTemplate, ...] = (AVOID_GENERIC_TEMPLATE, AVOID_CONTRARY_TEMPLATE)


def choose_avoid_template(item_id: str, templates: Sequence[PromptTemplate]) -> PromptTemplate:
    """The avoid variant for an item: picked by a hash of its id, so a rerun picks the same one
    (and hits the cache) whatever order the items come in."""
    if not templates:
        raise ModelError("no avoid template was given")
    digest = hashlib.sha256(str(item_id).encode("utf-8")).digest()
    return templates[int.from_bytes(digest[:8], "big") % len(templates)]


def _require_purpose(template: PromptTemplate, purpose: str, role: str) -> None:
    if not isinstance(template, PromptTemplate):
        raise ModelError(f"{role} must be a PromptTemplate, not {type(template).__name__}")
    if template.purpose != purpose:
        raise ModelError(f"{role} must be a {purpose!r} template; {template.name!r} is a {template.purpose!r} one")


# --------------------------------------------------------------------------------------------
# Pair generation

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


def clean_output(text: str) -> str:
    """The answer in a raw output: reasoning blocks (<think>...</think>) removed, ends stripped."""
    return _THINK.sub("", text or "").strip()


def word_count(text: str) -> int:
    return len(text.split())


def length_ratio(chosen: str, rejected: str) -> float:
    """Word count of chosen over word count of rejected (inf when only rejected is empty,
    1.0 when both are)."""
    c, r = word_count(chosen), word_count(rejected)
    if r == 0:
        return 1.0 if c == 0 else math.inf
    return c / r


@dataclass(frozen=True)
class Attempt:
    """One generation call for one side of a pair."""

    side: str  # "chosen" or "rejected"
    template: str  # name@vN
    seed: int | None
    target_words: int
    text: str  # cleaned answer
    raw: str  # the backend's output as it came
    words: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # as the endpoint reported it ("stop"; never "length" here)


@dataclass(frozen=True)
class PairOutput:
    """A generated pair, with what produced it."""

    chosen: str
    rejected: str
    avoid_variant: str  # the avoid template's name, e.g. "avoid-generic"
    chosen_template: str  # name@vN
    avoid_template: str  # name@vN
    raw_chosen: str
    raw_rejected: str
    length_ratio: float  # chosen words / rejected words of the kept answers
    attempts: tuple[Attempt, ...] = ()  # every generation call, in order (kept ones included)
    within_bounds: bool | None = None  # length ratio within the bounds; None when not balanced
    bounds: tuple[float, float] | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.attempts)

    @property
    def regenerations(self) -> int:
        return max(0, len(self.attempts) - 2)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (what a caller stores as the pair's generation record)."""
        data = asdict(self)
        data["attempts"] = [asdict(a) for a in self.attempts]
        data["bounds"] = list(self.bounds) if self.bounds is not None else None
        data["length_ratio"] = self.length_ratio if math.isfinite(self.length_ratio) else None
        data.update(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                    regenerations=self.regenerations)
        return data


def _generate_side(backend: Any, template: PromptTemplate, side: str, *, question: str,
                   profile_texts: Sequence[str], aspects: Sequence[Any], temperature: float, max_tokens: int,
                   seed: int | None, target_words: int) -> Attempt:
    messages = template.render(question, profile_texts, aspects, target_words=target_words)
    [first] = ask(backend, messages, temperature=temperature, max_tokens=max_tokens, seed=seed, n=1,
                  what=f"{side} answer")[:1]
    text = clean_output(first.text)
    if not text:
        raise ModelError(f"the generator gave an empty {side} answer (template {template.key})")
    return Attempt(side=side, template=template.key, seed=seed, target_words=target_words, text=text,
                   raw=first.text, words=word_count(text), prompt_tokens=int(first.prompt_tokens or 0),
                   completion_tokens=int(first.completion_tokens or 0), finish_reason=first.finish_reason)


def _output(chosen: Attempt, rejected: Attempt, chosen_template: PromptTemplate, avoid_template: PromptTemplate,
            attempts: list[Attempt], *, bounds: tuple[float, float] | None = None) -> PairOutput:
    ratio = length_ratio(chosen.text, rejected.text)
    within = None if bounds is None else bool(bounds[0] <= ratio <= bounds[1])
    return PairOutput(chosen=chosen.text, rejected=rejected.text, avoid_variant=avoid_template.name,
                      chosen_template=chosen_template.key, avoid_template=avoid_template.key,
                      raw_chosen=chosen.raw, raw_rejected=rejected.raw, length_ratio=ratio,
                      attempts=tuple(attempts), within_bounds=within, bounds=bounds)


def generate_pair(backend: Any, *, question: str, profile_texts: Sequence[str], aspects: Sequence[Any],
                  chosen_template: PromptTemplate = CHOSEN_TEMPLATE,
                  avoid_template: PromptTemplate = AVOID_GENERIC_TEMPLATE, temperature: float = 0.7,
                  max_tokens: int = 512, seed: int | None = 0,
                  target_words: int = DEFAULT_TARGET_WORDS) -> PairOutput:
    """Chosen then rejected: two calls to the same backend with the same question, profile,
    aspects, sampling parameters and seed; only the template differs."""
    _require_purpose(chosen_template, "chosen", "chosen_template")
    _require_purpose(avoid_template, "avoid", "avoid_template")
    common = dict(question=question, profile_texts=profile_texts, aspects=aspects, temperature=temperature,
                  max_tokens=max_tokens, target_words=target_words)
    chosen = _generate_side(backend, chosen_template, "chosen", seed=seed, **common)
    rejected = _generate_side(backend, avoid_template, "rejected", seed=seed, **common)
    return _output(chosen, rejected, chosen_template, avoid_template, [chosen, rejected])


def _check_bounds(bounds: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ModelError(f"bounds must be two numbers (low, high), not {bounds!r}") from None
    if not (0 < low <= 1.0 <= high < math.inf):
        raise ModelError(f"bounds must satisfy 0 < low <= 1 <= high, not {bounds!r}")
    return low, high


def _imbalance(chosen: Attempt, rejected: Attempt) -> float:
    return abs(math.log(chosen.words / rejected.words))


def generate_pair_balanced(backend: Any, *, question: str, profile_texts: Sequence[str], aspects: Sequence[Any],
                           chosen_template: PromptTemplate = CHOSEN_TEMPLATE,
                           avoid_template: PromptTemplate = AVOID_GENERIC_TEMPLATE, temperature: float = 0.7,
                           max_tokens: int = 512, seed: int | None = 0, target_words: int = DEFAULT_TARGET_WORDS,
                           bounds: Sequence[float] = DEFAULT_BOUNDS, max_attempts: int = 2) -> PairOutput:
    """`generate_pair`, then, while the length ratio is outside `bounds` and fewer than
    `max_attempts` rounds were run, regenerate one side once more.

    The side regenerated is the one whose length is further from `target_words` (the outlier;
    the rejected side on a tie), with the next seed (seed + round) and asked for about as many
    words as the other side has. Of all answers generated, the chosen/rejected combination whose
    ratio is closest to 1 (smallest |log ratio|, so 0.8 and 1.25 are equally far) is kept. The
    output records every attempt, the final ratio and whether it is within the bounds.
    """
    low, high = _check_bounds(bounds)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ModelError(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
    first = generate_pair(backend, question=question, profile_texts=profile_texts, aspects=aspects,
                          chosen_template=chosen_template, avoid_template=avoid_template, temperature=temperature,
                          max_tokens=max_tokens, seed=seed, target_words=target_words)
    attempts = list(first.attempts)
    chosen_pool, rejected_pool = [attempts[0]], [attempts[1]]
    best = (attempts[0], attempts[1])
    for round_ in range(1, max_attempts):
        if low <= best[0].words / best[1].words <= high:
            break
        chosen, rejected = best
        off_chosen = abs(math.log(chosen.words / target_words))
        off_rejected = abs(math.log(rejected.words / target_words))
        side = "chosen" if off_chosen > off_rejected else "rejected"
        other = rejected if side == "chosen" else chosen
        template = chosen_template if side == "chosen" else avoid_template
        new = _generate_side(backend, template, side, question=question, profile_texts=profile_texts,
                             aspects=aspects, temperature=temperature, max_tokens=max_tokens,
                             seed=None if seed is None else seed + round_,
                             target_words=max(MIN_REGENERATION_WORDS, other.words))
        attempts.append(new)
        (chosen_pool if side == "chosen" else rejected_pool).append(new)
        # min() keeps the earliest combination on ties, so a regeneration must be strictly better.
        best = min(((c, r) for c in chosen_pool for r in rejected_pool), key=lambda pair: _imbalance(*pair))
    return _output(best[0], best[1], chosen_template, avoid_template, attempts, bounds=(low, high))


def generate_many(backend: Any, items: Iterable[Any], *, chosen_template: PromptTemplate = CHOSEN_TEMPLATE,
                  avoid_templates: PromptTemplate | Sequence[PromptTemplate] = DEFAULT_AVOID_TEMPLATES,
                  temperature: float = 0.7, max_tokens: int = 512, seed: int | None = 0,
                  target_words: int = DEFAULT_TARGET_WORDS, bounds: Sequence[float] | None = DEFAULT_BOUNDS,
                  max_attempts: int = 2, idle: Any = None) -> Iterator[tuple[str, PairOutput | Exception]]:
    """Generate a pair for every item (GenerationRequest or a row mapping, see
    `GenerationRequest.from_row`), concurrently as far as the backend allows, yielding
    (item id, PairOutput) as items finish, or (item id, the exception) for an item that failed,
    so one bad item never stops the rest. Each item's avoid variant is `choose_avoid_template`'s
    pick among `avoid_templates`. bounds=None: no length balancing. `idle`: see `llm.run_unordered`."""
    _require_purpose(chosen_template, "chosen", "chosen_template")
    variants = (avoid_templates,) if isinstance(avoid_templates, PromptTemplate) else tuple(avoid_templates)
    if not variants:
        raise ModelError("no avoid template was given")
    for template in variants:
        _require_purpose(template, "avoid", "every avoid template")
    if bounds is not None:
        _check_bounds(bounds)

    def one(indexed: tuple[int, Any]) -> tuple[str, PairOutput | Exception]:
        index, item = indexed
        item_id = _item_id(item, index)
        try:
            request = _as_request(item)
            params = dict(question=request.question, profile_texts=request.profile_texts, aspects=request.aspects,
                          chosen_template=chosen_template, avoid_template=choose_avoid_template(request.id, variants),
                          temperature=temperature, max_tokens=max_tokens, seed=seed, target_words=target_words)
            if bounds is None:
                return item_id, generate_pair(backend, **params)
            return item_id, generate_pair_balanced(backend, bounds=bounds, max_attempts=max_attempts, **params)
        except Exception as exc:  # reported per item; the batch goes on
            if is_interrupt(exc):
                raise
            return item_id, exc

    return run_unordered(backend, one, enumerate(items), idle=idle)


# --------------------------------------------------------------------------------------------
# Planner

_PLANNER_KEYS = ("id", "question", "profile", "profile_texts")
_MARKER = re.compile(r"^\s*(?:[-*+\u2022\u2023\u25e6\u2043\u2013\u2014]\s+|\(?\d{1,2}[.)]\s+|\d{1,2}:\s+)")
_LABEL = re.compile(r"^(?:aspect|criterion|need)\s*\d*\s*[:.)]\s*", re.IGNORECASE)
_PREAMBLE = re.compile(r"^(?:here\s+(?:are|is)|sure\b|certainly\b|of course\b|okay\b|ok\b|below (?:are|is)\b|"
                       r"based on (?:the|their|these|this|your)\s+(?:posts?|profile|information)\b|"
                       r"the following\b|i hope\b|let me know\b|these aspects\b|sorry\b|unfortunately\b|as an ai\b|"
                       r"i(?:\s+(?:cannot|can't|can not|am unable|do not|don't)|['\u2019]m unable)\b)", re.IGNORECASE)


class _PlanObject(BaseModel):
    aspects: list[str]


_PLAN_SCHEMA = list[str] | _PlanObject
_MARKDOWN = re.compile(r"\*\*|__|`")


def _clean_aspect(text: str) -> str:
    text = _MARKDOWN.sub("", text)
    text = " ".join(text.split())
    text = _LABEL.sub("", text)
    text = text.strip().strip("\"'\u201c\u201d\u2018\u2019").strip()
    return text


def _json_aspects(text: str) -> list[str] | None:
    """Aspects from a JSON plan (fenced or bare: a list of strings or {"aspects": [...]}), through
    the shared structured parser; None when the output is not JSON at all."""
    stripped = clean_output(text)
    if not (stripped.startswith(("[", "{")) or "```" in stripped):
        return None
    try:
        extract_json(stripped)
    except AnswerError:
        return None  # a fence around plain lines, say: read as lines
    plan = parse_structured(stripped, _PLAN_SCHEMA)
    return list(plan.aspects if isinstance(plan, _PlanObject) else plan)


def parse_aspects(text: str) -> list[str]:
    """Aspects from a planner output: one per line, as asked, or a JSON plan.

    A JSON plan (a list of strings, or an object with an "aspects" list; bare or in a ```json
    fence) is read by the shared structured parser (`answers.parse_structured`); JSON of any other
    shape raises AnswerError("unparseable").

    When some lines carry a list marker ("- ", "* ", "\u2022 ", "1. ", "2) ", ...), only those
    lines count (an introduction or closing remark around the list is dropped), and an indented
    line right after an item continues it. Otherwise every non-blank line counts except headings
    (lines ending in ':' or starting with '#') and stock introductions, closings and refusals
    ("Here are...", "Sure", "I hope this helps", "Sorry, I cannot..."). Lines that are refusals by the shared rule
    (`answers.is_refusal`) are never aspects. Markdown emphasis, "Aspect 2:" labels and wrapping
    quotes are removed; duplicates (ignoring case) are kept once.
    """
    from_json = _json_aspects(text)
    if from_json is not None:
        return _unique_aspects(from_json)
    lines = clean_output(text).splitlines()
    marked = any(_MARKER.match(line) for line in lines)
    items: list[str] = []
    previous_was_item = False
    for line in lines:
        if not line.strip():
            previous_was_item = False
            continue
        match = _MARKER.match(line)
        if marked:
            if match:
                items.append(line[match.end():])
                previous_was_item = True
            elif previous_was_item and line[:1].isspace() and items:
                items[-1] += " " + line.strip()
            else:
                previous_was_item = False
            continue
        stripped = _MARKDOWN.sub("", line).strip()
        if stripped.endswith(":") or stripped.startswith("#") or _PREAMBLE.match(stripped):
            continue
        items.append(stripped)
    return _unique_aspects(items)


def _unique_aspects(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    aspects = []
    for item in items:
        cleaned = _clean_aspect(item)
        if not cleaned or cleaned.endswith(":") or cleaned.casefold() in seen or is_refusal(cleaned):
            continue
        seen.add(cleaned.casefold())
        aspects.append(cleaned)
    return aspects


def plan_aspects(backend: Any, *, question: str, profile_texts: Sequence[str],
                 template: PromptTemplate = PLANNER_TEMPLATE, temperature: float = 0.0, max_tokens: int = 256,
                 seed: int | None = 0, max_aspects: int | None = PLAN_MAX_ASPECTS) -> list[str]:
    """Rubric-like aspects for (question, profile) alone, parsed by `parse_aspects` and cut to
    the first `max_aspects` (None: keep all). The answer goes through `llm.ask` (a truncated or
    refused plan is retried once, then AnswerError with that reason); no aspect parsed ->
    AnswerError("unparseable")."""
    _require_purpose(template, "planner", "the planner template")
    if max_aspects is not None and (isinstance(max_aspects, bool) or not isinstance(max_aspects, int)
                                    or max_aspects < 1):
        raise ModelError(f"max_aspects must be None or an integer >= 1, not {max_aspects!r}")
    messages = template.render(question, profile_texts)
    # JSON output is requested where the endpoint takes response_format ({"aspects": [...]}); the
    # answer is read by parse_aspects either way (JSON, fenced JSON or lines).
    raw = ask(backend, messages, temperature=temperature, max_tokens=max_tokens, seed=seed, n=1, what="plan",
              schema=_PlanObject)[0].text
    aspects = parse_aspects(raw)
    if not aspects:
        raise AnswerError("unparseable", f"planner output had no aspects: {(raw or '').strip()[:200]!r}")
    return aspects if max_aspects is None else aspects[:max_aspects]


def plan_many(backend: Any, items: Iterable[Any], *, template: PromptTemplate = PLANNER_TEMPLATE,
              temperature: float = 0.0, max_tokens: int = 256, seed: int | None = 0,
              max_aspects: int | None = PLAN_MAX_ASPECTS,
              idle: Any = None) -> Iterator[tuple[str, list[str] | Exception]]:
    """`plan_aspects` for every item, as `generate_many` does for pairs: (item id, aspects) or
    (item id, the exception) as items finish. Only an item's id, question and profile are used."""
    _require_purpose(template, "planner", "the planner template")

    def one(indexed: tuple[int, Any]) -> tuple[str, list[str] | Exception]:
        index, item = indexed
        item_id = _item_id(item, index)
        try:
            if isinstance(item, Mapping):  # the planner reads nothing but these
                item = {key: item[key] for key in _PLANNER_KEYS if key in item}
            request = _as_request(item)
            return item_id, plan_aspects(backend, question=request.question, profile_texts=request.profile_texts,
                                         template=template, temperature=temperature, max_tokens=max_tokens,
                                         seed=seed, max_aspects=max_aspects)
        except Exception as exc:  # reported per item; the batch goes on
            if is_interrupt(exc):
                raise
            return item_id, exc

    return run_unordered(backend, one, enumerate(items), idle=idle)
