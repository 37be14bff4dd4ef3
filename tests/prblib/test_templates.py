"""Staff and operator prompt templates render in a bounded sandbox: whatever a template does,
compiling and rendering it ends quickly with text or one TemplateError naming the template,
never a hang, a gigabyte string or another exception's traceback."""

import time

import pytest

from prblib.templates import MAX_ITERATIONS, MAX_OUTPUT_CHARS, TemplateError, compile_template

VALUES = {"question": "Q?", "profile": "1. p"}


def render(source, values=VALUES):
    return compile_template(source, where="template T", allowed=set(VALUES)).render(values)


@pytest.mark.parametrize("source, reason", [
    # Work or memory without bound.
    ("{{ 7**9999999 }}", "too large"),                       # folded at compile time before
    ("{{ 'x' * 10**9 }}", "too long"),
    ("{{ question * 10**9 }}", "too long"),
    ("{{ [1] * 10**9 }}", "too long"),
    ("{{ 'x'|center(10**9) }}", "too long"),
    ("{{ 'x'|indent(10**9, true) }}", "too long"),
    ("{{ '%0999999999d'|format(1) }}", "too long"),
    ("{{ '%0999999999d' % 1 }}", "too long"),
    ("{{ '%*d' % (999999999, 1) }}", "too long"),
    ("{{ question|replace('', question * 5000)|replace('', question * 5000)|length }}", "too long"),
    ("{{ range(100000)|join(question * 5000) }}", "too long"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% for i in range(100000) %}{% for c in profile %}{% for d in profile %}{% endfor %}{% endfor %}{% endfor %}",
     "steps"),
    ("{% for i in range(99999) %}{{ profile }}{{ profile }}{% endfor %}", "characters"),
    ("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}", "macro"),
    ("{% for c in question recursive %}{{ loop(question) }}{% endfor %}", "recursive"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "unknown variables"),
    ("{{ lipsum(10**6) }}", "unknown variables"),
    ("{{ range(10**9)|length }}", "range"),
    # Reaching outside: globals, attributes, files.
    ("{{ cycler.__init__.__globals__ }}", "unknown variables"),
    ("{{ joiner }}{{ dict }}", "unknown variables"),
    ("{{ question.__class__.__mro__ }}", "unsafe"),
    ("{% include '/etc/passwd' %}", "include"),
    ("{% import 'x' as y %}", "import"),
    ("{% extends 'base.html' %}", "extends"),
    # Plain mistakes: one line, not a traceback.
    ("{{ 1/0 }}", "ZeroDivisionError"),
    ("{{ question + 1 }}", "TypeError"),
])
def test_a_hostile_or_broken_template_is_one_quick_template_error(source, reason):
    started = time.perf_counter()
    with pytest.raises(TemplateError, match=reason) as caught:
        render(source, {**VALUES, "profile": "p" * 30})
    assert str(caught.value).startswith("template T")
    assert time.perf_counter() - started < 3


def test_bounds_leave_ordinary_templates_alone():
    assert render("{% for c in question %}[{{ loop.index }}{{ c|upper }}]{% endfor %}") == "[1Q][2?]"
    assert render("{{ question * 2 }} {{ 2 ** 10 }} {{ '%05d' % 42 }} {{ '%s!'|format(question) }}") == \
        "Q?Q? 1024 00042 Q?!"
    assert render("{% for i in range(3) %}{{ i }}{% endfor %}{{ profile|replace('p', 'post')|center(10) }}") == \
        "012 1. post  "
    assert render("{% set n = question|length %}{% if n > 1 %}{{ n }}{% endif %}") == "2"
    long = "x" * (MAX_OUTPUT_CHARS - 10)  # a long profile goes through whole
    assert render("{{ profile }}", {**VALUES, "profile": long}) == long
    assert MAX_ITERATIONS >= 100_000
