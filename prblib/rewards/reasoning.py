"""Reasoning reward models: the prompt formats RM-R1 and R3 were trained on, and their answer parsers.

Prompt formats (`prompt_format` of the pairwise and pointwise judges; presets set them, see
`prblib.rewards.presets`). The texts are ours; the STRUCTURE (sections, tags, output fields) is the
one each model's card and paper describe, so the model answers in the form it learnt:

- "rm-r1" (RM-R1, instruct variants; Chen et al. 2025, "RM-R1: Reward Modeling as Reasoning"): the
  judge first names the task type inside <type>...</type>; for a chat request it writes its rubric in
  <rubric>...</rubric> and judges both answers against it in <eval>...</eval>; for a problem with one
  correct solution it solves it in <solution>...</solution> first. The verdict ends the reply as
  `<answer>[[A]]</answer>` or `<answer>[[B]]</answer>`.
- "rm-r1-reasoning" (RM-R1, DeepSeek-distilled variants): the model thinks (its chat template opens
  a <think> block), then writes the same `<answer>[[A]]</answer>` verdict.
- "r3" (R3 / mR3; Anugraha et al. 2025, "R3: Robust Rubric-Agnostic Reward Models"): one user message
  with sections (task, input, response(s), evaluation rubric, output format); the answer is ONE JSON
  object {"explanation": text, "score": ...}, possibly after a thinking block. The score depends on
  the task format: pairwise names the better response ("Assistant A", "A", "Response A" or
  "Response 1"; 1 and 2 as numbers); pointwise a number on the rubric's 1-5 scale; binary
  (`prompt_format` "r3-binary", pointwise kind) true or false.

An operator may replace a format's words with a template file under DATA_ROOT (option
`prompt_template`, a JSON object {"system": str (may be ""), "user": str, "syntax": "jinja2" |
"format"}), e.g. the model card's own prompt pasted into that shape; it is rendered in the bounded
sandbox of `prblib.templates` with the variables of PAIRWISE_VARIABLES or POINTWISE_VARIABLES.
The format's answer parser stays (or option `answer_parser` names another).

Parsers (`answer_parser`; None = the prompt format's own). Every parser reads the final answer the
client kept apart from the reasoning (`answers.message_parts`), and strips a <think> block left in
the text as well; a reply it cannot read gives None, a parse failure counted as every judge counts
them (the pair is wrong, `parse_failures` in the details), never a guess:

- "verdict_line" / "score_line": our own "Verdict: A" / "Score: N" lines (`judges.parse_verdict`,
  `judges.parse_score`).
- "rm_r1": the LAST <answer>...</answer> block; inside it exactly one of [[A]] / [[B]] (a bare A or
  B also reads). No answer block, both letters, or anything else: None.
- "r3_json": the LAST JSON object of the reply that has a "score" key (fenced or bare). Pairwise: the
  score names A or B as above; pointwise: a finite number in [1, 5] (a numeric string reads too).
- "r3_binary": the same object, score true or false (also the strings "true"/"false"/"yes"/"no"),
  read as 1.0 / 0.0, so a pair is correct only when the chosen answer is true and the rejected false.

Plain Python; no Django, no torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from prblib.prompts import TextTemplate, text_sha256
from prblib.rows import json_limit_reason, load_json
from prblib.templates import compile_template, format_to_jinja

PAIRWISE_FORMATS = ("prbench", "rm-r1", "rm-r1-reasoning", "r3")
POINTWISE_FORMATS = ("prbench", "r3", "r3-binary")
PAIRWISE_PARSERS = ("verdict_line", "rm_r1", "r3_json")
POINTWISE_PARSERS = ("score_line", "r3_json", "r3_binary")
# The parser each prompt format asks for.
FORMAT_PARSER = {"prbench": None, "rm-r1": "rm_r1", "rm-r1-reasoning": "rm_r1", "r3": "r3_json",
                 "r3-binary": "r3_binary"}
POINTWISE_FORMAT_PARSER = {"prbench": "score_line", "r3": "r3_json", "r3-binary": "r3_binary"}
R3_SCALE = (1.0, 5.0)  # the pointwise rubric's scale, stated in the prompt

# Variables an operator's template may use.
PAIRWISE_VARIABLES = ("context", "question", "response_a", "response_b")
POINTWISE_VARIABLES = ("context", "question", "response")

# --------------------------------------------------------------------------------------------
# Prompts (our words; bump a version whenever any of its texts changes: tests pin each text)

RM_R1_SYSTEM = (
    "You are a fair judge comparing two answers written for one particular person. Work in this order.\n"
    "1. Say what kind of task the question is, inside <type>...</type>: Chat for a request to be served "
    "well, Reasoning for a problem with one correct solution.\n"
    "2. For Chat: set out the rubric you will judge by inside <rubric>...</rubric>: the few things that "
    "matter most for this person and this question, each with the reason it matters. For Reasoning: "
    "work out the solution yourself inside <solution>...</solution>.\n"
    "3. Inside <eval>...</eval>, hold both answers against your rubric or solution, quoting them where "
    "it helps. How well an answer fits this person comes first; correctness and helpfulness next. "
    "Neither the order of the answers nor their length is a reason to prefer one.\n"
    "4. End with your verdict inside answer tags and nothing after it: <answer>[[A]]</answer> when "
    "Answer A is better, <answer>[[B]]</answer> when Answer B is better."
)
RM_R1_REASONING_SYSTEM = (
    "You are a fair judge comparing two answers written for one particular person. Think the comparison "
    "through: what this person needs from an answer, then how each answer meets it, then correctness and "
    "helpfulness. Neither the order of the answers nor their length is a reason to prefer one. When you "
    "have decided, end your reply with the verdict inside answer tags and nothing after it: "
    "<answer>[[A]]</answer> when Answer A is better, <answer>[[B]]</answer> when Answer B is better."
)
RM_R1_CONTEXT = "The question, and what is known about the person who asked it:"

R3_PAIRWISE_TASK = ("Decide which of two responses better answers the input below for the person who asked "
                    "it. Judge by the rubric; the order and the length of the responses are no reason to "
                    "prefer one.")
R3_PAIRWISE_RUBRIC = ("Response A: Response A serves this person better: it fits their situation, interests "
                      "and preferences more closely, and is at least as correct and helpful.\n"
                      "Response B: Response B serves this person better in the same sense.")
R3_PAIRWISE_FORMAT = ('Reply with one JSON object and nothing else: {"explanation": "<a few sentences on why '
                      'one response is better>", "score": "<Response A or Response B>"}')
R3_POINTWISE_TASK = "Rate how well the response answers the input below for the person who asked it, by the rubric."
R3_POINTWISE_RUBRIC = ("1: it does not answer the question, or it is wrong or harmful.\n"
                       "2: it answers only generically and misses what matters to this person.\n"
                       "3: a reasonable answer that pays some attention to the person but misses important needs.\n"
                       "4: a good answer clearly shaped for this person, with minor gaps.\n"
                       "5: an excellent answer that fully serves this person's needs and preferences.")
R3_POINTWISE_FORMAT = ('Reply with one JSON object and nothing else: {"explanation": "<a few sentences on the '
                       'rating>", "score": <an integer from 1 to 5>}')
R3_BINARY_TASK = ("Decide whether the response answers the input below well for the person who asked it, by "
                  "the rubric.")
R3_BINARY_RUBRIC = ("true: the response is correct and helpful and clearly shaped for this person's situation, "
                    "interests and preferences.\n"
                    "false: it is wrong, unhelpful, or generic where this person needed something of their own.")
R3_BINARY_FORMAT = ('Reply with one JSON object and nothing else: {"explanation": "<a few sentences on the '
                    'decision>", "score": <true or false>}')
R3_HEADINGS = ("### Task", "### Input", "### Evaluation rubric", "### Output format")

RM_R1_TEMPLATE = TextTemplate("rm-r1-judge", 1, (RM_R1_SYSTEM, RM_R1_CONTEXT))
RM_R1_REASONING_TEMPLATE = TextTemplate("rm-r1-reasoning-judge", 1, (RM_R1_REASONING_SYSTEM, RM_R1_CONTEXT))
R3_PAIRWISE_TEMPLATE = TextTemplate("r3-pairwise", 1, (R3_PAIRWISE_TASK, R3_PAIRWISE_RUBRIC, R3_PAIRWISE_FORMAT,
                                                       *R3_HEADINGS))
R3_POINTWISE_TEMPLATE = TextTemplate("r3-pointwise", 1, (R3_POINTWISE_TASK, R3_POINTWISE_RUBRIC,
                                                         R3_POINTWISE_FORMAT, *R3_HEADINGS))
R3_BINARY_TEMPLATE = TextTemplate("r3-binary", 1, (R3_BINARY_TASK, R3_BINARY_RUBRIC, R3_BINARY_FORMAT,
                                                   *R3_HEADINGS))
TEMPLATES = {"rm-r1": RM_R1_TEMPLATE, "rm-r1-reasoning": RM_R1_REASONING_TEMPLATE, "r3": R3_PAIRWISE_TEMPLATE}
POINTWISE_TEMPLATES = {"r3": R3_POINTWISE_TEMPLATE, "r3-binary": R3_BINARY_TEMPLATE}


def _block(label: str, text: str) -> str:
    return f"=== {label} ===\n{text.strip()}\n=== End of {label.lower()} ==="


def _r3_user(task: str, context: str, responses: list[tuple[str, str]], rubric: str, output: str) -> str:
    parts = [f"{R3_HEADINGS[0]}\n{task}", f"{R3_HEADINGS[1]}\n{context.strip()}"]
    parts += [f"### {label}\n{text.strip()}" for label, text in responses]
    parts += [f"{R3_HEADINGS[2]}\n{rubric}", f"{R3_HEADINGS[3]}\n{output}"]
    return "\n\n".join(parts)


class OperatorTemplate:
    """An operator's {"system", "user"} template file: jinja2 (or str.format) sources compiled in the
    sandbox over `variables`; ValueError naming what is wrong. `key` records it in manifests as
    "file:<sha256 of the file's text>"."""

    def __init__(self, path: str | Path, variables: tuple[str, ...]):
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        data = load_json(text, file=path.name)
        if not isinstance(data, Mapping) or not isinstance(data.get("user"), str) or \
                not isinstance(data.get("system", ""), str):
            raise ValueError(f"template {path.name} must be a JSON object with text fields user (and system)")
        syntax = data.get("syntax", "format")
        if syntax not in ("format", "jinja2"):
            raise ValueError(f"template {path.name}: syntax must be \"jinja2\" or \"format\", not {syntax!r}")
        self.key = f"file:{text_sha256(text)}"
        self._compiled = {}
        for name in ("system", "user"):
            source = data.get(name, "")
            if syntax == "format":
                source = format_to_jinja(source, where=f"template {path.name}: the {name} message")
            self._compiled[name] = compile_template(source, where=f"template {path.name}: the {name} message",
                                                    allowed=variables)

    def messages(self, values: Mapping[str, str]) -> list[dict[str, str]]:
        system = self._compiled["system"].render(values)
        user = self._compiled["user"].render(values)
        return ([{"role": "system", "content": system}] if system.strip() else []) + \
            [{"role": "user", "content": user}]


def pairwise_messages(prompt_format: str, *, context: str, question: str, first: str, second: str,
                      template: OperatorTemplate | None = None) -> list[dict[str, str]]:
    """The chat messages of a pairwise reasoning format ("rm-r1", "rm-r1-reasoning", "r3"), the
    first answer shown as A; an operator's `template` replaces the words."""
    if template is not None:
        return template.messages({"context": context, "question": question, "response_a": first,
                                  "response_b": second})
    if prompt_format in ("rm-r1", "rm-r1-reasoning"):
        system = RM_R1_SYSTEM if prompt_format == "rm-r1" else RM_R1_REASONING_SYSTEM
        user = "\n\n".join([RM_R1_CONTEXT, context.strip(), _block("Answer A", first), _block("Answer B", second)])
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]
    if prompt_format == "r3":
        return [{"role": "user", "content": _r3_user(R3_PAIRWISE_TASK, context, [("Response A", first),
                                                                                ("Response B", second)],
                                                     R3_PAIRWISE_RUBRIC, R3_PAIRWISE_FORMAT)}]
    raise ValueError(f"no pairwise reasoning format {prompt_format!r} (known: {', '.join(PAIRWISE_FORMATS[1:])})")


def pointwise_messages(prompt_format: str, *, context: str, question: str, response: str,
                       template: OperatorTemplate | None = None) -> list[dict[str, str]]:
    """The chat messages of a pointwise reasoning format ("r3", "r3-binary")."""
    if template is not None:
        return template.messages({"context": context, "question": question, "response": response})
    if prompt_format == "r3":
        return [{"role": "user", "content": _r3_user(R3_POINTWISE_TASK, context, [("Response", response)],
                                                     R3_POINTWISE_RUBRIC, R3_POINTWISE_FORMAT)}]
    if prompt_format == "r3-binary":
        return [{"role": "user", "content": _r3_user(R3_BINARY_TASK, context, [("Response", response)],
                                                     R3_BINARY_RUBRIC, R3_BINARY_FORMAT)}]
    raise ValueError(f"no pointwise reasoning format {prompt_format!r} (known: {', '.join(POINTWISE_FORMATS[1:])})")


# --------------------------------------------------------------------------------------------
# Parsers

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BRACKETED = re.compile(r"\[\[\s*([AB])\s*\]\]", re.IGNORECASE)
_BARE_LETTER = re.compile(r"^[\s*_`\"'(\[]*([AB])[\s*_`\"')\].!]*$", re.IGNORECASE)
_NAMED = re.compile(r"^(?:(?:assistant|response|answer|chatbot|output)\s*)?([ab12])$", re.IGNORECASE)


def final_text(text: str | None) -> str:
    """The reply without reasoning: what follows the last </think> (a template may have opened the
    block in the prompt), with any remaining <think> block removed."""
    text = text or ""
    closed = text.lower().rfind("</think>")
    if closed >= 0:
        text = text[closed + len("</think>"):]
    return _THINK_BLOCK.sub("", text).strip()


def parse_rm_r1(text: str | None) -> str | None:
    """"A" or "B" from RM-R1's last <answer>...</answer> block ([[A]] / [[B]], or a bare letter);
    None when there is no such block or it names both or neither."""
    blocks = _ANSWER_BLOCK.findall(final_text(text))
    if not blocks:
        return None
    inside = blocks[-1]
    letters = {m.upper() for m in _BRACKETED.findall(inside)}
    if len(letters) == 1:
        return letters.pop()
    if letters:
        return None
    bare = _BARE_LETTER.match(inside)
    return bare.group(1).upper() if bare else None


def last_scored_object(text: str | None) -> dict[str, Any] | None:
    """The last JSON object in the reply (after reasoning) that has a "score" key; None when none does
    or the reply nests past the JSON guard's limits."""
    body = final_text(text)
    if json_limit_reason(body):
        return None
    decoder = json.JSONDecoder()
    found, at = None, 0
    while True:
        start = body.find("{", at)
        if start < 0:
            return found
        try:
            value, end = decoder.raw_decode(body, start)
        except ValueError:
            at = start + 1
            continue
        if isinstance(value, dict) and "score" in value:
            found = value
        at = end


def _r3_letter(score: Any) -> str | None:
    if isinstance(score, bool):
        return None
    if isinstance(score, (int, float)):
        return {1: "A", 2: "B"}.get(score) if float(score).is_integer() else None
    if not isinstance(score, str):
        return None
    match = _NAMED.match(" ".join(score.strip().strip(".\"'*").split()))
    if not match:
        return None
    return {"a": "A", "1": "A", "b": "B", "2": "B"}[match.group(1).lower()]


def parse_r3_pairwise(text: str | None) -> str | None:
    """"A" or "B" from an R3 pairwise JSON answer's score; None when unreadable."""
    obj = last_scored_object(text)
    return _r3_letter(obj["score"]) if obj is not None else None


def parse_r3_pointwise(text: str | None, *, low: float = R3_SCALE[0], high: float = R3_SCALE[1]) -> float | None:
    """The number an R3 pointwise answer's score gives, within [low, high]; None otherwise."""
    obj = last_scored_object(text)
    if obj is None or isinstance(obj["score"], bool):
        return None
    score = obj["score"]
    try:
        number = float(score.strip()) if isinstance(score, str) else float(score)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and low <= number <= high else None


_TRUE, _FALSE = ("true", "yes"), ("false", "no")


def parse_r3_binary(text: str | None) -> float | None:
    """1.0 for a true score, 0.0 for false, None when neither."""
    obj = last_scored_object(text)
    if obj is None:
        return None
    score = obj["score"]
    if isinstance(score, bool):
        return 1.0 if score else 0.0
    if isinstance(score, str):
        word = score.strip().strip(".\"'*").lower()
        if word in _TRUE:
            return 1.0
        if word in _FALSE:
            return 0.0
    return None


# The parsers by name (`answer_parser`); our own line parsers live in `judges`.
PAIRWISE_PARSER_FUNCTIONS: dict[str, Callable[[str], str | None]] = {"rm_r1": parse_rm_r1, "r3_json": parse_r3_pairwise}
POINTWISE_PARSER_FUNCTIONS: dict[str, Callable[[str], float | None]] = {"r3_json": parse_r3_pointwise,
                                                                       "r3_binary": parse_r3_binary}


def resolve_data_file(name: str, data_root: str | None, what: str = "template file") -> str:
    """`name` inside the data folder (links resolved); ValueError when it leaves it. Without a data
    root (library use) the name is used as given."""
    if not data_root:
        return name
    root = Path(data_root).resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{what} {name!r} is outside the data folder")
    return str(path)


def prompt_key(prompt_format: str, *, pointwise: bool = False, prompt_template: str | None = None) -> str | None:
    """The manifest's record of a reasoning format's prompt: "name@vN", or "file:<name>" for an
    operator's template (named relative to the data folder); None for "prbench"."""
    if prompt_template:
        return f"file:{prompt_template}"
    table = POINTWISE_TEMPLATES if pointwise else TEMPLATES
    template = table.get(prompt_format)
    return template.key if template else None
