"""Generative judges: an LLM asked, in words, which answer fits the person (pairwise) or how
well one answer fits them (pointwise).

Both see `render_context(...)` (the question, with the profile posts or the planner's aspects
per setting) and never the narrative or rubric: PairInput has no field for them.

Options (ModelSpec.options; the schemas are `options.PairwiseOptions` / `PointwiseOptions`):
    temperature  0 (default: deterministic judging)
    max_tokens   512: room for brief reasoning before the final line
    seed         0: sent to the endpoint / seeds local sampling; null for none
    both_orders  pairwise only, default true: judge each pair twice, chosen shown as A, then as B
The backend (a staff-configured endpoint, or the local folder `spec.path`) comes from
`ModelSpec.runtime` (see `llm.build_backend`), never from the options.

Pairwise scoring. Each order gives a verdict "A", "B" or None (parse failure). Per pair:
chosen_score = orders in which the chosen answer was picked, rejected_score = the other orders
(rejected picked, or no usable verdict). So a pair is correct only when chosen wins a strict
majority of orders; a 1-1 split is a tie (wrong when ties count wrong, half under
ties-as-half, which then equals the mean accuracy over orders). A parse failure is never
turned into a default answer. With both_orders false the single order shows chosen as A or B
according to a hash of the pair id, so a judge's position preference does not move accuracy
systematically. Report-level order numbers: `metrics.judge_order_stats`.

Protocol release (options.protocol "release"; prblib.rewards.protocols has the rules, docs/protocols.md
the sources): what the authors' released pairwise script computes. One order per pair, drawn per
domain from a Python RNG seeded 42 in the benchmark's row order (PairInput.row_in_domain); the
prompt holds only the question and the two responses (RELEASE_TEMPLATE, our own words, the
release's reply structure: a "**Reasoning:**" line, then a "**Result:**" line naming A or B); the
reply is read with the release's rule (`protocols.parse_release_verdict`) and an unparsed reply
counts as "A" (details: verdict None, counted_as "A"), so a pair scores 1-0 or 0-1 and stays in
the denominator. A reply still cut or refused after `llm.ask`'s retry, or one the client found
unusable (generative.UNUSABLE), is read with the same rule (the release reads whatever text came
back), its reason kept in details["failures"]. The client keeps a reasoning block apart from the
answer, so the answer read is what follows it, as the release reads the text after `</think>`.

Pointwise scoring. Each response is rated alone on this 1-10 scale (stated in the prompt):
    1-2   does not answer the question, or is wrong or harmful
    3-4   answers only generically, missing what matters to this person
    5-6   a reasonable answer with some attention to the person, but misses important needs
    7-8   a good answer clearly shaped for this person, with minor gaps
    9-10  an excellent answer that fully serves this person's needs and preferences
The rating is read from "Score: N" lines (integer or decimal, 1 <= N <= 10). One rule for both
judges: the LAST well-formed score (or verdict) line counts, so a judge that writes "Score: 6",
reasons further and ends with "Final score: 9" is read as 9; malformed or out-of-range lines are
passed over. A parse failure is only an output with no well-formed line at all: that score is
None and the pair is wrong.

Token cost. Both judges share `generative.GenerativeRewardModel` with P-GenRM: `usage()` gives
the backend's requests, tokens and cost, cache hits and misses, and `judgments` (verdicts asked
for) with their prompt and completion tokens; an evaluation run stores it in its metrics.

Truncated and refused verdicts. Every verdict goes through `llm.ask`: one cut at the token cap
is asked again with twice the budget, a refusal once more with the next seed. A verdict still
truncated or refused counts as a parse failure (None, never a guess) and its reason is kept:
details["failures"] = {"truncated": n, "refused": n} (only reasons that occurred); so does an
answer the client's normaliser found unusable (generative.UNUSABLE: "no_answer" when only
reasoning came back, "filtered", "unfinished"). The reasoning an endpoint sends apart from the
answer (reasoning models) is shown as details "reasoning" (per order; per response pointwise)
and is never parsed: the verdict is read from the final answer alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from prblib.rewards.base import ModelSpec, PairInput, PairResult, ProgressFn, check_setting
from prblib.errors import ModelError
from prblib.llm.answers import AnswerError
from prblib.context import render_context
from prblib.rewards.generative import UNUSABLE, GenerativeRewardModel
from prblib.llm.client import messages_as_text
from prblib.rewards.options import parse_options, release_setting_refusal
from prblib.prompts import TextTemplate
from prblib.rewards.protocols import RELEASE_FALLBACK, parse_release_verdict, release_position
from prblib.rewards import reasoning

RAW_CHARS = 500  # how much of each raw judge output is kept in a result's details

# --------------------------------------------------------------------------------------------
# Prompts

CONTEXT_HEADING = "The question, and what is known about the person who asked it:"

PAIRWISE_SYSTEM = (
    "You compare two answers written for one particular person and decide which of them would "
    "serve that person better. Weigh above all how well each answer fits this person: their "
    "situation, interests, needs and preferences, as far as the material shows them. General "
    "quality (correctness, relevance, helpfulness) matters too, but second. The order in which "
    "the answers appear and their length are not reasons to prefer one."
)

PAIRWISE_INSTRUCTION = (
    "Which answer better answers this person's question, for them in particular? You may reason "
    "briefly first. Then finish your reply with a last line that is exactly \"Verdict: A\" or "
    "\"Verdict: B\"."
)

POINTWISE_SYSTEM = (
    "You rate how well one answer serves one particular person. Weigh above all how well it fits "
    "this person: their situation, interests, needs and preferences, as far as the material shows "
    "them. General quality (correctness, relevance, helpfulness) matters too, but second."
)

POINTWISE_INSTRUCTION = (
    "Rate how well this answer serves this person, on a scale from 1 to 10:\n"
    "1-2: it does not answer the question, or it is wrong or harmful.\n"
    "3-4: it answers only generically and misses what matters to this person.\n"
    "5-6: a reasonable answer with some attention to the person, but it misses important needs.\n"
    "7-8: a good answer clearly shaped for this person, with minor gaps.\n"
    "9-10: an excellent answer that fully serves this person's needs and preferences.\n"
    "You may reason briefly first. Then finish your reply with a last line of the form "
    "\"Score: N\", where N is a number from 1 to 10."
)


# Protocol release: the release's prompt holds the question and the two responses only, and asks for a
# two-line reply (reasoning, then the result letter). The words here are ours.
RELEASE_SYSTEM = (
    "You act as an impartial judge. You are given a person's question and two candidate answers, Response A "
    "and Response B, and you decide which of the two better meets what the person is looking for.\n\n"
    "Principles for your decision:\n"
    "1. A good answer gives what the question calls for: it leaves out nothing the question needs and adds "
    "nothing it did not ask for.\n"
    "2. Stay objective. Either response is as likely as the other to be the better one, so the order in which "
    "they are shown is no reason to prefer one. Length is no reason either: a longer answer is better only "
    "when the question needs what the extra length holds.\n\n"
    "Reply in exactly two lines, in this form:\n"
    "**Reasoning:** <your assessment of the two responses, at most 100 words>\n"
    "**Result:** <A or B>"
)
RELEASE_QUESTION_LABEL = "The person's question"
RELEASE_RESPONSE_LABELS = ("Response A", "Response B")

# Bump a version whenever any of its texts changes (tests pin each version's text).
PAIRWISE_TEMPLATE = TextTemplate("pairwise-judge", 1, (PAIRWISE_SYSTEM, CONTEXT_HEADING, PAIRWISE_INSTRUCTION))
POINTWISE_TEMPLATE = TextTemplate("pointwise-judge", 1, (POINTWISE_SYSTEM, CONTEXT_HEADING, POINTWISE_INSTRUCTION))
RELEASE_TEMPLATE = TextTemplate("pairwise-judge-release", 1,
                                (RELEASE_SYSTEM, RELEASE_QUESTION_LABEL, *RELEASE_RESPONSE_LABELS))


def pairwise_prompts(options: dict[str, Any], *, template_file: str | None = None) -> dict[str, str]:
    """The pairwise kind's prompts (registry `prompts`): {"judge": "name@vN"}, the release's
    layout under protocol "release"."""
    if options.get("protocol") == "release":
        return {"judge": RELEASE_TEMPLATE.key}
    reasoned = reasoning.prompt_key(options.get("prompt_format") or "prbench",
                                    prompt_template=options.get("prompt_template"))
    return {"judge": reasoned or PAIRWISE_TEMPLATE.key}


def pointwise_prompts(options: dict[str, Any], *, template_file: str | None = None) -> dict[str, str]:
    """The pointwise kind's prompts (registry `prompts`): {"judge": "name@vN"} of its prompt format."""
    reasoned = reasoning.prompt_key(options.get("prompt_format") or "prbench", pointwise=True,
                                    prompt_template=options.get("prompt_template"))
    return {"judge": reasoned or POINTWISE_TEMPLATE.key}


def _block(label: str, text: str) -> str:
    return f"=== {label} ===\n{text.strip()}\n=== End of {label.lower()} ==="


# --------------------------------------------------------------------------------------------
# Parsing

_DECORATION = re.compile(r"[*_`#>]+")  # markdown bold/italics, code, headings, quotes
_OPEN = r"""[\[\(\{"'\u201c\u2018]*"""
_CLOSE = r"""[\]\)\}"'\u201d\u2019]*"""
_VERDICT_LABEL = re.compile(r"^\s*(?:(?:final|my|overall)\s+)?verdict\s*(?:(?::|=|-|\u2013|\u2014|\bis\b)\s*(.*))?$",
                            re.IGNORECASE)
_LETTER = re.compile(rf"^{_OPEN}\s*(?:(?:answer|response|option)\s+)?{_OPEN}\s*([ab])\s*{_CLOSE}\s*[.!]?\s*$",
                     re.IGNORECASE)
_SCORE_LABEL = re.compile(r"^\s*(?:(?:final|overall|my)\s+)?(?:score|rating)\s*(?:(?::|=|\bis\b)\s*(.*))?$",
                          re.IGNORECASE)
_NUMBER = re.compile(rf"^{_OPEN}\s*(\d+(?:\.\d+)?)\s*(?:/\s*10|out\s+of\s+10)?\s*{_CLOSE}\s*[.!]?\s*$",
                     re.IGNORECASE)


def _labelled_values(text: str, label: re.Pattern) -> list[str]:
    """The values of every `label: value` line (a value on the next line when the label stands alone)."""
    lines = [_DECORATION.sub("", line).strip() for line in text.splitlines()]
    values = []
    for i, line in enumerate(lines):
        match = label.match(line)
        if not match:
            continue
        value = (match.group(1) or "").strip()
        if not value:
            value = next((following for following in lines[i + 1:] if following), "")
        values.append(value)
    return values


def _last(values: list[Any]) -> Any:
    """The last well-formed value (a judge may revise itself; its final word counts); None when none is."""
    return next((v for v in reversed(values) if v is not None), None)


def parse_verdict(text: str) -> str | None:
    """"A", "B", or None when the output names no single answer.

    Accepted: "Verdict: A" lines (any case, markdown emphasis, brackets or quotes around the
    letter, "Answer B", a value on the line after a bare "Verdict:"); with several, the last
    well-formed one counts (a revised verdict); with no verdict line at all, an output that is
    just the letter. An output with no well-formed verdict (both, neither, a tie, "A or B",
    prose) is None, never a guess.
    """
    values = _labelled_values(text or "", _VERDICT_LABEL)
    if not values:
        values = [_DECORATION.sub("", text or "").strip()]
    letters = []
    for value in values:
        match = _LETTER.match(value)
        letters.append(match.group(1).upper() if match else None)
    return _last(letters)


def parse_score(text: str, *, low: float = 1.0, high: float = 10.0) -> float | None:
    """The rating from the last well-formed "Score: N" line (N in [low, high]; a revised score
    counts), or from an output that is just the number; None when there is no such line."""
    values = _labelled_values(text or "", _SCORE_LABEL)
    if not values:
        values = [_DECORATION.sub("", text or "").strip()]
    numbers = []
    for value in values:
        match = _NUMBER.match(value)
        number = float(match.group(1)) if match else None
        numbers.append(number if number is not None and low <= number <= high else None)
    return _last(numbers)


# --------------------------------------------------------------------------------------------
# Judges


class _Judge(GenerativeRewardModel):
    """The two judges: one LLM verdict per call (`usage()` counts `judgments` and their tokens)."""

    unit = "judgment"

    @classmethod
    def load(cls, spec: ModelSpec) -> "_Judge":
        judge_kwargs = parse_options(cls.kind, spec.options).model_dump()
        judge_kwargs.pop("model_preset", None)  # recorded with the result; what it set is in the options
        name = judge_kwargs.pop("prompt_template", None)
        template = None
        if name:  # an operator's template file under the data folder (prblib.rewards.reasoning)
            try:
                template = reasoning.OperatorTemplate(
                    reasoning.resolve_data_file(name, spec.runtime.get("data_root")), cls.template_variables)
            except FileNotFoundError:
                raise ModelError(f"template file {name} does not exist in the data folder") from None
            except OSError as exc:
                raise ModelError(f"cannot read template file {name}: {exc.strerror or exc}") from None
            except ValueError as exc:
                raise ModelError(f"template file {name} is not usable: {exc}") from None
        return cls(cls.backend_for(spec), profile_k=spec.profile_k, template=template, **judge_kwargs)

    def _reasoning_init(self, prompt_format: str, answer_parser: str | None, template: Any) -> None:
        self.prompt_format, self.template = prompt_format, template
        self.answer_parser = answer_parser or reasoning.FORMAT_PARSER.get(prompt_format)

    def context(self, pair: PairInput, setting: str) -> str:
        return render_context(pair.question, setting=setting, profile=pair.profile, plan=pair.plan,
                              profile_k=self.profile_k)

    def ask(self, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        """(the verdict's text, None), or (the unusable text, a reason in UNUSABLE) when
        `llm.ask` could not get a complete answer (the caller must not parse that text); request
        failures (endpoint down) raise as before."""
        text, failure, _ = self.ask_answer(messages)
        return text, failure

    def ask_answer(self, messages: list[dict[str, str]]) -> tuple[str, str | None, str]:
        """As `ask`, with the reasoning the endpoint sent apart from the answer ("" when none):
        shown in the details as "reasoning", never parsed."""
        try:
            answer = self.call_answer(messages, seed=self.seed, what="judge verdict")
            return answer.text, None, answer.reasoning
        except AnswerError as exc:
            if exc.reason in UNUSABLE:
                return exc.text, exc.reason, exc.reasoning
            raise


def _failure_counts(reasons: Any) -> dict[str, Any]:
    """{"failures": {reason: count}} for the reasons that occurred; {} when none did."""
    counts: dict[str, int] = {}
    for reason in reasons:
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return {"failures": counts} if counts else {}


class PairwiseJudge(_Judge):
    kind = "pairwise"
    template_variables = reasoning.PAIRWISE_VARIABLES  # what an operator's template may use

    def __init__(self, backend: Any, *, both_orders: bool = True, protocol: str = "prbench",
                 prompt_format: str = "prbench", answer_parser: str | None = None, template: Any = None,
                 **kwargs: Any):
        super().__init__(backend, **kwargs)
        self._reasoning_init(prompt_format, answer_parser, template)
        self.protocol = protocol
        self.both_orders = both_orders and protocol != "release"
        self._call_rows: dict[str, int] = {}  # release, pairs without row_in_domain: row by call order

    def check_pair(self, pair: PairInput, setting: str) -> None:
        super().check_pair(pair, setting)
        refusal = release_setting_refusal(self.protocol, setting)
        if refusal:
            raise ModelError(refusal)

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """As every judge; under protocol release a pair that carries no row_in_domain (a caller
        outside the benchmark evaluation) takes its row from the order of `pairs` within its domain."""
        pairs = list(pairs)
        if self.protocol == "release":
            counts: dict[str, int] = {}
            rows = {}
            for pair in pairs:
                if pair.row_in_domain is None:
                    rows[pair.id] = counts.get(pair.domain, 0)
                    counts[pair.domain] = rows[pair.id] + 1
            self._call_rows = rows
        return super().score_pairs(pairs, setting=setting, progress=progress)

    def positions(self, pair: PairInput) -> list[str]:
        """Where the chosen answer is shown, per order."""
        if self.protocol == "release":
            row = pair.row_in_domain if pair.row_in_domain is not None else self._call_rows.get(pair.id)
            if row is None:
                raise ModelError(f"protocol 'release' orders a pair by its row within its domain, and pair "
                                 f"{pair.id!r} has none")
            return [release_position(row)]
        if self.both_orders:
            return ["A", "B"]
        return ["A" if hashlib.sha256(pair.id.encode("utf-8")).digest()[0] % 2 == 0 else "B"]

    def messages(self, pair: PairInput, setting: str, chosen_position: str) -> list[dict[str, str]]:
        first, second = (pair.chosen, pair.rejected) if chosen_position == "A" else (pair.rejected, pair.chosen)
        if self.protocol == "release":
            user = "\n\n".join([_block(RELEASE_QUESTION_LABEL, pair.question),
                                _block(RELEASE_RESPONSE_LABELS[0], first), _block(RELEASE_RESPONSE_LABELS[1], second)])
            return [{"role": "system", "content": RELEASE_SYSTEM}, {"role": "user", "content": user}]
        if self.prompt_format != "prbench" or self.template is not None:
            return reasoning.pairwise_messages(self.prompt_format, context=self.context(pair, setting),
                                               question=pair.question, first=first, second=second,
                                               template=self.template)
        user = "\n\n".join([CONTEXT_HEADING, self.context(pair, setting), _block("Answer A", first),
                            _block("Answer B", second), PAIRWISE_INSTRUCTION])
        return [{"role": "system", "content": PAIRWISE_SYSTEM}, {"role": "user", "content": user}]

    def judge_pair(self, pair: PairInput, setting: str) -> PairResult:
        if self.protocol == "release":
            return self._judge_as_released(pair, setting)
        orders = []
        for position in self.positions(pair):
            raw, failure, reasoning = self.ask_answer(self.messages(pair, setting, position))
            order = {"chosen_position": position, "verdict": None if failure else self.read_verdict(raw),
                     "raw": raw[:RAW_CHARS]}
            if reasoning:
                order["reasoning"] = reasoning[:RAW_CHARS]
            if failure:
                order["failure"] = failure
            orders.append(order)
        picked = sum(1 for o in orders if o["verdict"] == o["chosen_position"])
        failures = sum(1 for o in orders if o["verdict"] is None)
        return PairResult(pair.id, float(picked), float(len(orders) - picked),
                          {"orders": orders, "parse_failures": failures,
                           **_failure_counts(o.get("failure") for o in orders)})

    def read_verdict(self, text: str) -> str | None:
        """The verdict by the answer parser (`answer_parser`; our "Verdict:" line by default)."""
        parser = reasoning.PAIRWISE_PARSER_FUNCTIONS.get(self.answer_parser or "", parse_verdict)
        return parser(text)

    def _judge_as_released(self, pair: PairInput, setting: str) -> PairResult:
        """One order; the release's reading of the reply; an unparsed reply counted as "A"."""
        [position] = self.positions(pair)
        raw, failure, reasoning = self.ask_answer(self.messages(pair, setting, position))
        verdict = parse_release_verdict(raw)
        counted = verdict if verdict is not None else RELEASE_FALLBACK
        order = {"chosen_position": position, "verdict": verdict, "counted_as": counted, "raw": raw[:RAW_CHARS]}
        if reasoning:
            order["reasoning"] = reasoning[:RAW_CHARS]
        if failure:
            order["failure"] = failure
        picked = counted == position
        return PairResult(pair.id, float(picked), float(not picked),
                          {"orders": [order], "parse_failures": int(verdict is None), "protocol": "release",
                           **_failure_counts([failure])})

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """A judge sees both answers at once, so this is not (chosen text, rejected text) but the
        exact prompt of order 1 and of order 2 (chat messages rendered as text by
        `llm.messages_as_text`); the second is "" when only one order is judged."""
        self.check_pair(pair, setting)
        texts = [messages_as_text(self.messages(pair, setting, p)) for p in self.positions(pair)]
        return texts[0], (texts[1] if len(texts) > 1 else "")


class PointwiseJudge(_Judge):
    kind = "pointwise"
    template_variables = reasoning.POINTWISE_VARIABLES

    def __init__(self, backend: Any, *, prompt_format: str = "prbench", answer_parser: str | None = None,
                 template: Any = None, **kwargs: Any):
        super().__init__(backend, **kwargs)
        self._reasoning_init(prompt_format, answer_parser, template)
        self.answer_parser = answer_parser or reasoning.POINTWISE_FORMAT_PARSER.get(prompt_format)

    def read_score(self, text: str) -> float | None:
        """The rating by the answer parser (`answer_parser`; our "Score:" line by default)."""
        parser = reasoning.POINTWISE_PARSER_FUNCTIONS.get(self.answer_parser or "", parse_score)
        return parser(text)

    def messages(self, pair: PairInput, setting: str, response: str) -> list[dict[str, str]]:
        if self.prompt_format != "prbench" or self.template is not None:
            return reasoning.pointwise_messages(self.prompt_format, context=self.context(pair, setting),
                                                question=pair.question, response=response, template=self.template)
        user = "\n\n".join([CONTEXT_HEADING, self.context(pair, setting), _block("Answer", response),
                            POINTWISE_INSTRUCTION])
        return [{"role": "system", "content": POINTWISE_SYSTEM}, {"role": "user", "content": user}]

    def judge_pair(self, pair: PairInput, setting: str) -> PairResult:
        raw_chosen, failed_chosen, thought_chosen = self.ask_answer(self.messages(pair, setting, pair.chosen))
        raw_rejected, failed_rejected, thought_rejected = self.ask_answer(self.messages(pair, setting, pair.rejected))
        chosen = None if failed_chosen else self.read_score(raw_chosen)
        rejected = None if failed_rejected else self.read_score(raw_rejected)
        reasoning = ({"reasoning": {"chosen": thought_chosen[:RAW_CHARS], "rejected": thought_rejected[:RAW_CHARS]}}
                     if thought_chosen or thought_rejected else {})
        return PairResult(pair.id, chosen, rejected, {
            "raw": {"chosen": raw_chosen[:RAW_CHARS], "rejected": raw_rejected[:RAW_CHARS]}, **reasoning,
            "parse_failures": (chosen is None) + (rejected is None),
            **_failure_counts([failed_chosen, failed_rejected]),
        })

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """The exact prompts (chat messages rendered as text) for the chosen and the rejected answer."""
        check_setting(setting, pair)
        return (messages_as_text(self.messages(pair, setting, pair.chosen)),
                messages_as_text(self.messages(pair, setting, pair.rejected)))
