"""Prompt templates written by staff or operators: jinja2 syntax, rendered in jinja2's sandbox.

A template is jinja2 source (`{{ question }}`; `{% if %}`, `{% for %}` and filters work too).
`compile_template` parses it once in a `jinja2.sandbox.SandboxedEnvironment` (no access to
attributes that start with an underscore, to unsafe methods or to anything but the values given)
with `StrictUndefined`, and names the variables it uses (`jinja2.meta.find_undeclared_variables`):
a syntax error, or a variable outside the allowed set, is one TemplateError that names the place,
the line or the variables. Rendering keeps the text byte for byte (no autoescaping, the trailing
newline kept); jinja2 reads every line ending of the template itself as "\\n".

`format_to_jinja` turns a template written for `str.format` (`{question}`, literal braces
doubled) into the jinja2 source that renders the same text: templates stored or written before
prompts moved to jinja2 are converted with it (a data migration for stored ones; an operator's
P-GenRM template file says which syntax it uses).

Plain Python, no Django.
"""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping
from typing import Any

from jinja2 import StrictUndefined, meta
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

_ENV = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)


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
        self._template = _ENV.from_string(tree)

    def render(self, values: Mapping[str, Any]) -> str:
        """The text with `values` filled in; TemplateError naming any variable it uses that
        `values` lacks, or what the sandbox refused."""
        missing = self.variables - set(values)
        if missing:
            raise TemplateError(f"{self.where} needs values for {_names(missing)}")
        try:
            return self._template.render(values)
        except (SecurityError, UndefinedError) as exc:
            raise TemplateError(f"{self.where} cannot be rendered: {exc}") from None


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
