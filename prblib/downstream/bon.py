"""Best-of-N: sample N answers from a policy, let a reward model pick the best of the first k,
and have a judge score the picked answer against the item's personal rubric.

The downstream experiment of the Personalized RewardBench paper: policy Qwen2.5-0.5B-Instruct, N = 16 samples per item,
k in (1, 2, 4, 8, 16), the pick for k is the RM's best among samples 0..k-1 (so the k = 8 pick
can only be beaten at k = 16 by samples 8..15). The outcome of (item, k) is the judge's mean
rubric score of the pick, 0..2. Comparing RMs by how outcomes grow with k is what checks
benchmark accuracy against downstream use.

Who sees what.
- The policy sees the question and the person's top profile posts (`policy_messages`). Never
  the rubric or the narrative: `PolicyItem` has no field for them, and `sample_responses`
  reads only id, question and profile_texts (or profile) of an item, whatever else it carries.
- The reward model sees what `render_context` gives it for the setting (a ScoreInput has no
  rubric or narrative field either).
- The judge is the evaluator, so it sees the rubric aspects (their short "aspect" text only,
  not evidence or reason), the question and the answer. Not the narrative, not the profile:
  `judge_prompt` has no parameter for them.

Reproducibility. Sampling is seeded (one seed per item request, the same for every item:
requests differ by their messages) and asks the backend for all N samples in one request, so
a `CachedBackend` answers a rerun from disk.

Degenerate samples. Some servers answer one n=16 request with 16 copies of one sample (vLLM
applying the request's seed to every sample, a prefix cache, a server ignoring temperature);
a flat Best-of-N curve would follow for every RM. When sampling (temperature > 0), an item
whose N samples are not even half distinct (`is_degenerate`) is asked again one sample per
request, sample j seeded `derived_seed(seed, j)`; items still degenerate are reported
(`SamplingReport`), and the sample set fails when most of its items are. Judging runs at temperature 0 with a fixed seed.
The random baseline and the bootstrap CIs are seeded.

Scoring groups. `score_samples` scores each group with `score_groups` when the RM declares
that capability (`scores_groups`, the registry's flag; scalar RMs: the shared prompt is
computed once per group through the KV cache). Judges and
P-GenRM compare answers, so they score each sample by its margin over a reference answer given
per group (the pair's rubric-blind answer): `score_pairs` of (sample, reference). Without
either, ModelError; uploaded scores have nothing for generated samples.

Plain Python: no Django, no torch at import time.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prblib.rewards.base import ItemView, ProgressFn, ScoreInput
from prblib.registry import DEFAULT_PROFILE_K
from prblib.errors import ModelError
from prblib.context import numbered
from prblib.llm.client import Messages, ask, is_interrupt, run_unordered
from prblib.prompts import TextTemplate
from prblib.registry import KS, N_SAMPLES, k_grid  # the registry's Best-of-N grid (re-exported)

SCORE_LEVELS = (0, 1, 2)  # judge's per-aspect scale: not addressed, partly, fully

# --------------------------------------------------------------------------------------------
# Policy inputs and prompt

POLICY_SYSTEM = (
    "You are a helpful assistant. You answer a question for the specific person who asked it. "
    "Some of their earlier posts are shown to you, so you can tell who they are and what they "
    "care about; let that shape your answer where it is relevant, but answer the question itself."
)

POLICY_POSTS_HEADING = "Earlier posts by this person (most relevant first):"
POLICY_INSTRUCTION = "Write your answer to this person. Be concrete and keep it under about 150 words."
# Bump a version whenever any of its texts changes (tests pin each version's text).
POLICY_TEMPLATE = TextTemplate("policy", 1, (POLICY_SYSTEM, POLICY_INSTRUCTION))


@dataclass(frozen=True, kw_only=True)
class PolicyItem(ItemView):
    """What the policy may see of one item: the ItemView with its profile ranked, stripped and cut
    to profile_k (`as_policy_item`). Like every ItemView, there is no rubric or narrative field."""

    @property
    def profile_texts(self) -> tuple[str, ...]:
        """The ranked posts (most relevant first); the name policy rows and earlier callers use."""
        return self.profile


def as_policy_item(item: Any, *, profile_k: int = DEFAULT_PROFILE_K) -> PolicyItem:
    """A PolicyItem from a PolicyItem, a mapping or any object with id, question and profile_texts
    (or profile: strings or {text: ...} entries, taken in the order given, so rank them first).
    The profile is cut to its top `profile_k`. No other field is read."""
    get = item.get if isinstance(item, Mapping) else (lambda name: getattr(item, name, None))
    item_id = get("id")
    if item_id is None or str(item_id) == "":
        raise ModelError("an item needs an id")
    question = get("question")
    if not isinstance(question, str) or not question.strip():
        raise ModelError(f"item {item_id!r} has no question")
    posts = get("profile_texts")
    if posts is None:
        posts = get("profile")
    if isinstance(posts, str):
        raise ModelError(f"item {item_id!r}: the profile must be a list of posts, not one string")
    texts = []
    for post in posts or ():
        if isinstance(post, Mapping):
            post = post.get("text")
        if not isinstance(post, str):
            raise ModelError(f"item {item_id!r}: a profile post must be a string or a mapping with 'text', "
                             f"got {post!r}")
        if post.strip():
            texts.append(post.strip())
    return PolicyItem(id=str(item_id), question=question.strip(), profile=tuple(texts[:profile_k]))


def policy_messages(item: PolicyItem) -> Messages:
    """The chat messages the policy answers (system, user)."""
    parts = []
    if item.profile_texts:
        parts.append(f"{POLICY_POSTS_HEADING}\n{numbered(item.profile_texts)}")
    parts.append(f"Their question:\n{item.question}")
    parts.append(POLICY_INSTRUCTION)
    return [{"role": "system", "content": POLICY_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# --------------------------------------------------------------------------------------------
# 1. Sampling


def derived_seed(seed: int, index: int) -> int:
    """A seed for the index-th single-sample top-up request (see sample_responses)."""
    digest = hashlib.sha256(f"bon-topup:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def is_degenerate(texts: Sequence[str]) -> bool:
    """Whether N >= 2 samples are at most half distinct (whitespace around them ignored): what one
    request gives when the server did not sample each answer on its own."""
    return len(texts) >= 2 and len({t.strip() for t in texts}) <= len(texts) / 2


class SamplingReport:
    """What `sample_responses` found about degenerate samples (thread-safe): `retried`, the items
    asked again one sample per request; `degenerate`, the ids of items whose samples stayed
    degenerate after that."""

    def __init__(self) -> None:
        self.retried = 0
        self.degenerate: list[str] = []
        self._lock = threading.Lock()

    def note(self, item_id: str, *, retried: bool, degenerate: bool) -> None:
        with self._lock:
            self.retried += int(retried)
            if degenerate:
                self.degenerate.append(item_id)


def sample_responses(policy_backend: Any, items: Iterable[Any], *, n: int = N_SAMPLES, temperature: float = 0.8,
                     max_tokens: int = 256, seed: int | None = 0, top_p: float | None = None,
                     profile_k: int = DEFAULT_PROFILE_K,
                     report: SamplingReport | None = None) -> Iterator[tuple[str, list[str] | Exception]]:
    """Yield (item id, n samples in order) per item, in any order, as they finish; or
    (item id, the exception) for an item whose sampling failed, while the others go on.

    Every item is checked (id, question, profile shape, unique ids) before the first request,
    and a bad one raises ModelError at once. Each item is one request asking for all n samples
    (`n=n`, `seed=seed`, and `top_p` when set; None leaves it to the backend). An endpoint that returns fewer than n (some ignore `n`) is topped up
    with single-sample requests seeded `derived_seed(seed, j)` for sample j, so the samples stay
    reproducible and cacheable. Samples are kept as returned, empty ones and refusals included
    (a legitimately bad sample; dropping it would shift the first-k windows), but never a
    truncated one: every request goes through `llm.ask`, which asks again with twice the budget
    and otherwise fails the item with AnswerError("truncated").

    When sampling (temperature > 0), samples that are degenerate (`is_degenerate`: at most half
    distinct) are asked again one per request (sample 0 kept, sample j seeded `derived_seed(seed,
    j)`, the top-up's requests); `report`, when given, counts the items retried and names those
    that stayed degenerate (they are yielded as they are: the caller decides).
    """
    if n < 1:
        raise ModelError(f"n must be at least 1, not {n}")
    if max_tokens < 1:
        raise ModelError(f"max_tokens must be at least 1, not {max_tokens}")
    prepared = [as_policy_item(item, profile_k=profile_k) for item in items]
    _refuse_duplicates(p.id for p in prepared)

    def one(item: PolicyItem) -> tuple[str, list[str] | Exception]:
        messages = policy_messages(item)
        try:
            texts = [c.text for c in ask(policy_backend, messages, temperature=temperature, max_tokens=max_tokens,
                                         seed=seed, n=n, what="policy sample", refusals="keep", top_p=top_p)][:n]
            while len(texts) < n:
                j = len(texts)
                extra = ask(policy_backend, messages, temperature=temperature, max_tokens=max_tokens,
                            seed=None if seed is None else derived_seed(seed, j), n=1, what="policy sample",
                            refusals="keep", top_p=top_p)
                texts.append(extra[0].text)
            retried = temperature > 0 and is_degenerate(texts)
            if retried:
                texts = texts[:1] + [ask(policy_backend, messages, temperature=temperature, max_tokens=max_tokens,
                                         seed=None if seed is None else derived_seed(seed, j), n=1,
                                         what="policy sample", refusals="keep", top_p=top_p)[0].text
                                     for j in range(1, n)]
        except Exception as exc:  # reported per item: one bad item must not lose the others' samples
            if is_interrupt(exc):
                raise
            return item.id, exc
        if report is not None:
            report.note(item.id, retried=retried, degenerate=retried and is_degenerate(texts))
        return item.id, texts

    yield from run_unordered(policy_backend, one, prepared)


# --------------------------------------------------------------------------------------------
# 2. Scoring

FAILED_JUDGEMENT = -1e9  # a sample whose judgement failed is picked only if every sample failed


def score_samples(reward_model: Any, groups: Sequence[ScoreInput], *, setting: str,
                  progress: ProgressFn | None = None,
                  references: Mapping[str, str] | None = None) -> dict[str, list[float]]:
    """{group id: one RM score per sample, in sample order}.

    RMs that declare `scores_groups` (scalar RMs) score each group at once, the shared prompt prefix
    computed once. Judges and P-GenRM compare answers, so with `references` (group id -> a
    fixed reference answer, e.g. the pair's rubric-blind answer) each sample scores its margin
    over the reference; a failed judgement scores -inf-like lowest (never picked over a
    judged sample). Without either, ModelError. A non-finite scalar score raises ModelError
    too: a pick must never rest on a NaN.
    """
    if not reward_model.scores_groups:
        if references is None:
            kind = getattr(reward_model, "kind", type(reward_model).__name__)
            raise ModelError(f"this RM kind ({kind!r}) scores answers against each other: give reference "
                             "answers to score Best-of-N samples")
        return _margins(reward_model, groups, setting=setting, references=references, progress=progress)
    _refuse_duplicates(g.id for g in groups)
    expected = {g.id: len(g.responses) for g in groups}
    scores: dict[str, list[float]] = {}
    for group_id, values in reward_model.score_groups(groups, setting=setting, progress=progress):
        values = [float(v) for v in values]
        if len(values) != expected.get(group_id, -1):
            raise ModelError(f"the RM returned {len(values)} scores for group {group_id!r}, "
                             f"expected {expected.get(group_id)}")
        if not all(math.isfinite(v) for v in values):
            raise ModelError(f"the RM gave a non-finite score in group {group_id!r}")
        scores[group_id] = values
    missing = [g for g in expected if g not in scores]
    if missing:
        raise ModelError(f"the RM returned no scores for {len(missing)} group(s), e.g. {missing[0]!r}")
    return scores


# --------------------------------------------------------------------------------------------
# 3. Selection


def _margins(reward_model: Any, groups: Sequence[ScoreInput], *, setting: str, references: Mapping[str, str],
             progress: ProgressFn | None) -> dict[str, list[float]]:
    from prblib.rewards.base import PairInput

    _refuse_duplicates(g.id for g in groups)
    pairs, slots = [], []
    for g in groups:
        if g.id not in references:
            raise ModelError(f"no reference answer for group {g.id!r}")
        for i, sample in enumerate(g.responses):
            pairs.append(PairInput(id=f"{g.id}#{i}", domain="", question=g.question, chosen=sample,
                                   rejected=references[g.id], profile=g.profile, plan=g.plan))
            slots.append((g.id, i))
    results = {r.id: r for r in reward_model.score_pairs(pairs, setting=setting)}
    scores = {g.id: [FAILED_JUDGEMENT] * len(g.responses) for g in groups}
    for group_id, i in slots:
        r = results.get(f"{group_id}#{i}")
        if r is not None and r.chosen_score is not None and r.rejected_score is not None:
            scores[group_id][i] = float(r.chosen_score - r.rejected_score)
    if progress is not None:
        progress(len(groups))
    return scores


def best_of_k(scores: Sequence[float], k: int) -> int:
    """Index of the highest score among the first k; a tie goes to the earliest sample."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if k > len(scores):
        raise ValueError(f"k = {k} but only {len(scores)} scores")
    window = [float(s) for s in scores[:k]]
    if not all(math.isfinite(s) for s in window):
        raise ValueError("scores must be finite numbers")
    best = 0
    for i in range(1, k):
        if window[i] > window[best]:  # strict: a later equal score never displaces an earlier one
            best = i
    return best


def select_all(scores_by_item: Mapping[str, Sequence[float]],
               ks: Sequence[int] = KS) -> dict[str, dict[int, int]]:
    """{item: {k: index of the RM's pick among the first k samples}}."""
    return {item: {k: best_of_k(scores, k) for k in ks} for item, scores in scores_by_item.items()}


def random_baseline(n_items: int, ks: Sequence[int] = KS, seed: int = 0) -> list[dict[int, int]]:
    """Per item (in the order of the caller's item list), {k: an index drawn uniformly from
    0..k-1}: the pick of an RM that knows nothing. Same (n_items, ks, seed), same draws; an
    item's draws do not depend on how many items follow it."""
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, not {n_items}")
    if any(k < 1 for k in ks):
        raise ValueError("every k must be at least 1")
    rng = random.Random(f"bon-random-baseline:{seed}")
    return [{k: rng.randrange(k) for k in ks} for _ in range(n_items)]


def random_baseline_by_item(items: Mapping[str, str], ks: Sequence[int] = KS,
                            seed: int = 0) -> dict[str, dict[int, int]]:
    """{key: {k: an index drawn uniformly from 0..k-1}} for `items` = {key: item identity} (the
    benchmark item's source id): each item's draws come from its own generator, seeded with
    "bon-random-baseline:<seed>:<identity>" (random.Random), so they depend on the item alone,
    never on how the caller's keys sort (string-sorted database ids put '10' before '2') or on
    the other items. ValueError for a k below 1."""
    if any(k < 1 for k in ks):
        raise ValueError("every k must be at least 1")
    out = {}
    for key, identity in items.items():
        rng = random.Random(f"bon-random-baseline:{seed}:{identity}")
        out[key] = {k: rng.randrange(k) for k in ks}
    return out


# --------------------------------------------------------------------------------------------
# 4. Rubric judging

JUDGE_SYSTEM = (
    "You are a careful grader. You check one answer against a list of aspects that matter to the "
    "person who asked the question. Grade every aspect separately, only on what the answer "
    "actually says; length, style and confidence earn nothing by themselves."
)

JUDGE_INSTRUCTION = (
    "For every aspect above, decide how well the answer addresses it:\n"
    "0 = not addressed at all\n"
    "1 = partly addressed\n"
    "2 = fully addressed\n"
    "Reply with exactly one line per aspect, in the order listed, each of the form "
    "\"Aspect N: S\" where N is the aspect's number and S is 0, 1 or 2. Write nothing else."
)
RUBRIC_JUDGE_TEMPLATE = TextTemplate("rubric-judge", 1, (JUDGE_SYSTEM, JUDGE_INSTRUCTION))

# Protocol "release": the structure of the authors' rubric judge (BoN/evaluate.py, prompts/evaluation.txt:
# question, answer, the aspects; a bracketed list of 0/1/2, one per aspect, in order, and nothing else),
# in our own words.
RELEASE_JUDGE_SYSTEM = "You judge answers fairly and with care."
RELEASE_JUDGE_INSTRUCTION = (
    "Rate how well the answer covers each aspect listed, with respect to the question:\n"
    "0 = the aspect is not covered\n"
    "1 = the aspect is partly covered\n"
    "2 = the aspect is covered well\n"
    "Reply with the ratings only, as one bracketed list of integers in the order of the aspects, "
    "for example [2, 0, 1]. Write nothing else."
)
RELEASE_RUBRIC_JUDGE_TEMPLATE = TextTemplate("rubric-judge-release", 1, (RELEASE_JUDGE_SYSTEM,
                                                                         RELEASE_JUDGE_INSTRUCTION))


def rubric_judge_template(protocol: str = "prbench") -> TextTemplate:
    """The rubric judge's prompt under `protocol`."""
    return RELEASE_RUBRIC_JUDGE_TEMPLATE if protocol == "release" else RUBRIC_JUDGE_TEMPLATE


@dataclass(frozen=True)
class JudgeRequest:
    """One answer to grade. `key` is the caller's, returned as is (e.g. (item, k), or
    (item, sample index) to grade a sample picked at several k only once)."""

    key: Hashable
    question: str
    aspects: tuple[str, ...]
    answer: str


def aspect_texts(aspects: Iterable[Any]) -> tuple[str, ...]:
    """The short aspect texts from strings, {aspect: ...} mappings or objects with .aspect."""
    texts = []
    for value in aspects or ():
        if isinstance(value, Mapping):
            value = value.get("aspect")
        elif not isinstance(value, str):
            value = getattr(value, "aspect", value)
        if not isinstance(value, str):
            raise ModelError(f"a rubric aspect must be a string or have an 'aspect' text, got {value!r}")
        if value.strip():
            texts.append(" ".join(value.split()))
    return tuple(texts)


def judge_prompt(question: str, aspects: Sequence[Any], answer: str) -> Messages:
    """The judge's chat messages: question, numbered aspects, the answer, the 0/1/2 instruction."""
    texts = aspect_texts(aspects)
    if not texts:
        raise ModelError("a rubric judgement needs at least one aspect")
    listed = "\n".join(f"Aspect {i}: {text}" for i, text in enumerate(texts, start=1))
    user = "\n\n".join([
        f"The question:\n{question.strip()}",
        f"What matters to the person who asked:\n{listed}",
        f"=== Answer ===\n{answer.strip()}\n=== End of answer ===",
        JUDGE_INSTRUCTION,
    ])
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def release_judge_prompt(question: str, aspects: Sequence[Any], answer: str) -> Messages:
    """The rubric judge's chat messages under protocol "release": the question, the answer, the
    aspects (one per line, in order) and the instruction asking for one bracketed list."""
    texts = aspect_texts(aspects)
    if not texts:
        raise ModelError("a rubric judgement needs at least one aspect")
    user = "\n\n".join([
        RELEASE_JUDGE_INSTRUCTION,
        f"Question:\n{question.strip()}",
        f"Answer:\n{answer.strip()}",
        "Aspects, in order:\n" + "\n".join(f"- {text}" for text in texts),
    ])
    return [{"role": "system", "content": RELEASE_JUDGE_SYSTEM}, {"role": "user", "content": user}]


_DECORATION = re.compile(r"[*_`#>]+")  # markdown emphasis, code, headings, quotes
# "Aspect N" at the start of a line (after a list bullet or "1. "), then the rest of the line.
_ASPECT_START = re.compile(r"^(?:[-+\u2022]\s*|\d+[.)]\s+)?aspect\s*(\d+)(?!\d)(.*)$", re.IGNORECASE)
_RESTATED = re.compile(r"""^\s*(?:\([^()]*\)|"[^"]*"|\u201c[^\u201d]*\u201d)""")  # (aspect text) or "aspect text"
# A score: an integer ("2.0" allowed; "1.5", "12" or "-1" are not a 0/1/2 score), optionally "/2" or "out of 2".
_SCORE = r"(?:score\s*[:=]?\s*)?(?<![-\u2212])(\d+)(?:\.0+)?(?![\d.]*\d)\s*(?:/\s*2(?!\d)|out\s+of\s+2(?!\d))?"
_SEPARATOR = r"(?::|=|-|\u2013|\u2014)"
# "Aspect 1: 2", "Aspect 1 - 2 (fully addressed)", "Aspect 1: 2/2": the score first, then
# nothing, punctuation or words, never another number-like token ("2/3", "2 3").
_SCORE_FIRST = re.compile(rf"^\s*{_SEPARATOR}\s*{_SCORE}(?:\s*$|\s*[^\w\s/].*$|\s+[^\d\s/].*$)", re.IGNORECASE)
# "Aspect 1: mentions paper charts: 2": the score last, after a colon, "=" or a spaced dash.
_SCORE_LAST = re.compile(rf"^.*?(?::|=|\s[-\u2013\u2014])\s*{_SCORE}\s*[.)]?\s*$", re.IGNORECASE)
# "Aspect 1:" alone on its line, the score alone on the next.
_BARE_LABEL = re.compile(rf"^\s*{_SEPARATOR}?\s*$")
_BARE_SCORE = re.compile(rf"^\s*{_SCORE}\s*\.?\s*$", re.IGNORECASE)


def _clean_line(raw: str) -> str:
    line = _DECORATION.sub("", raw).strip()
    if "|" in line:  # a markdown table row: | Aspect 1 | 2 |
        line = re.sub(r"\s*\|\s*", " : ", line.strip("| ")).strip()
        if set(line) <= set(":- "):
            return ""  # a table's separator row
    return line


def parse_rubric_scores(text: str, n_aspects: int) -> list[int] | None:
    """The per-aspect scores (0, 1 or 2) in aspect order, or None when the output is unusable.

    Read from lines starting "Aspect N" anywhere in the output; other lines are ignored. Such a
    line gives its score as "Aspect N: S" (also with -, =, "S/2", "Score S", words after it, a
    restated aspect in brackets or quotes before the separator), as "Aspect N: <aspect text>:
    S" (the score last), or, with "Aspect N:" alone, as a bare S on the next non-empty line.
    Markdown emphasis, bullets and table rows are tolerated. None (a parse failure, never a
    default) when any aspect 1..n has no line, a line names an aspect outside 1..n, an aspect
    line has no readable score, a score is not 0, 1 or 2, or two lines for one aspect disagree.
    """
    if n_aspects < 1:
        raise ValueError(f"n_aspects must be at least 1, not {n_aspects}")
    lines = [_clean_line(raw) for raw in (text or "").splitlines()]
    found: dict[int, int] = {}
    for i, line in enumerate(lines):
        start = _ASPECT_START.match(line)
        if not start:
            continue
        number, rest = int(start.group(1)), start.group(2)
        restated = _RESTATED.match(rest)
        if restated:
            rest = rest[restated.end():]
        match = _SCORE_FIRST.match(rest) or _SCORE_LAST.match(rest)
        if match is None and _BARE_LABEL.match(rest):
            following = next((line for line in lines[i + 1:] if line), "")
            match = _BARE_SCORE.match(following)
        if match is None:
            return None  # an aspect line without a readable score
        score = int(match.group(1))
        if not 1 <= number <= n_aspects or score not in SCORE_LEVELS:
            return None
        if found.setdefault(number, score) != score:
            return None
    if len(found) != n_aspects:
        return None
    return [found[i] for i in range(1, n_aspects + 1)]


def _as_judge_request(value: Any) -> JudgeRequest:
    if isinstance(value, JudgeRequest):
        request = value
    elif isinstance(value, Mapping):
        try:
            request = JudgeRequest(value["key"], value["question"], tuple(value["aspects"]), value["answer"])
        except KeyError as exc:
            raise ModelError(f"a judge request needs key, question, aspects and answer; {exc} is missing") from None
    else:
        raise ModelError(f"a judge request must be a JudgeRequest or a mapping, not {type(value).__name__}")
    if not isinstance(request.question, str) or not isinstance(request.answer, str):
        raise ModelError(f"judge request {request.key!r}: question and answer must be strings")
    aspects = aspect_texts(request.aspects)
    if not aspects:
        raise ModelError(f"judge request {request.key!r} has no rubric aspects")
    return JudgeRequest(request.key, request.question, aspects, request.answer)


def judge_answers(judge_backend: Any, requests: Iterable[Any], *, temperature: float = 0.0, max_tokens: int = 256,
                  seed: int | None = 0, protocol: str = "prbench",
                  ) -> Iterator[tuple[Hashable, float | None, str | Exception]]:
    """Yield (key, mean aspect score in [0, 2] or None, raw output) per request, in any order.

    None with a string raw: the output did not parse (see parse_rubric_scores). None with an
    Exception as raw: the request failed, or the verdict was truncated or refused twice (`llm.ask`;
    an AnswerError with that reason); the other requests go on. Every request is checked
    before the first call (ModelError for a request without aspects or a repeated key).

    protocol "release" (the authors' BoN/evaluate.py): the list prompt (`release_judge_prompt`),
    greedy, `protocols.RELEASE_RUBRIC_JUDGE` tokens (temperature and max_tokens given here are not
    used), ONE request whose text is read as it comes (cut, refused or empty alike), graded by
    `protocols.release_rubric_score`: never None for an answer (an unreadable one scores 0 and
    stays in the mean); only a failed request (an Exception) gives None.
    """
    prepared = [_as_judge_request(r) for r in requests]
    _refuse_duplicates(r.key for r in prepared)
    if protocol == "release":
        yield from _judge_released(judge_backend, prepared, seed=seed)
        return

    def one(request: JudgeRequest) -> tuple[Hashable, float | None, str | Exception]:
        try:
            completions = ask(judge_backend, judge_prompt(request.question, request.aspects, request.answer),
                              temperature=temperature, max_tokens=max_tokens, seed=seed, n=1, what="judge verdict")
        except Exception as exc:  # reported per request
            if is_interrupt(exc):
                raise
            return request.key, None, exc
        raw = completions[0].text if completions else ""
        scores = parse_rubric_scores(raw, len(request.aspects))
        return request.key, (None if scores is None else sum(scores) / len(scores)), raw

    yield from run_unordered(judge_backend, one, prepared)


def _judge_released(judge_backend: Any, prepared: list[JudgeRequest], *,
                    seed: int | None) -> Iterator[tuple[Hashable, float | None, str | Exception]]:
    from prblib.rewards.protocols import RELEASE_RUBRIC_JUDGE, release_rubric_score

    def one(request: JudgeRequest) -> tuple[Hashable, float | None, str | Exception]:
        try:
            completions = judge_backend.complete(release_judge_prompt(request.question, request.aspects,
                                                                      request.answer),
                                                 temperature=RELEASE_RUBRIC_JUDGE["temperature"],
                                                 max_tokens=RELEASE_RUBRIC_JUDGE["max_tokens"], seed=seed, n=1,
                                                 schema=None)
        except Exception as exc:  # reported per request: a failed request is asked again later
            if is_interrupt(exc):
                raise
            return request.key, None, exc
        raw = completions[0].text if completions else ""
        return request.key, release_rubric_score(raw), raw

    yield from run_unordered(judge_backend, one, prepared)


# --------------------------------------------------------------------------------------------
# 5. Outcomes


def outcomes(judged: Mapping[tuple[str, int], float | None], domains: Mapping[str, str], *, seed: int = 0,
             resamples: int = 1000) -> dict[int, dict[str, Any]]:
    """Per k (ascending): {mean, ci_low, ci_high, n, failures, by_domain: {domain: same five}}.

    `judged` maps (item, k) to the judge's score of the item's pick at k, None for a failure
    (parse or request). Failures are excluded from the mean and counted; n counts the scored
    items. The CI is a 95% percentile bootstrap over items (seeded, `resamples` resamples);
    mean and CI are None when nothing was scored. Every item needs a domain.
    """
    from prblib.stats.metrics import bootstrap_ci  # numpy; imported when used

    rows: dict[int, list[tuple[str, float | None]]] = {}
    for key, value in judged.items():
        try:
            item, k = key
        except (TypeError, ValueError):
            raise ValueError(f"judged keys must be (item, k), not {key!r}") from None
        if item not in domains:
            raise ValueError(f"item {item!r} has no domain")
        if value is not None:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"the score of {key!r} is not finite; use None for a failure")
        rows.setdefault(int(k), []).append((domains[item], value))

    def summary(values: list[float | None]) -> dict[str, Any]:
        scored = [v for v in values if v is not None]
        low, high = bootstrap_ci(scored, resamples=resamples, seed=seed)
        return {"mean": sum(scored) / len(scored) if scored else None, "ci_low": low, "ci_high": high,
                "n": len(scored), "failures": len(values) - len(scored)}

    result: dict[int, dict[str, Any]] = {}
    for k in sorted(rows):
        entry = summary([v for _, v in rows[k]])
        entry["by_domain"] = {domain: summary([v for d, v in rows[k] if d == domain])
                              for domain in sorted({d for d, _ in rows[k]})}
        result[k] = entry
    return result


def _refuse_duplicates(ids: Iterable[Hashable]) -> None:
    seen: set[Hashable] = set()
    for value in ids:
        if value in seen:
            raise ModelError(f"{value!r} appears twice")
        seen.add(value)
