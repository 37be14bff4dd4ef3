"""A model folder's chat template, rendered as transformers renders it but within bounds, and
the one rule for templates that refuse a system message.

`render_chat` fills a Hugging Face chat template (jinja2 source from the tokenizer) with chat
messages the way `tokenizer.apply_chat_template(..., tokenize=False)` does: jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, the globals
transformers gives (`raise_exception`, `strftime_now`, its `tojson`), the tokenizer's special
tokens (`bos_token`, `eos_token`, ...) and `add_generation_prompt`. Unlike transformers it is
bounded, because a folder's template is the submitter's code: at most MAX_LOOP_STEPS steps
(loop iterations and calls, macros included, of one render together), MAX_OUTPUT_CHARS characters of output (and no `*` or `**`
building a longer string or a huge number), and MAX_SECONDS of time, checked at every loop step
and every piece of output. Past a bound, or on any error the template raises, ChatTemplateError
with one line: a template never hangs a worker or the form check, or fills their memory.

System messages. Some templates refuse a system role (Gemma's raises "System role not
supported"; Mistral's first ones accept only user and assistant). `system_role_supported` probes
a template once with a short system + user exchange; `fold_system` then puts the system text
at the start of the first user turn (separated by a blank line), which is what such models are
trained to read. The local backend does this for every prompt of such a model, and the folder
check reports it (`modelcheck.ModelFolderInfo.chat_template_notes`).

Plain Python (jinja2 only); no Django, no transformers.
"""

from __future__ import annotations

import contextvars
import functools
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from prblib.errors import ModelError
from prblib.sandbox import INTERCEPTED_BINOPS, Bounded, ValueBounds  # the one bounded sandbox's value checks

MAX_LOOP_STEPS = 2_000_000
MAX_OUTPUT_CHARS = 2_000_000
MAX_SECONDS = 5.0
MAX_INT_BITS = 4096
PROBE = [{"role": "system", "content": "You are a careful judge."}, {"role": "user", "content": "Which is better?"}]
_budget: contextvars.ContextVar["_Budget"] = contextvars.ContextVar("chat_template_budget")


class ChatTemplateError(ModelError):
    """A chat template that cannot render these messages, or went past a bound; one line."""


_Bounded = Bounded  # a render past one of the bounds
_BOUNDS = ValueBounds(MAX_OUTPUT_CHARS, MAX_INT_BITS)


class _Budget:
    def __init__(self, seconds: float, steps: int):
        self.deadline = time.monotonic() + seconds
        self.seconds, self.steps = seconds, steps

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise _Bounded(f"it takes more than {MAX_LOOP_STEPS:,} steps (loop iterations and calls)")
        if time.monotonic() > self.deadline:
            raise _Bounded(f"it takes more than {self.seconds:g} s")


class _Environment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with `*`, `**`, `+`, `%` and every filter checked before they build
    a value (`sandbox.ValueBounds`, the checks prompt templates use), `~` checked after, calls
    counted as steps."""

    intercepted_binops = INTERCEPTED_BINOPS

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's)
        budget = _budget.get(None)
        if budget is not None:  # every call (macros included) is a step: recursion without loops is bounded too
            budget.step()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        return _BOUNDS.binop(op, left, right)


class _Refused(TemplateError):
    """The template's own refusal (`raise_exception`, as transformers gives it)."""


def _raise_exception(message: Any) -> None:
    raise _Refused(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    budget = _budget.get()
    for item in iterable:
        budget.step()
        yield item


def _sized(value: Any) -> Any:
    return _BOUNDS.check_size(value)


def _environment() -> _Environment:
    env = _Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.filters = {name: _BOUNDS.bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.prbench_counted = _counted  # environment attributes: no template can shadow them
    env.prbench_sized = _sized
    return env


_ENV = _environment()
_COMPILED: dict[str, Any] = {}


class _SizedConcat(NodeTransformer):
    """`a ~ b` becomes prbench_sized(a ~ b): its length is checked as soon as it is built."""

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:  # noqa: N802 (jinja2's visitor naming)
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("prbench_sized", lineno=node.lineno), [node], [], None, None,
                          lineno=node.lineno)


def _compile(source: str) -> Any:
    """The template with every loop's iterable wrapped so each step counts (cached per source)."""
    compiled = _COMPILED.get(source)
    if compiled is not None:
        return compiled
    try:
        tree = _ENV.parse(source)
        tree = _SizedConcat().visit(tree)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("prbench_counted", lineno=loop.lineno), [loop.iter],
                                   [], None, None, lineno=loop.lineno)
        compiled = _ENV.from_string(tree)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not parse (line {exc.lineno}: {exc.message})") from None
    except RecursionError:
        raise ChatTemplateError("the chat template is nested too deeply to compile") from None
    if len(_COMPILED) > 32:
        _COMPILED.clear()
    _COMPILED[source] = compiled
    return compiled


def render_chat(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                special_tokens: Mapping[str, Any] | None = None, seconds: float = MAX_SECONDS) -> str:
    """The prompt text `source` makes of `messages` (see the module docstring); ChatTemplateError
    with the template's own message (e.g. "System role not supported") or the bound it passed."""
    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError("the chat template is not a non-empty string")
    template = _compile(source)
    budget = _Budget(seconds, MAX_LOOP_STEPS)
    values = {**{k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)},
              "messages": [dict(m) for m in messages], "add_generation_prompt": add_generation_prompt,
              "tools": None, "documents": None}
    out, length = [], 0
    token = _budget.set(budget)
    try:
        for chunk in template.generate(values):
            length += len(chunk)
            if length > MAX_OUTPUT_CHARS:
                raise _Bounded(f"its text is longer than {MAX_OUTPUT_CHARS:,} characters")
            budget.step()
            out.append(chunk)
    except SecurityError as exc:  # the bounds, and what the sandbox refuses
        raise ChatTemplateError(f"the chat template was stopped: {exc}") from None
    except _Refused as exc:
        raise ChatTemplateError(f"the chat template refused the messages: {exc}") from None
    except (TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError,
            MemoryError) as exc:
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    finally:
        _budget.reset(token)
    return "".join(out)


def system_role_supported(source: str, special_tokens: Mapping[str, Any] | None = None) -> bool:
    """Whether the template renders a system message (probed with PROBE). False when it refuses
    one but renders the same exchange folded (`fold_system`); ChatTemplateError when it cannot
    render even that. Probed once per template and special tokens."""
    return _system_role_supported(source, tuple(sorted((k, v) for k, v in (special_tokens or {}).items()
                                                       if isinstance(v, str))))


@functools.lru_cache(maxsize=32)
def _system_role_supported(source: str, special: tuple[tuple[str, str], ...]) -> bool:
    try:
        render_chat(source, PROBE, special_tokens=dict(special))
        return True
    except ChatTemplateError as refused:
        try:
            render_chat(source, fold_system(PROBE), special_tokens=dict(special))
        except ChatTemplateError:
            raise refused from None
        return False


def render_for_model(source: str, messages: Sequence[Mapping[str, Any]], *,
                     special_tokens: Mapping[str, Any] | None = None) -> str:
    """The generation prompt for `messages`: the system text folded into the first user turn
    when the template refuses a system message, then `render_chat`. What the local backend and
    the PPO trainer send the model."""
    if any(m.get("role") == "system" for m in messages) and not system_role_supported(source, special_tokens):
        messages = fold_system(messages)
    return render_chat(source, messages, special_tokens=special_tokens)


def fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages without system turns: their text joined, then a blank line, at the start of the
    first user turn (a user turn holding only that text when there is none)."""
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system").strip()
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    if not system:
        return rest
    for message in rest:
        if message.get("role") == "user":
            message["content"] = f"{system}\n\n{message.get('content') or ''}"
            return rest
    return [{"role": "user", "content": system}, *rest]


SYSTEM_FOLDED_NOTE = ("the chat template refuses a system message: system prompts are folded into the first user "
                      "turn")
