"""Prompt templates written by staff or operators: jinja2 syntax, rendered in jinja2's sandbox.

A template is jinja2 source (`{{ question }}`; `{% if %}`, `{% for %}` and filters work too).
`compile_template` parses it once in a `jinja2.sandbox.SandboxedEnvironment` (no access to
attributes that start with an underscore, to unsafe methods or to anything but the values given)
with `StrictUndefined`, and names the variables it uses (`jinja2.meta.find_undeclared_variables`):
a syntax error, or a variable outside the allowed set, is one TemplateError that names the place,
the line or the variables. Rendering keeps the text byte for byte (no autoescaping, the trailing
newline kept); jinja2 reads every line ending of the template itself as "\\n".

Rendering is bounded, whoever wrote the template: a template may use only the values it is
given and `range` (no `namespace`, `cycler`, `joiner`, `lipsum` or `dict`), and no macros,
`{% call %}`, recursive loops, `include`, `import` or `extends` (refused when compiled). One
render takes at most MAX_ITERATIONS loop steps in all, produces at most MAX_OUTPUT_CHARS
characters, and no operator (`*`, `**`, `+`, `%`) or filter may build a string or list longer than
that or an integer of more than MAX_INT_BITS bits (checked before the value is built, so
`{{ 'x' * 10**9 }}` allocates nothing). Anything a template does wrong at render time (a
division by zero, adding text to a number) is a TemplateError too, never another exception.

`format_to_jinja` turns a template written for `str.format` (`{question}`, literal braces
doubled) into the jinja2 source that renders the same text: templates stored or written before
prompts moved to jinja2 are converted with it (a data migration for stored ones; an operator's
P-GenRM template file says which syntax it uses).

Plain Python, no Django.
"""

from __future__ import annotations

import contextvars
import string
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from jinja2 import StrictUndefined, meta, nodes
from jinja2.exceptions import TemplateError as JinjaError, TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment, safe_range

from prblib.sandbox import INTERCEPTED_BINOPS, Bounded, ValueBounds

MAX_OUTPUT_CHARS = 4_000_000  # one rendered message, and any string or list built on the way
MAX_ITERATIONS = 1_000_000  # loop steps of one render, all loops together
MAX_INT_BITS = 4096  # the largest integer `**` may build
# Tags that could recurse, read files or pull in other templates: never needed to fill in a prompt.
_REFUSED_NODES = {nodes.Macro: "macro", nodes.CallBlock: "call", nodes.Include: "include",
                  nodes.Import: "import", nodes.FromImport: "import", nodes.Extends: "extends"}
_steps: contextvars.ContextVar[list[int]] = contextvars.ContextVar("template_steps")


_BOUNDS = ValueBounds(MAX_OUTPUT_CHARS, MAX_INT_BITS)  # the one bounded sandbox's value checks (prblib.sandbox)
_Bounded = Bounded


def _counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """The loop's items, each one step of the render's MAX_ITERATIONS."""
    budget = _steps.get(None)
    for item in iterable:
        if budget is not None:
            budget[0] -= 1
            if budget[0] < 0:
                raise _Bounded(f"it takes more than {MAX_ITERATIONS} loop steps")
        yield item


_COUNTED = "prbench_counted_loop"


class _BoundedEnvironment(SandboxedEnvironment):
    """The sandbox with the bounds above: `*`, `**`, `+` and `%` checked before they run (which
    also keeps jinja2 from computing them while compiling), every filter wrapped, loops counted:
    the value checks are `sandbox.ValueBounds`, shared with chat templates."""

    intercepted_binops = INTERCEPTED_BINOPS

    def call_binop(self, context, op: str, left: Any, right: Any) -> Any:
        return _BOUNDS.binop(op, left, right)


_ENV = _BoundedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
_ENV.globals = {"range": safe_range, _COUNTED: _counted}  # jinja2's range, capped at MAX_RANGE items
_ENV.filters = {name: _BOUNDS.bounded_filter(f) for name, f in _ENV.filters.items()}


def _bound_tree(tree: nodes.Template, where: str) -> None:
    """Refuse the tags in _REFUSED_NODES and recursive loops; make every loop count its steps."""
    for kind, tag in _REFUSED_NODES.items():
        found = tree.find(kind)
        if found is not None:
            raise TemplateError(f"{where} uses {{% {tag} %}} (line {found.lineno}), which prompt templates may not")
    for loop in tree.find_all(nodes.For):
        if loop.recursive:
            raise TemplateError(f"{where} has a recursive loop (line {loop.lineno}), which prompt templates may not "
                                "use")
        loop.iter = nodes.Call(nodes.Name(_COUNTED, "load", lineno=loop.lineno), [loop.iter], [], None, None,
                               lineno=loop.lineno)


class TemplateError(ValueError):
    """A template that cannot be used, with a message that names where and why."""


def _names(names: Collection[str]) -> str:
    return ", ".join("{{ " + name + " }}" for name in sorted(names))


class SandboxedTemplate:
    """One compiled template: `variables` (the names it uses) and `render(values)`."""

    def __init__(self, source: str, *, where: str, allowed: Collection[str]):
        if not isinstance(source, str):
            raise TemplateError(f"{where} must be text, not {type(source).__name__}")
        try:
            tree = _ENV.parse(source)
        except TemplateSyntaxError as exc:
            raise TemplateError(f"{where} is not a valid template: {exc.message} (line {exc.lineno})") from None
        self.source, self.where = source, where
        self.variables = frozenset(meta.find_undeclared_variables(tree))
        unknown = self.variables - set(allowed)
        if unknown:
            raise TemplateError(f"{where} uses unknown variables {_names(unknown)} (allowed: {_names(allowed)})")
        _bound_tree(tree, where)
        try:
            self._template = _ENV.from_string(tree)
        except TemplateSyntaxError as exc:
            raise TemplateError(f"{where} is not a valid template: {exc.message} (line {exc.lineno})") from None

    def render(self, values: Mapping[str, Any]) -> str:
        """The text with `values` filled in; TemplateError naming any variable it uses that
        `values` lacks, or what the sandbox refused."""
        missing = self.variables - set(values)
        if missing:
            raise TemplateError(f"{self.where} needs values for {_names(missing)}")
        token = _steps.set([MAX_ITERATIONS])
        try:
            out, length = [], 0
            for chunk in self._template.generate(values):
                length += len(chunk)
                if length > MAX_OUTPUT_CHARS:
                    raise _Bounded(f"its text is longer than {MAX_OUTPUT_CHARS} characters")
                out.append(chunk)
            return "".join(out)
        except JinjaError as exc:  # the sandbox's refusals, undefined values, the bounds
            raise TemplateError(f"{self.where} cannot be rendered: {exc}") from None
        except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError,
                MemoryError) as exc:  # the template's own mistakes, e.g. {{ 1/0 }}
            raise TemplateError(f"{self.where} cannot be rendered: {type(exc).__name__}: {exc}") from None
        finally:
            _steps.reset(token)


def compile_template(source: str, *, where: str, allowed: Collection[str]) -> SandboxedTemplate:
    """Parse `source` in the sandbox; TemplateError on a syntax error or a variable outside `allowed`."""
    return SandboxedTemplate(source, where=where, allowed=allowed)


def format_to_jinja(text: str, *, where: str = "template") -> str:
    """The jinja2 source of a `str.format` template: `{name}` becomes `{{ name }}`, a doubled
    brace a literal one (a literal "{" is written `{{ "{" }}`, so it can never open a jinja2
    tag). Rendering the result with the same named values gives exactly the text `str.format`
    gave. TemplateError for what has no jinja2 equivalent here: positional (`{}`, `{0}`),
    attribute or index (`{a.b}`, `{a[0]}`) fields, conversions and format specs (`{a!r}`,
    `{a:>9}`), and malformed braces."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise TemplateError(f"{where} has malformed braces ({exc})") from None
    out = []
    for literal, field, spec, conversion in parsed:
        out.append(literal.replace("{", '{{ "{" }}'))
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise TemplateError(f"{where} has the placeholder {{{shown}}}, which only plain names like "
                                "{question} can be converted from")
        out.append("{{ " + field + " }}")
    return "".join(out)
