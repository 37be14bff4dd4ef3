"""The published P-GenRM chain format: the prompt structure and output format the released
checkpoints (P-GenRM-8B-PRISM, P-GenRM-8B-ChatbotArena) were trained on, written in our own words.

Structure (facts from the authors' release, not their text):
- system message: the evaluator's role, the user's earlier choices as a list of (query, chosen,
  rejected) triples, and the task in two parts: (1) an analysis that infers the user's persona and
  preferences from those choices and derives weighted evaluation criteria; (2) right after it, the
  marker <JSON_START>, one JSON object, the marker <JSON_END>, and nothing else;
- user message: the current query and the two candidates labelled "Response 1" and "Response 2";
- the JSON object has two keys: "rationale" (text: criteria with percentage weights, a 1-10 score per
  criterion per response, and the weighted computation) and "better_response"
  ({"response_1": final score, "response_2": final score}).

`parse_published(text)` reads such a reply strictly: both markers present (a reply cut before
<JSON_END> is a failure), one JSON object between them, "better_response" with exactly the keys
response_1 and response_2, each a finite number or a numeric string (the release reads them with
float()). The analysis (text before <JSON_START>) is kept as the chain's persona: it is what the
release keeps as the user's inferred preference analysis for building prototypes.

An operator may replace the wording with a template file (a JSON object {"system": str, "user": str,
"syntax": "jinja2" or "format"}) under DATA_ROOT, e.g. the authors' own prompt pasted into that shape;
variables history (alias few_shots), query (alias user_input), response_1, response_2. With "syntax":
"jinja2" the texts are jinja2 templates ({{ query }}); without it, or with "format", they are written
for str.format as before ({query}, literal braces doubled) and converted (templates.format_to_jinja).
Either way they are rendered in jinja2's sandbox (prblib.templates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prblib.prompts import TextTemplate
from prblib.rows import load_json
from prblib.templates import compile_template, format_to_jinja

START, END = "<JSON_START>", "<JSON_END>"
RESPONSE_KEYS = ("response_1", "response_2")
FAILURE_REASONS = ("no_json", "malformed_json", "bad_totals")
PLACEHOLDERS = {"history": "history", "few_shots": "history", "query": "query", "user_input": "query",
                "response_1": "response_1", "response_2": "response_2"}

SYSTEM = (
    "You judge answers for one specific user, not for people in general.\n\n"
    "Earlier choices of this user (each: what they asked, the answer they picked, the answer they turned "
    "down):\n\n{{ history }}\n"
    "Your task has two parts.\n"
    "Part 1 - analysis. From the earlier choices, work out who this user is and what they value: their "
    "situation, tastes, and how they like answers written. Then turn that into a few evaluation criteria "
    "for the new query and give each a percentage weight; the weights add up to 100.\n"
    "Part 2 - verdict. Right after the analysis write " + START + ", then one JSON object, then " + END +
    ", and nothing after it. The object has exactly two keys. \"rationale\": text that lists the criteria "
    "with their weights, scores each response on every criterion from 1 (poor) to 10 (excellent) with a "
    "short reason, and shows each response's weighted final score. \"better_response\": an object "
    "{\"response_1\": <final score of Response 1>, \"response_2\": <final score of Response 2>}.\n"
    "The order in which the responses appear and their length are never reasons to prefer one."
)
USER = "The user's new query:\n{{ query }}\n\nResponse 1:\n{{ response_1 }}\n\nResponse 2:\n{{ response_2 }}"
NO_HISTORY = "(none: nothing is known about this user's earlier choices)\n"
# Our own wording of the published structure; bump the version whenever a text changes (tests pin it).
# An operator's template file (runtime["pgenrm_template"]) is recorded by its own content hash instead.
PUBLISHED_TEMPLATE = TextTemplate("pgenrm-published", 1, (SYSTEM, USER, NO_HISTORY))


class Invalid(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def render_history(history: Sequence[tuple[str, str, str]]) -> str:
    if not history:
        return NO_HISTORY
    return "".join(f"Asked: {prompt.strip()}\nPicked: {chosen.strip()}\nTurned down: {rejected.strip()}\n\n"
                   for prompt, chosen, rejected in history)


class Template:
    """The two message templates of the published format (ours by default, or an operator's file):
    jinja2 sources over the variables in PLACEHOLDERS, compiled in the sandbox; ValueError
    (templates.TemplateError) naming an unknown variable or a syntax error."""

    def __init__(self, system: str = SYSTEM, user: str = USER, *, source: str = "built-in"):
        self._compiled = [compile_template(text, where=f"template {source}: the {name} message",
                                           allowed=PLACEHOLDERS)
                          for name, text in (("system", system), ("user", user))]
        self.system, self.user, self.source = system, user, source

    @classmethod
    def from_file(cls, path: str | Path) -> Template:
        """Read {"system": str, "user": str, "syntax": "jinja2" | "format" (the default)};
        ValueError/OSError when unusable."""
        data = load_json(Path(path).read_text(encoding="utf-8"), file=Path(path).name)
        name = Path(path).name
        if not isinstance(data, Mapping) or not all(isinstance(data.get(k), str) for k in ("system", "user")):
            raise ValueError(f"template {name} must be a JSON object with text fields system and user")
        syntax = data.get("syntax", "format")
        if syntax not in ("format", "jinja2"):
            raise ValueError(f"template {name}: syntax must be \"jinja2\" or \"format\", not {syntax!r}")
        texts = {k: data[k] if syntax == "jinja2" else format_to_jinja(data[k], where=f"template {name}: the {k} message")
                 for k in ("system", "user")}
        return cls(texts["system"], texts["user"], source=name)

    def messages(self, history: Sequence[tuple[str, str, str]], query: str, response_1: str,
                 response_2: str) -> list[dict[str, str]]:
        values = {"history": render_history(history), "query": query.strip(), "response_1": response_1.strip(),
                  "response_2": response_2.strip()}
        fill = {alias: values[target] for alias, target in PLACEHOLDERS.items()}
        system, user = self._compiled
        return [{"role": "system", "content": system.render(fill)}, {"role": "user", "content": user.render(fill)}]


def _score(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise Invalid("bad_totals", f"\"better_response\".{key} is {value!r}, not a number")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise Invalid("bad_totals", f"\"better_response\".{key} is {value!r}, not a number") from None
    if not math.isfinite(number):
        raise Invalid("bad_totals", f"\"better_response\".{key} is {value!r}, not a finite number")
    return number


def json_between_markers(text: str) -> tuple[str, dict[str, Any]]:
    """(analysis before START, the JSON object between the LAST START and the END after it)."""
    start = text.rfind(START)
    if start < 0:
        raise Invalid("no_json", f"the reply has no {START} marker")
    end = text.find(END, start)
    if end < 0:
        raise Invalid("malformed_json", f"{START} is never closed by {END} (was the reply cut short?)")
    try:
        value = load_json(text[start + len(START):end].strip(), constants=True)  # NaN: bad_totals names it
    except ValueError as exc:
        raise Invalid("malformed_json", f"the JSON between the markers does not parse: {exc}") from None
    if not isinstance(value, dict):
        raise Invalid("malformed_json", "the JSON between the markers is not an object")
    return text[:start].strip(), value


def parse_published(text: str) -> tuple[str, dict[str, float]]:
    """(analysis, {"response_1": score, "response_2": score}); raises Invalid (see the module docstring)."""
    analysis, obj = json_between_markers(text or "")
    scores = obj.get("better_response")
    if not isinstance(scores, dict):
        raise Invalid("bad_totals", "\"better_response\" is missing or not an object")
    if sorted(scores) != sorted(RESPONSE_KEYS):
        raise Invalid("bad_totals", f"\"better_response\" must have exactly the keys response_1 and response_2, "
                                    f"not {', '.join(map(str, scores)) or 'none'}")
    return analysis, {key: _score(scores[key], key) for key in RESPONSE_KEYS}
