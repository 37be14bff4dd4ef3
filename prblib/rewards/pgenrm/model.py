"""P-GenRM: a generative reward model that writes a structured evaluation chain for one user,
with user prototypes and test-time scaling.

Evaluation chain. The judge LLM is shown what is known about the person (their preference
signals: past posts, and for pair-history data their earlier chosen/rejected pairs), the
question and the two answers labelled A and B, and asked to write, in order: a persona (who the
person is and what they want), 3-6 weighted criteria (whole-number weights summing to 100),
a 1-10 score per answer per criterion, and each answer's weighted total; it must end with ONE
JSON object:

    {"persona": str, "criteria": [{"name": str, "weight": number}, ...],
     "scores": {"A": {criterion: 1-10, ...}, "B": {...}}, "totals": {"A": number, "B": number}}

Which preference signals a chain sees follows the setting, as for every RM kind:
- no_profile: none (the prompt says nothing is known about the person);
- profile: the first `profile_k` profile posts and the first `profile_k` history pairs
  (`PairInput.history`, each {"prompt", "chosen", "rejected"}; other keys are never read).
  Pair-history items also carry their history rendered as text in `profile` (so text-only kinds
  see it); a profile entry that contains a history item's prompt, chosen and rejected texts is
  that item again and is left out, so each earlier choice appears once, as a structured pair;
- plan: the planner's aspects only.
Narrative and rubric aspects are never shown: PairInput has no field for them.

Chain formats (option chain_format). "native" (the default) is the format above. "published" is the
format the authors' released checkpoints were trained on (prblib.rewards.pgenrm.published: an analysis,
then one JSON object between <JSON_START> and <JSON_END> whose "better_response" holds both final
scores); its totals are the model's own scores, and its persona is the analysis text.

Position bias. Each chain shows the answers in one order. Native: chain i shows the chosen answer as A
when (h + i) is even, as B otherwise, where h is a bit from the sha256 of the pair id: so the m
chains of a pair alternate A/B (exactly half each for even m, and for every even prefix m' <= m),
and with odd m (m = 1 included) which order gets the extra chain varies from pair to pair instead
of always favouring one position. Neighbour chains alternate the same way by neighbour index.
Published: as the release, one random order per pair (a bit of sha256(seed, pair id)) shared by all
m chains and all neighbour chains of the pair (`shared_position`).

Strict parsing (`parse_chain`). The JSON object is the last fenced block (```json or plain ```)
holding an object, or a bare {...} after it; an object left unclosed (a reply cut by max_tokens)
or unparseable is a failure, never a guess. Weights must be finite numbers >= 0 that sum to
100 +/- 0.5; each criterion must be scored (a number in [1, 10]) for both answers; no score for an
unknown criterion. Criterion names match across "criteria" and "scores" ignoring case and
repeated spaces. The totals are RECOMPUTED, sum(weight * score) / 100; the model's own totals
must be present and numeric but are not trusted: when one differs from the recomputation by more
than 0.5 the chain is flagged `totals_mismatch` (and still counts, with the recomputed value).
A failure is `ParseFailure(reason, detail)` with reason one of FAILURE_REASONS.

User prototypes (`fit_prototypes`, `Prototypes`, `build_prototypes`). Training users' embeddings
(the mean of the L2-normalised embeddings of their deduplicated signal texts, normalised again: see
`user_embedding`; or, as the paper, of the personas a P-GenRM judge inferred for them:
`PGenRM.infer_personas`) are clustered with scikit-learn K-means (k = 50 by default, n_init = 10,
random_state = seed), k capped by the number of users (and of distinct embeddings). With
k_from_variance = f, k is instead the smallest number of principal components whose cumulative
explained variance ratio reaches f. Centroids are L2-normalised and a user is assigned to the most
similar centroid by cosine; `similar_users` returns the n members of the most similar prototype most
similar to the query by cosine, continuing with the next prototypes while fewer than n are found. The
query user is never among them: training users with the pair's `user_id`, or whose stored signals equal
the pair's, are left out (option include_self_neighbours=true keeps them, as the release does).
`build_prototypes --refine` adds refined centroids (prblib.rewards.pgenrm.refine); option
prototype_stage (initial | refined; default refined when the file has them) picks the set in use.
A prototypes file (JSON + .npz arrays, `Prototypes.save`) also stores each training user's
signals, so neighbours' chains can be built.

Test-time scaling (`scaled_score`). The score of a response is the mean of its totals over the
user's m sampled chains plus the mean of its totals over the chains of the n most similar
training users (each neighbour's chain uses THAT user's signals with the current question and
answers). Failed chains are dropped from their mean (never counted as a default score); when all
m individual chains fail the score is None and the pair is wrong; when n = 0 or every neighbour
chain fails the neighbour term is left out. A chain fails for both answers at once, so chosen and
rejected are always averaged over the same chains. Chains are sampled at temperature > 0 with
seed `seed + i` for chain i (neighbour j: `seed + j`), so every chain is reproducible and cached
(CachedBackend keys include the seed) and a chain does not change when m or n does.
Neighbours are looked up only in the profile setting and only for a user with signals (the
other settings show no signals to embed); `details["neighbours_skipped"]` says why otherwise.
A training user whose stored signals equal the pair's own is the same person and is skipped.

Options (ModelSpec.options; the one schema is `options.PGenRMOptions`). The backend (a
staff-configured endpoint, or the local folder spec.path), the cache folder and the published
format's template file come from ModelSpec.runtime (`llm.build_backend`), never from the options:
    preset       none | "paper": m=16, n=8, temperature 1.0, max_tokens 8192 (options.PAPER_PRESET);
                 an explicit m, n, temperature or max_tokens wins over the preset
    chain_format "native" | "published" (see above)
    m            4: individual chains per pair (1-64)
    n            0: neighbour users per pair (0-256); n > 0 needs `prototypes`
    temperature  0.7: sampling temperature, above 0 (0 is accepted only with m = 1)
    max_tokens   1024: room for the whole chain and its JSON
    seed         0: chain i is sampled with seed + i
    prototypes   a prototypes JSON (`Prototypes.save`) with every user's signals, named
                 relative to runtime["data_root"] and resolved inside it; the user embedder it
                 names is loaded when n > 0 (its embeddings are cached under
                 runtime["cache_dir"]/embeddings when a cache folder is given)
    prototype_stage  "initial" | "refined" (default: refined when the file holds them)
    include_self_neighbours  false: the query user is never their own neighbour
runtime["pgenrm_template"] (operators only, e.g. `evaluate_rm --template-file`): a {"system", "user"}
JSON template for the published format (pgenrm_published.Template), resolved inside the data folder.
Unknown options are refused.

Result details (one PairResult per pair; chosen_score / rejected_score = scaled scores):
    {"m": m, "n": n, "chain_format": "native"|"published",
     "first_shown": "chosen"|"rejected" (the answer chain 0 shows as A; see authors_accuracy),
     "chains": [{"chosen_position": "A"|"B", "seed": int, "chosen_total": float|None,
                 "rejected_total": float|None, "failure": reason|None, "failure_detail": str|None,
                 "totals_mismatch": bool, "criteria": [{"name", "weight"}], "raw": str (failures
                 only, first RAW_CHARS characters)}, ...],          # m entries, chain order
     "neighbours": [{"user": id, "similarity": cosine, ... same keys as a chain}, ...],  # <= n
     "neighbours_skipped": reason|None, "parse_failures": failed chains, neighbours included}
`accuracy_grid(details_list, ms, ns)` recomputes the accuracy for any m' <= m, n' <= n from
these (prefixes of the chain and neighbour lists). Request errors (an endpoint down after its
retries) are not parse failures: they raise ModelError as for the other judges.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prblib.rewards.base import ModelSpec, PairInput, PairResult, ProgressFn, check_setting
from prblib.registry import DEFAULT_PROFILE_K
from prblib.errors import ModelError
from prblib.rewards.pgenrm import published
from prblib.llm.answers import AnswerError
from prblib.context import PLAN_HEADING, bulleted, numbered
from prblib.rewards.generative import UNUSABLE, GenerativeRewardModel
from prblib.llm.client import ask, messages_as_text, run_unordered
from prblib.rewards.options import PGenRMOptions, parse_options
from prblib.prompts import TextTemplate
from prblib.rows import json_limit_reason

RAW_CHARS = 500  # how much of a failed chain's output is kept in the details
WEIGHT_SUM = 100.0
WEIGHT_TOLERANCE = 0.5
TOTALS_TOLERANCE = 0.5
SCORE_LOW, SCORE_HIGH = 1.0, 10.0
LABELS = ("A", "B")
_FIELDS = PGenRMOptions.model_fields  # the defaults are declared once, in the options schema
DEFAULT_M, DEFAULT_N = _FIELDS["m"].default, _FIELDS["n"].default
DEFAULT_TEMPERATURE = _FIELDS["temperature"].default
DEFAULT_MAX_TOKENS = _FIELDS["max_tokens"].default
DEFAULT_K = 50
KMEANS_N_INIT = 10
CHAIN_FORMATS = ("native", "published")
PROTOTYPE_STAGES = ("initial", "refined")
PROTOTYPES_FORMAT = "prbench-pgenrm-prototypes"
FAILURE_REASONS = ("truncated", "refused",  # from llm.ask: the chain was cut short or refused twice
                   "no_answer", "filtered", "unfinished",  # the answer's normaliser (generative.UNUSABLE)
                   "no_json", "malformed_json", "missing_persona", "bad_criteria", "bad_weight", "weights_sum",
                   "missing_scores", "bad_score", "score_out_of_range", "unknown_criterion", "bad_totals")

Embed = Callable[[list[str]], np.ndarray]



# --------------------------------------------------------------------------------------------
# Prompt

SYSTEM = (
    "You are a careful evaluator of answers written for one particular person. You do not judge "
    "answers in general: you judge how well each would serve this person. First you work out who the "
    "person is and what they want, using only the evidence given about them (things they wrote, answers "
    "they preferred before). Then you turn that into weighted criteria and score each answer on every "
    "criterion. Which answer comes first, and how long it is, are never reasons to prefer it."
)

EVIDENCE_HEADING = "What is known about the person who asked:"
NOTHING_KNOWN = "Nothing is known about this person beyond the question they asked."
POSTS_HEADING = "Things this person wrote before (most relevant first):"
HISTORY_HEADING = ("Earlier choices by this person. Each time they were shown two answers to a question of "
                   "theirs and preferred one of them:")

INSTRUCTION = (
    "Evaluate the two answers for this person in four steps.\n"
    "1. Persona. In a few sentences, say who this person seems to be and what they want from an answer "
    "to this question: their situation, interests, needs, tastes, and how they like to be addressed. "
    "Base it only on the evidence above; where it says nothing, say so rather than guess.\n"
    "2. Criteria. Choose 3 to 6 criteria that decide how well an answer serves this person on this "
    "question, and give each a whole-number weight. The weights must add up to exactly 100. Give most "
    "of the weight to what is specific to this person, the rest to general quality (correct, relevant, "
    "helpful).\n"
    "3. Scores. Score Answer A and Answer B on every criterion, from 1 (fails it completely) to 10 "
    "(meets it fully).\n"
    "4. Totals. For each answer, the weighted total is the sum over the criteria of weight times score, "
    "divided by 100.\n"
    "Write your reasoning for each step first. Then end your reply with exactly one JSON object in a "
    "```json block, with nothing after it, in this form (criterion names in \"scores\" spelled exactly "
    "as in \"criteria\"):\n"
    "```json\n"
    "{\"persona\": \"<a sentence or two>\", \"criteria\": [{\"name\": \"<criterion>\", \"weight\": <number>}, "
    "...], \"scores\": {\"A\": {\"<criterion>\": <1-10>, ...}, \"B\": {\"<criterion>\": <1-10>, ...}}, "
    "\"totals\": {\"A\": <number>, \"B\": <number>}}\n"
    "```"
)

# The native chain's prompt; bump the version whenever any of its texts changes (tests pin it).
NATIVE_TEMPLATE = TextTemplate("pgenrm-native", 1, (SYSTEM, EVIDENCE_HEADING, NOTHING_KNOWN, POSTS_HEADING,
                                                    HISTORY_HEADING, PLAN_HEADING, INSTRUCTION))


def chain_prompts(options: dict[str, Any], *, template_file: str | None = None) -> dict[str, str]:
    """P-GenRM's prompts (registry `prompts`): {"chain": "name@vN"}, the native or the published
    format's template by option `chain_format`; in the published format an operator's
    `template_file` is recorded as "file:<sha256 of its text>" (OSError when it cannot be read)."""
    from prblib.prompts import text_sha256

    if options.get("chain_format") == "published":
        if template_file:
            return {"chain": f"file:{text_sha256(Path(template_file).read_text(encoding='utf-8'))}"}
        return {"chain": published.PUBLISHED_TEMPLATE.key}
    return {"chain": NATIVE_TEMPLATE.key}


def _block(label: str, text: str) -> str:
    return f"=== {label} ===\n{text.strip()}\n=== End of {label.lower()} ==="


@dataclass(frozen=True)
class Signals:
    """The preference signals a chain shows: posts, earlier (prompt, chosen, rejected) pairs, plan aspects."""

    posts: tuple[str, ...] = ()
    history: tuple[tuple[str, str, str], ...] = ()
    plan: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.posts or self.history or self.plan)


def _history_items(history: Iterable[Any], *, owner: str) -> list[tuple[str, str, str]]:
    items = []
    for index, item in enumerate(history, start=1):
        if not isinstance(item, Mapping):
            raise ModelError(f"{owner}: history item {index} is not an object with prompt, chosen and rejected")
        parts = tuple(item.get(key) for key in ("prompt", "chosen", "rejected"))  # nothing else is read
        if not all(isinstance(part, str) for part in parts):
            raise ModelError(f"{owner}: history item {index} needs text fields prompt, chosen and rejected")
        items.append(parts)
    return items


def _renders(post: str, item: tuple[str, str, str]) -> bool:
    """Whether a profile entry is this history item written out as text."""
    parts = [part.strip() for part in item if part.strip()]
    return bool(parts) and all(part in post for part in parts)


def user_signals(profile: Sequence[str], history: Iterable[Any], *, k: int = DEFAULT_PROFILE_K,
                 owner: str = "user") -> Signals:
    """A user's posts and earlier pairs as a chain shows them: at most k of each, and no post that
    merely repeats a history item as text (see the module docstring)."""
    items = _history_items(history, owner=owner)
    posts = [str(post) for post in profile if not any(_renders(str(post), item) for item in items)]
    return Signals(posts=tuple(posts[:k]), history=tuple(items[:k]))


def signal_texts(signals: Signals) -> list[str]:
    """The texts a user is embedded from: each post, and each earlier question with the answer preferred."""
    return list(signals.posts) + [f"{prompt.strip()}\n{chosen.strip()}" for prompt, chosen, _ in signals.history]


def render_evidence(signals: Signals) -> str:
    parts = []
    if signals.posts:
        parts.append(f"{POSTS_HEADING}\n{numbered(signals.posts)}")
    if signals.history:
        choices = [f"Choice {i}\nTheir question: {prompt.strip()}\nThe answer they preferred: {chosen.strip()}\n"
                   f"The answer they passed over: {rejected.strip()}"
                   for i, (prompt, chosen, rejected) in enumerate(signals.history, start=1)]
        parts.append(HISTORY_HEADING + "\n\n" + "\n\n".join(choices))
    if signals.plan:
        parts.append(PLAN_HEADING + "\n" + bulleted(signals.plan))
    return "\n\n".join(parts) if parts else NOTHING_KNOWN


def published_history(signals: Signals) -> list[tuple[str, str, str]]:
    """What the published format shows of a user: their earlier (query, chosen, rejected) triples; posts
    and plan aspects (LaMP-QA benchmarks) become triples with nothing turned down, so no signal is lost."""
    triples = list(signals.history)
    triples += [("(something this user wrote)", post, "-") for post in signals.posts]
    triples += [("(what this user is likely to value)", aspect, "-") for aspect in signals.plan]
    return triples


def chain_messages(signals: Signals, question: str, answer_a: str, answer_b: str) -> list[dict[str, str]]:
    """The chat messages of one evaluation chain."""
    user = "\n\n".join([EVIDENCE_HEADING, render_evidence(signals), _block("Question", question),
                        _block("Answer A", answer_a), _block("Answer B", answer_b), INSTRUCTION])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class Chain:
    """A well-formed evaluation chain. `totals` are recomputed from weights and scores;
    `stated_totals` are the model's own, kept only to flag a mismatch."""

    persona: str
    criteria: tuple[tuple[str, float], ...]
    scores: dict[str, dict[str, float]]  # label -> criterion name (as in criteria) -> 1-10
    totals: dict[str, float]
    stated_totals: dict[str, float]
    totals_mismatch: bool


@dataclass(frozen=True)
class ParseFailure:
    reason: str  # one of FAILURE_REASONS
    detail: str = ""


class _Invalid(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\r?\n(.*?)```", re.S)


def _scan_objects(text: str) -> tuple[list[tuple[int, int]], bool]:
    """Top-level {...} spans (braces inside JSON strings ignored) and whether an object is left open."""
    spans: list[tuple[int, int]] = []
    depth, start, in_string, escaped = 0, 0, False, False
    for i, ch in enumerate(text):
        if depth == 0:
            if ch == "{":
                depth, start, in_string, escaped = 1, i, False, False
            continue
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans, depth > 0


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _load_object(text: str) -> dict[str, Any]:
    limit = json_limit_reason(text)  # the judge's reply: nesting and numbers bounded before parsing
    if limit:
        raise _Invalid("malformed_json", f"the final JSON object is refused: {limit}")
    try:
        value = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise _Invalid("malformed_json", f"the final JSON object does not parse: {exc}") from None
    if not isinstance(value, dict):
        raise _Invalid("malformed_json", "the final JSON value is not an object")
    return value


def _final_object(text: str) -> dict[str, Any]:
    """The last JSON object of a reply: the last fenced block holding one, unless a bare object follows it."""
    fenced = [m for m in _FENCE.finditer(text) if m.group(2).strip().startswith("{")]
    tail_start = fenced[-1].end() if fenced else 0
    spans, unclosed = _scan_objects(text[tail_start:])
    if unclosed:
        raise _Invalid("malformed_json", "the final JSON object is not closed (was the reply cut short?)")
    if spans:
        start, end = spans[-1]
        return _load_object(text[tail_start + start:tail_start + end])
    if fenced:
        return _load_object(fenced[-1].group(2).strip())
    raise _Invalid("no_json", "the reply has no JSON object")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _name_key(name: str) -> str:
    return " ".join(name.split()).casefold()


def _by_label(value: Any, what: str, labels: Sequence[str]) -> dict[str, Any]:
    """A {"A": ..., "B": ...} object, labels matched ignoring case and spaces; other keys refused."""
    if not isinstance(value, dict):
        raise _Invalid("missing_scores" if what == "scores" else "bad_totals", f"\"{what}\" is not an object")
    found: dict[str, Any] = {}
    for key, entry in value.items():
        label = key.strip().upper()
        if label not in labels or label in found:
            raise _Invalid("missing_scores" if what == "scores" else "bad_totals",
                           f"\"{what}\" has an unexpected key {key!r} (expected {', '.join(labels)})")
        found[label] = entry
    for label in labels:
        if label not in found:
            raise _Invalid("missing_scores" if what == "scores" else "bad_totals",
                           f"\"{what}\" has nothing for answer {label}")
    return found


def _validate(obj: dict[str, Any], labels: Sequence[str]) -> Chain:
    persona = obj.get("persona")
    if not isinstance(persona, str) or not persona.strip():
        raise _Invalid("missing_persona", "\"persona\" must be a non-empty text")

    criteria = obj.get("criteria")
    if not isinstance(criteria, list) or not criteria:
        raise _Invalid("bad_criteria", "\"criteria\" must be a non-empty list")
    named: dict[str, tuple[str, float]] = {}
    for index, criterion in enumerate(criteria, start=1):
        if not isinstance(criterion, dict) or not isinstance(criterion.get("name"), str) \
                or not criterion["name"].strip():
            raise _Invalid("bad_criteria", f"criterion {index} is not {{\"name\": text, \"weight\": number}}")
        name, weight = criterion["name"].strip(), criterion.get("weight")
        if not _is_number(weight) or weight < 0:
            raise _Invalid("bad_weight", f"criterion {name!r} has weight {weight!r}, not a number >= 0")
        key = _name_key(name)
        if key in named:
            raise _Invalid("bad_criteria", f"criterion {name!r} is listed twice")
        named[key] = (name, float(weight))
    weight_sum = sum(weight for _, weight in named.values())
    if abs(weight_sum - WEIGHT_SUM) > WEIGHT_TOLERANCE:
        raise _Invalid("weights_sum", f"the weights sum to {weight_sum:g}, not {WEIGHT_SUM:g}")

    scores: dict[str, dict[str, float]] = {}
    for label, table in _by_label(obj.get("scores"), "scores", labels).items():
        if not isinstance(table, dict):
            raise _Invalid("missing_scores", f"the scores of answer {label} are not an object")
        given: dict[str, Any] = {}
        for name, value in table.items():
            key = _name_key(name)
            if key not in named:
                raise _Invalid("unknown_criterion", f"answer {label} is scored on {name!r}, which is not a criterion")
            if key in given:
                raise _Invalid("bad_score", f"answer {label} is scored twice on {name!r}")
            given[key] = value
        scores[label] = {}
        for key, (name, _) in named.items():
            if key not in given:
                raise _Invalid("missing_scores", f"answer {label} has no score for {name!r}")
            value = given[key]
            if not _is_number(value):
                raise _Invalid("bad_score", f"answer {label}'s score for {name!r} is {value!r}, not a number")
            if not SCORE_LOW <= value <= SCORE_HIGH:
                raise _Invalid("score_out_of_range", f"answer {label}'s score for {name!r} is {value:g}, "
                                                     f"outside {SCORE_LOW:g}-{SCORE_HIGH:g}")
            scores[label][name] = float(value)

    stated: dict[str, float] = {}
    for label, value in _by_label(obj.get("totals"), "totals", labels).items():
        if not _is_number(value):
            raise _Invalid("bad_totals", f"the total of answer {label} is {value!r}, not a number")
        stated[label] = float(value)

    totals = {label: sum(weight * scores[label][name] for name, weight in named.values()) / WEIGHT_SUM
              for label in labels}
    mismatch = any(abs(stated[label] - totals[label]) > TOTALS_TOLERANCE for label in labels)
    return Chain(persona=persona.strip(), criteria=tuple(named.values()), scores=scores, totals=totals,
                 stated_totals=stated, totals_mismatch=mismatch)


def parse_published_chain(text: str) -> Chain | ParseFailure:
    """A reply in the published format (pgenrm_published) as a Chain: totals A = response_1 and
    B = response_2 as the model gave them (nothing to recompute: the weights and per-criterion scores
    are text inside the rationale), persona = the analysis before the JSON."""
    try:
        analysis, scores = published.parse_published(text)
    except published.Invalid as exc:
        return ParseFailure(exc.reason, exc.detail)
    totals = {"A": scores["response_1"], "B": scores["response_2"]}
    return Chain(persona=analysis, criteria=(), scores={}, totals=totals, stated_totals=dict(totals),
                 totals_mismatch=False)


def parse_chain(text: str, *, labels: Sequence[str] = LABELS) -> Chain | ParseFailure:
    """The chain in a judge's reply, or why there is none (see the module docstring)."""
    try:
        return _validate(_final_object(text or ""), labels)
    except _Invalid as exc:
        return ParseFailure(exc.reason, exc.detail)


# --------------------------------------------------------------------------------------------
# Test-time scaling


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def scaled_score(individual: Sequence[float | None], neighbours: Sequence[float | None] = ()) -> float | None:
    """mean(individual chains' totals) + mean(neighbour chains' totals).

    None entries are failed chains and are dropped from their mean. No successful individual
    chain: None (no score; the pair is wrong). No neighbours (n = 0) or none successful: the
    neighbour term is left out and the score is the individual mean."""
    own = _mean(individual)
    if own is None:
        return None
    others = _mean(neighbours)
    return own if others is None else own + others


def pair_scores(details: Mapping[str, Any], m: int | None = None, n: int | None = None
                ) -> tuple[float | None, float | None]:
    """(chosen, rejected) scaled scores from a result's details, using its first m chains and n neighbours."""
    chains = list(details.get("chains") or [])[:m]
    neighbours = list(details.get("neighbours") or [])[:n]
    return (scaled_score([c.get("chosen_total") for c in chains], [c.get("chosen_total") for c in neighbours]),
            scaled_score([c.get("rejected_total") for c in chains], [c.get("rejected_total") for c in neighbours]))


def authors_accuracy(details_list: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The accuracy as the authors' release counts it, beside our strict one (chosen must score
    strictly higher; ties and unscored pairs are wrong, the leaderboard's rule). Two rules, from the
    release's two evaluation scripts, both over the pairs' scaled scores:
      baseline_rule: ties and unscored pairs are dropped from the denominator;
      scaling_rule: unscored pairs are dropped, a tie goes to the response shown first
        (details["first_shown"]: the answer chain 0 showed as A; the published format shows every chain
        of a pair in that one order).
    Returns {"strict": {...}, "baseline_rule": {...}, "scaling_rule": {...}}, each
    {"accuracy": float|None, "correct": int, "counted": int, "dropped": int}."""
    details_list = list(details_list)
    strict = baseline = scaling = 0
    ties = unscored = 0
    for details in details_list:
        chosen, rejected = pair_scores(details)
        if chosen is None or rejected is None:
            unscored += 1
        elif chosen > rejected:
            strict += 1
            baseline += 1
            scaling += 1
        elif chosen == rejected:
            ties += 1
            scaling += details.get("first_shown") == "chosen"

    def rule(correct: int, dropped: int) -> dict[str, Any]:
        counted = len(details_list) - dropped
        return {"accuracy": correct / counted if counted else None, "correct": correct, "counted": counted,
                "dropped": dropped}

    return {"strict": rule(strict, 0), "baseline_rule": rule(baseline, ties + unscored),
            "scaling_rule": rule(scaling, unscored)}


def scaling_grid(details_list: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{"m", "n", "accuracy"}] for every m' <= m and n' <= n the results allow (the m and n each
    pair was scored with, which a preset may have set), from `accuracy_grid`."""
    details_list = list(details_list)
    if not details_list:
        return []
    m = min(min(int(d.get("m", 0)), len(d.get("chains") or [])) for d in details_list)
    n = min(int(d.get("n", 0)) for d in details_list)
    if m < 1:
        return []
    grid = accuracy_grid(details_list, range(1, m + 1), range(0, n + 1))
    return [{"m": mm, "n": nn, "accuracy": acc} for (mm, nn), acc in sorted(grid.items())]


def accuracy_grid(details_list: Sequence[Mapping[str, Any]], ms: Iterable[int], ns: Iterable[int]
                  ) -> dict[tuple[int, int], float]:
    """{(m', n'): accuracy} recomputed from PairResult details, as if each pair had been scored with its
    first m' chains and first n' neighbours (chosen must score strictly higher; ties and missing
    scores are wrong). Every m' must be in 1..m and n' in 0..n of every result."""
    details_list = list(details_list)
    if not details_list:
        raise ValueError("accuracy_grid needs at least one result")
    ms, ns = list(ms), list(ns)
    for details in details_list:
        m_max = min(int(details.get("m", 0)), len(details.get("chains") or []))
        n_max = int(details.get("n", 0))
        for m in ms:
            if not 1 <= m <= m_max:
                raise ValueError(f"m={m} is not available: the results hold {m_max} chain(s) per pair")
        for n in ns:
            if not 0 <= n <= n_max:
                raise ValueError(f"n={n} is not available: the results were scored with n={n_max}")
    grid = {}
    for m in ms:
        for n in ns:
            correct = 0
            for details in details_list:
                chosen, rejected = pair_scores(details, m, n)
                correct += chosen is not None and rejected is not None and chosen > rejected
            grid[(m, n)] = correct / len(details_list)
    return grid


# --------------------------------------------------------------------------------------------
# User prototypes


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def user_embedding(embed: Embed, signals: Signals) -> np.ndarray:
    """The mean of a user's signal-text embeddings (each L2-normalised first, so no text dominates by
    its norm), L2-normalised: one float32 vector. A user without signals cannot be embedded."""
    texts = signal_texts(signals)
    if not texts:
        raise ValueError("a user without preference signals has no embedding")
    vectors = _unit_rows(np.asarray(embed(texts), dtype=np.float64))
    return _unit_rows(vectors.mean(axis=0)).astype(np.float32)


def k_for_variance(embeddings: np.ndarray, fraction: float) -> int:
    """The smallest number of principal components whose cumulative explained variance reaches fraction."""
    if not 0 < fraction <= 1:
        raise ValueError(f"k_from_variance must be in (0, 1], not {fraction!r}")
    x = np.asarray(embeddings, dtype=np.float64)
    if x.shape[0] < 2 or not np.any(x.var(axis=0) > 0):
        return 1  # one user, or all the same: nothing to explain
    from sklearn.decomposition import PCA

    ratios = PCA(n_components=min(x.shape), svd_solver="full").fit(x).explained_variance_ratio_
    cumulative = np.cumsum(ratios)
    return int(min(np.searchsorted(cumulative, fraction - 1e-9) + 1, len(ratios)))


@dataclass(eq=False)  # numpy fields: compare with to_dict() if ever needed
class Prototypes:
    """K-means user prototypes: the training users, their embeddings, their prototype, the centroids
    (L2-normalised: users are compared by cosine), the refined centroids when `build_prototypes
    --refine` made them, and (for neighbour chains) each user's raw signals {"profile", "history"}.
    `stage` says which centroids are in use ("initial" or "refined"; see at_stage)."""

    user_ids: list[str]
    embeddings: np.ndarray  # (users, dim)
    labels: np.ndarray  # (users,): each user's prototype
    centroids: np.ndarray  # (k, dim), unit rows
    seed: int = 0
    k_from_variance: float | None = None
    embedder: dict[str, Any] | None = None  # which model embedded the users (see PGenRM.load)
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)
    refined: np.ndarray | None = None  # (k, dim), unit rows
    source: str = "histories"  # what users were embedded from: "histories" or "personas"
    refinement: dict[str, Any] | None = None  # the refinement's settings and losses
    stage: str = "initial"

    def __post_init__(self) -> None:
        self.user_ids = [str(u) for u in self.user_ids]
        self.embeddings = np.asarray(self.embeddings, dtype=np.float32)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.centroids = _unit_rows(np.asarray(self.centroids, dtype=np.float64)).astype(np.float32)
        if self.refined is not None:
            self.refined = _unit_rows(np.asarray(self.refined, dtype=np.float64)).astype(np.float32)
            if self.refined.shape != self.centroids.shape:
                raise ValueError(f"refined centroids must be {self.centroids.shape}, not {self.refined.shape}")
        users = len(self.user_ids)
        if len(set(self.user_ids)) != users:
            raise ValueError("user ids must be unique")
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != users:
            raise ValueError(f"embeddings must be ({users}, dim), not {self.embeddings.shape}")
        if self.centroids.ndim != 2 or self.centroids.shape[1] != self.embeddings.shape[1] or not len(self.centroids):
            raise ValueError(f"centroids must be (k, {self.embeddings.shape[1]}), not {self.centroids.shape}")
        if self.labels.shape != (users,) or (users and not (0 <= self.labels.min() and
                                                             self.labels.max() < len(self.centroids))):
            raise ValueError("each user needs a prototype index below k")
        self._unit = _unit_rows(self.embeddings.astype(np.float64))

    @property
    def k(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def members(self) -> list[list[str]]:
        """The user ids of each prototype, in training order."""
        groups: list[list[str]] = [[] for _ in range(self.k)]
        for user, label in zip(self.user_ids, self.labels.tolist()):
            groups[label].append(user)
        return groups

    def _vector(self, embedding: Any) -> np.ndarray:
        vector = np.asarray(embedding, dtype=np.float64).reshape(-1)
        if vector.shape[0] != self.dim:
            raise ValueError(f"an embedding of dimension {vector.shape[0]} for prototypes of dimension {self.dim}")
        return vector

    def at_stage(self, stage: str | None) -> Prototypes:
        """These prototypes with the "initial" or "refined" centroids in use; None: refined when present."""
        if stage is None:
            stage = "refined" if self.refined is not None else "initial"
        if stage not in PROTOTYPE_STAGES:
            raise ValueError(f"prototype stage must be one of {', '.join(PROTOTYPE_STAGES)}, not {stage!r}")
        if stage == "refined" and self.refined is None:
            raise ValueError("it holds no refined prototypes (build them with build_prototypes --refine)")
        self.stage = stage
        return self

    @property
    def active(self) -> np.ndarray:
        """The centroids in use (see stage)."""
        return self.refined if self.stage == "refined" and self.refined is not None else self.centroids

    def _order(self, vector: np.ndarray) -> np.ndarray:
        similarity = self.active.astype(np.float64) @ _unit_rows(vector)
        return np.argsort(-similarity, kind="stable")

    def assign(self, embedding: Any) -> int:
        """The index of the most similar centroid by cosine (ties: the lower index)."""
        return int(self._order(self._vector(embedding))[0])

    def similar_users_scored(self, embedding: Any, n: int, *, exclude: str | Iterable[str] | None = None
                             ) -> list[tuple[str, float]]:
        """[(user, cosine similarity)] of `similar_users`."""
        if n < 0:
            raise ValueError(f"n must be >= 0, not {n}")
        excluded = {exclude} if isinstance(exclude, str) else set(exclude or ())
        vector = self._vector(embedding)
        unit = _unit_rows(vector)
        similarity = self._unit @ unit
        found: list[tuple[str, float]] = []
        for prototype in self._order(vector):
            if len(found) >= n:
                break
            rows = [i for i in np.flatnonzero(self.labels == prototype) if self.user_ids[i] not in excluded]
            rows.sort(key=lambda i: (-similarity[i], self.user_ids[i]))
            found.extend((self.user_ids[i], float(similarity[i])) for i in rows[:n - len(found)])
        return found

    def similar_users(self, embedding: Any, n: int, *, exclude: str | Iterable[str] | None = None) -> list[str]:
        """The n training users most like this embedding: the members of its nearest prototype by cosine
        similarity (ties by user id), then those of the next-nearest prototypes while fewer than n."""
        return [user for user, _ in self.similar_users_scored(embedding, n, exclude=exclude)]

    # -- serialisation ---------------------------------------------------------------------

    def to_dict(self, *, arrays: bool = True) -> dict[str, Any]:
        """A plain, JSON-ready dict; arrays=False leaves the centroids and embeddings out (see save)."""
        data: dict[str, Any] = {
            "format": PROTOTYPES_FORMAT, "version": 1, "k": self.k, "dim": self.dim, "seed": self.seed,
            "n_init": KMEANS_N_INIT, "k_from_variance": self.k_from_variance, "embedder": self.embedder,
            "source": self.source, "refinement": self.refinement, "has_refined": self.refined is not None,
            "users": [{"id": user, "prototype": int(label)}
                      for user, label in zip(self.user_ids, self.labels.tolist())],
            "signals": self.signals,
        }
        if arrays:
            data["centroids"] = self.centroids.tolist()
            data["embeddings"] = self.embeddings.tolist()
            if self.refined is not None:
                data["refined"] = self.refined.tolist()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, arrays: Mapping[str, np.ndarray] | None = None) -> Prototypes:
        if data.get("format") != PROTOTYPES_FORMAT:
            raise ValueError(f"not a prototypes file (format {data.get('format')!r})")
        source = arrays if arrays is not None else data
        if "centroids" not in source or "embeddings" not in source:
            raise ValueError("the centroids and embeddings are missing")
        users = data.get("users")
        if not isinstance(users, list) or not all(isinstance(u, Mapping) and "id" in u and "prototype" in u
                                                   for u in users):
            raise ValueError("\"users\" must be a list of {id, prototype}")
        signals = data.get("signals") or {}
        if not isinstance(signals, Mapping):
            raise ValueError("\"signals\" must be an object keyed by user id")
        return cls(user_ids=[u["id"] for u in users], labels=[u["prototype"] for u in users],
                   embeddings=np.asarray(source["embeddings"], dtype=np.float32).reshape(len(users), -1),
                   centroids=np.asarray(source["centroids"], dtype=np.float32),
                   seed=int(data.get("seed", 0)), k_from_variance=data.get("k_from_variance"),
                   embedder=data.get("embedder"), signals={str(k): dict(v) for k, v in signals.items()},
                   refined=(np.asarray(source["refined"], dtype=np.float32) if "refined" in source else None),
                   source=str(data.get("source") or "histories"), refinement=data.get("refinement"))

    def save(self, path: str | Path) -> Path:
        """Write `path` (JSON: users, prototypes, signals, settings) and `<stem>.npz` beside it (centroids
        and embeddings, float32). The JSON names the .npz and holds its sha256, so a mismatched pair of
        files is refused on load."""
        path = Path(path)
        npz = path.with_suffix(".npz")
        arrays = {"centroids": self.centroids, "embeddings": self.embeddings}
        if self.refined is not None:
            arrays["refined"] = self.refined
        np.savez(npz, **arrays)
        data = self.to_dict(arrays=False)
        data["arrays"] = {"file": npz.name, "sha256": hashlib.sha256(npz.read_bytes()).hexdigest()}
        path.write_text(json.dumps(data, ensure_ascii=False, allow_nan=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Prototypes:
        """Read a prototypes JSON (arrays inline, or in the .npz it names; UTF-8 with or without BOM, any
        line ending); ValueError (rows.RowError naming the field for a lone surrogate or NUL) or
        OSError when unusable."""
        from prblib.rows import check_text, load_json, read_text

        path = Path(path)
        data = load_json(read_text(path), file=path.name)
        check_text(data)
        if not isinstance(data, dict):
            raise ValueError("a prototypes file holds one JSON object")
        arrays = None
        if "arrays" in data:
            ref = data["arrays"]
            name = ref.get("file") if isinstance(ref, Mapping) else None
            if not isinstance(name, str) or Path(name).name != name or not name.endswith(".npz"):
                raise ValueError("\"arrays\" must name a .npz file in the same folder")
            blob = (path.parent / name).read_bytes()
            if ref.get("sha256") and hashlib.sha256(blob).hexdigest() != ref["sha256"]:
                raise ValueError(f"{name} does not match this prototypes file (sha256 differs)")
            with np.load(path.parent / name, allow_pickle=False) as npz:
                arrays = {key: npz[key] for key in ("centroids", "embeddings", "refined") if key in npz}
        return cls.from_dict(data, arrays=arrays)


def fit_prototypes(user_ids: Sequence[Any], embeddings: np.ndarray, *, k: int = DEFAULT_K, seed: int = 0,
                   k_from_variance: float | None = None) -> Prototypes:
    """K-means (scikit-learn, n_init=KMEANS_N_INIT, random_state=seed) over user embeddings.

    k is capped by the number of users and of distinct embeddings (K-means cannot make more
    clusters than points). With k_from_variance the k argument is ignored and k is the smallest
    number of principal components explaining that fraction of the variance (then capped the same way)."""
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(user_ids) or x.shape[0] == 0:
        raise ValueError(f"need one embedding row per user ({len(user_ids)} users), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("embeddings must be finite")
    if k_from_variance is not None:
        k = k_for_variance(x, k_from_variance)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, not {k!r}")
    k = min(k, x.shape[0], len(np.unique(x, axis=0)))
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=k, n_init=KMEANS_N_INIT, random_state=seed).fit(x)
    return Prototypes(user_ids=list(user_ids), embeddings=x, labels=kmeans.labels_, centroids=kmeans.cluster_centers_,
                      seed=seed, k_from_variance=k_from_variance)


def _unique(values: Iterable[Any], key: Callable[[Any], Any]) -> list[Any]:
    seen, kept = set(), []
    for value in values:
        if key(value) not in seen:
            seen.add(key(value))
            kept.append(value)
    return kept


def build_prototypes(users: Mapping[Any, Mapping[str, Any]], *, embed: Embed, k: int = DEFAULT_K, seed: int = 0,
                     k_from_variance: float | None = None, profile_k: int = DEFAULT_PROFILE_K,
                     embedder: dict[str, Any] | None = None,
                     personas: Mapping[Any, Sequence[str]] | None = None) -> Prototypes:
    """Prototypes for training users given as {user_id: {"profile": [post text, ...], "history": [...]}}.

    Repeated posts and repeated (prompt, chosen, rejected) history entries are kept once. Without
    `personas` each user is embedded from their signals (`user_embedding`, signals as a chain shows
    them); with `personas` ({user_id: [persona text, ...]}, from `infer_personas`, as the paper) from
    the L2-normalised mean of their personas' embeddings, and a user without a persona is left out.
    Users without any signal are left out; each kept user's deduplicated signals are stored for
    neighbour chains. ValueError when no user is left or k < 1."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, not {k!r}")
    ids, vectors, signals = [], [], {}
    for user, raw in users.items():
        profile = _unique((str(p) for p in raw.get("profile") or ()), key=lambda text: text.strip())
        history = _unique(({key: item.get(key) for key in ("prompt", "chosen", "rejected")}
                           for item in raw.get("history") or () if isinstance(item, Mapping)),
                          key=lambda item: tuple(str(v).strip() for v in item.values()))
        shown = user_signals(profile, history, k=profile_k, owner=f"user {user}")
        if shown.empty:
            continue
        if personas is not None:
            texts = [t for t in personas.get(user, personas.get(str(user), ())) if str(t).strip()]
            if not texts:
                continue
            vector = _unit_rows(_unit_rows(np.asarray(embed(list(texts)), dtype=np.float64)).mean(axis=0))
        else:
            vector = user_embedding(embed, shown)
        ids.append(str(user))
        vectors.append(np.asarray(vector, dtype=np.float32))
        signals[str(user)] = {"profile": profile, "history": history}
    if not ids:
        raise ValueError("no user has any preference signal" if personas is None else
                         "no user has both preference signals and an inferred persona")
    prototypes = fit_prototypes(ids, np.stack(vectors), k=k, seed=seed, k_from_variance=k_from_variance)
    prototypes.signals = signals
    prototypes.embedder = embedder
    prototypes.source = "histories" if personas is None else "personas"
    return prototypes


def embedder_meta(retriever: Any) -> dict[str, Any]:
    """What `PGenRM.load` needs to rebuild the embedder of a DenseRetriever (store it in Prototypes.embedder)."""
    return {"name": retriever.name, "path": str(retriever.folder), "fingerprint": retriever.fingerprint,
            "dim": int(retriever.dim), "pooling": retriever.pooling}


# --------------------------------------------------------------------------------------------
# The reward model


def _pair_parity(pair_id: str) -> int:
    return hashlib.sha256(pair_id.encode("utf-8")).digest()[0] % 2


def shared_position(pair_id: str, seed: int) -> str:
    """The published format's one random order per pair: a bit of sha256(seed, pair id)."""
    return "A" if hashlib.sha256(f"{seed}:{pair_id}".encode("utf-8")).digest()[0] % 2 == 0 else "B"


def chosen_position(pair_id: str, index: int) -> str:
    """Where chain (or neighbour) `index` of a pair shows the chosen answer."""
    return "A" if (_pair_parity(pair_id) + index) % 2 == 0 else "B"


class PGenRM(GenerativeRewardModel):
    kind = "pgenrm"
    unit = "chain"  # usage() counts chains, chain_prompt_tokens, chain_completion_tokens

    def __init__(self, backend: Any, *, m: int = DEFAULT_M, n: int = DEFAULT_N,
                 temperature: float = DEFAULT_TEMPERATURE, max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0,
                 prototypes: Prototypes | None = None, embed: Embed | None = None,
                 profile_k: int = DEFAULT_PROFILE_K, embedder_close: Callable[[], None] | None = None,
                 chain_format: str = "native", template: published.Template | None = None,
                 include_self_neighbours: bool = False):
        if chain_format not in CHAIN_FORMATS:
            raise ModelError(f"chain_format must be one of {', '.join(CHAIN_FORMATS)}, not {chain_format!r}")
        if n > 0 and (prototypes is None or embed is None):
            raise ModelError("n > 0 needs user prototypes (option prototypes) and an embedder")
        if temperature <= 0 and m > 1:
            raise ModelError("m > 1 sampled chains need a temperature above 0")
        super().__init__(backend, temperature=temperature, max_tokens=max_tokens, seed=int(seed), profile_k=profile_k)
        self.m, self.n = m, n
        self.prototypes = prototypes
        self.chain_format = chain_format
        self.template = template or published.Template()
        self.include_self_neighbours = include_self_neighbours
        self._embed = embed
        self._embedder_close = embedder_close
        self._embed_lock = threading.Lock()  # a DenseRetriever is not thread-safe
        self._neighbour_signals: dict[str, Signals] = {}
        self._users_by_signals: dict[Signals, list[str]] = {}
        if prototypes is not None and n > 0:
            missing = [u for u in prototypes.user_ids if u not in prototypes.signals]
            if missing:
                raise ModelError(f"the prototypes file has no preference signals for {len(missing)} user(s) "
                                 f"(e.g. {missing[0]!r}), so their chains cannot be built")
            for user in prototypes.user_ids:
                raw = prototypes.signals[user]
                shown = user_signals([str(p) for p in raw.get("profile") or ()], raw.get("history") or (),
                                     k=profile_k, owner=f"prototypes user {user}")
                self._neighbour_signals[user] = shown
                self._users_by_signals.setdefault(shown, []).append(user)

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def load(cls, spec: ModelSpec) -> PGenRM:
        o = parse_options("pgenrm", spec.options)
        resolved = o.resolved()
        m, n, temperature = resolved["m"], resolved["n"], resolved["temperature"]
        if temperature == 0 and m > 1:
            raise ModelError("option temperature must be above 0 when m > 1: the m chains are samples")
        prototypes = None
        if o.prototypes:
            prototypes = _load_prototypes(_data_file(o.prototypes, spec.runtime.get("data_root")),
                                          stage=o.prototype_stage)
        elif n > 0:
            raise ModelError("option n > 0 needs option prototypes (a prototypes file with each user's signals)")
        template = None
        if spec.runtime.get("pgenrm_template"):
            if o.chain_format != "published":
                raise ModelError("a template file applies to chain_format published only")
            template = _load_template(_data_file(spec.runtime["pgenrm_template"], spec.runtime.get("data_root"),
                                                 "template file"))
        embed = close_embedder = None
        if n > 0:
            retriever = _build_embedder(prototypes, device=spec.device, cache_dir=spec.runtime.get("cache_dir"))
            embed, close_embedder = retriever.embed, retriever.close
        return cls(cls.backend_for(spec), m=m, n=n, temperature=float(temperature), max_tokens=resolved["max_tokens"],
                   seed=o.seed, prototypes=prototypes, embed=embed, profile_k=spec.profile_k,
                   embedder_close=close_embedder, chain_format=o.chain_format, template=template,
                   include_self_neighbours=o.include_self_neighbours)

    # -- prompts -----------------------------------------------------------------------------

    def signals(self, pair: PairInput, setting: str) -> Signals:
        """What the pair's own chains show of the user under this setting."""
        if setting == "no_profile":
            return Signals()
        if setting == "plan":
            return Signals(plan=tuple(pair.plan))
        return user_signals(pair.profile, getattr(pair, "history", ()), k=self.profile_k, owner=f"pair {pair.id}")

    def messages(self, signals: Signals, pair: PairInput, position: str) -> list[dict[str, str]]:
        first, second = (pair.chosen, pair.rejected) if position == "A" else (pair.rejected, pair.chosen)
        if self.chain_format == "published":
            return self.template.messages(published_history(signals), pair.question, first, second)
        return chain_messages(signals, pair.question, first, second)

    def position(self, pair_id: str, index: int) -> str:
        """Where chain (or neighbour) `index` shows the chosen answer: alternating (native), or one shared
        seeded random order for every chain and neighbour of the pair (published, as the release)."""
        if self.chain_format == "published":
            return shared_position(pair_id, self.seed)
        return chosen_position(pair_id, index)

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """Both answers are shown at once, so this is the exact prompt (chat messages as text) of the
        first chain with the chosen answer as A, and with it as B."""
        check_setting(setting, pair)
        signals = self.signals(pair, setting)
        return (messages_as_text(self.messages(signals, pair, "A")),
                messages_as_text(self.messages(signals, pair, "B")))

    # -- scoring -----------------------------------------------------------------------------

    def check_pair(self, pair: PairInput, setting: str) -> None:
        """The setting's needs, and the pair's own signals (a malformed history is refused before any request)."""
        check_setting(setting, pair)
        self.signals(pair, setting)

    def _chain(self, signals: Signals, pair: PairInput, index: int) -> dict[str, Any]:
        position = self.position(pair.id, index)
        seed = self.seed + index
        record: dict[str, Any] = {"chosen_position": position, "seed": seed}
        try:  # a chain cut at the token cap or refused is retried once (llm.ask), then a failed chain
            raw = self.call(self.messages(signals, pair, position), seed=seed, what="evaluation chain")
        except AnswerError as exc:
            if exc.reason not in UNUSABLE:
                raise
            record.update(chosen_total=None, rejected_total=None, failure=exc.reason, failure_detail=str(exc),
                          totals_mismatch=False, criteria=[], raw=exc.text[:RAW_CHARS])
            return record
        parsed = parse_published_chain(raw) if self.chain_format == "published" else parse_chain(raw)
        if isinstance(parsed, ParseFailure):
            record.update(chosen_total=None, rejected_total=None, failure=parsed.reason,
                          failure_detail=parsed.detail, totals_mismatch=False, criteria=[], raw=raw[:RAW_CHARS])
            return record
        rejected_position = "B" if position == "A" else "A"
        record.update(chosen_total=parsed.totals[position], rejected_total=parsed.totals[rejected_position],
                      failure=None, failure_detail=None, totals_mismatch=parsed.totals_mismatch,
                      criteria=[{"name": name, "weight": weight} for name, weight in parsed.criteria])
        if parsed.totals_mismatch:
            record["stated_totals"] = {"chosen": parsed.stated_totals[position],
                                       "rejected": parsed.stated_totals[rejected_position]}
        return record

    def infer_personas(self, rows: Sequence[tuple[str, PairInput]],
                       progress: ProgressFn | None = None) -> tuple[dict[str, list[str]], dict[str, int]]:
        """Personas as the paper builds prototypes from them: one chain (seed, first order) per
        (user, pair), where each pair is one of the user's train/val rows with the user's OTHER rows as
        its history (leave-one-out; the caller builds it). The persona is the chain's "persona" (native)
        or its analysis part (published). Returns ({user: [persona, ...]}, {"chains", "failed"}):
        a failed chain gives no persona."""
        def run(entry: tuple[str, PairInput]) -> tuple[str, str | None]:
            user, pair = entry
            signals = self.signals(pair, "profile")
            try:  # truncated or refused twice (llm.ask): no persona from this row
                reply = ask(self.backend, self.messages(signals, pair, self.position(pair.id, 0)),
                            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed, n=1,
                            what="persona chain")
            except AnswerError as exc:
                if exc.reason not in UNUSABLE:
                    raise
                return user, None
            text = reply[0].text
            parsed = parse_published_chain(text) if self.chain_format == "published" else parse_chain(text)
            return user, (None if isinstance(parsed, ParseFailure) or not parsed.persona.strip() else parsed.persona)

        personas: dict[str, list[str]] = {}
        failed = 0
        for user, persona in run_unordered(self.backend, run, list(rows)):
            if progress is not None:
                progress(1)
            if persona is None:
                failed += 1
            else:
                personas.setdefault(user, []).append(persona)
        return {user: personas[user] for user in sorted(personas)}, {"chains": len(rows), "failed": failed}

    def neighbours_for(self, pair: PairInput, setting: str,
                       signals: Signals) -> tuple[list[tuple[str, float]], str | None]:
        """([(user, similarity)], reason why there are none or None)."""
        if self.n == 0:
            return [], None
        if setting != "profile":
            return [], f"setting {setting} shows no preference signals to find similar users by"
        if signals.empty:
            return [], "this user has no preference signals"
        with self._embed_lock:
            vector = user_embedding(self._embed, signals)
        exclude: set[str] = set()
        if not self.include_self_neighbours:  # the query user is never their own neighbour
            exclude.update(self._users_by_signals.get(signals, []))
            if pair.user_id:
                exclude.add(str(pair.user_id))
        return self.prototypes.similar_users_scored(vector, self.n, exclude=exclude), None

    def judge_pair(self, pair: PairInput, setting: str) -> PairResult:
        signals = self.signals(pair, setting)
        chains = [self._chain(signals, pair, i) for i in range(self.m)]
        similar, skipped = self.neighbours_for(pair, setting, signals)
        neighbours = []
        for j, (user, similarity) in enumerate(similar):
            record = self._chain(self._neighbour_signals[user], pair, j)
            neighbours.append({"user": user, "similarity": similarity, **record})
        details = {"m": self.m, "n": self.n, "chain_format": self.chain_format,
                   "first_shown": "chosen" if self.position(pair.id, 0) == "A" else "rejected",
                   "chains": chains, "neighbours": neighbours,
                   "neighbours_skipped": skipped,
                   "parse_failures": sum(1 for c in chains + neighbours if c["failure"] is not None)}
        chosen, rejected = pair_scores(details)
        return PairResult(pair.id, chosen, rejected, details)

    # -- clean-up (usage() is GenerativeRewardModel's: backends' bill plus chains and their tokens)

    def close(self) -> None:
        super().close()
        if self._embedder_close is not None:
            self._embedder_close()
            self._embedder_close = None


def _data_file(name: str, data_root: str | None, what: str = "prototypes file") -> str:
    """`name` resolved inside the data folder (links included); without a data root (library
    use, no platform) the name is used as given."""
    if not data_root:
        return name
    root = Path(data_root).resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ModelError(f"{what} {name!r} is outside the data folder")
    return str(path)


def _load_template(path: str) -> published.Template:
    try:
        return published.Template.from_file(path)
    except FileNotFoundError:
        raise ModelError(f"template file {path} does not exist") from None
    except OSError as exc:
        raise ModelError(f"cannot read template file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ModelError(f"template file {Path(path).name} is not usable: {exc}") from None


def _load_prototypes(path: str, *, stage: str | None = None) -> Prototypes:
    try:
        return Prototypes.load(path).at_stage(stage)
    except FileNotFoundError as exc:
        raise ModelError(f"prototypes file {exc.filename} does not exist") from None
    except OSError as exc:
        raise ModelError(f"cannot read prototypes file {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ModelError(f"prototypes file {Path(path).name} is not usable: {exc}") from None


def _build_embedder(prototypes: Prototypes, *, device: str, cache_dir: Any) -> Any:
    """The DenseRetriever that embedded the training users (Prototypes.embedder; the bundled
    all-MiniLM-L6-v2 when it names none), checked against the prototypes' dimension and, when
    recorded, the weights' fingerprint: users embedded by another model would be compared with
    vectors from a different space."""
    from prblib.construction.retrieval import MINILM, DenseRetriever

    meta = prototypes.embedder or {}
    kwargs: dict[str, Any] = {"device": device, "pooling": meta.get("pooling")}
    if cache_dir:
        kwargs["cache_dir"] = Path(cache_dir) / "embeddings"
    name = meta.get("name")
    where = meta.get("path") or name
    if not where or name == MINILM:
        retriever = DenseRetriever.default(**kwargs)
    else:
        retriever = DenseRetriever.from_name(where, **kwargs)
    if retriever.dim != prototypes.dim:
        raise ModelError(f"the user embedder gives {retriever.dim}-dimensional vectors but the prototypes are "
                         f"{prototypes.dim}-dimensional: they were built with another model")
    if meta.get("fingerprint") and meta["fingerprint"] != retriever.fingerprint:
        raise ModelError(f"the user embedder {name or where} is not the model the prototypes were built with "
                         "(its weights differ)")
    return retriever
