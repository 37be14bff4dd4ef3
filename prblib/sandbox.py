"""The one set of value bounds for every jinja2 template the platform renders from text it does
not own: staff's prompt templates (`templates.SandboxedTemplate`) and model folders' chat
templates (`chat.render_chat`, for judges, P-GenRM, policies and scalar RMs alike).

A `ValueBounds(max_chars, max_int_bits)` checks, before a value is built, what jinja2's sandbox
lets a template compute without limit: `*` repeating a string or list, `**` making a huge
integer, `+` joining two long values, printf-style `%` with a wide width or long arguments, and
every filter's arguments (a width, a count, text repeated once per item: replace, join, center);
each result longer than `max_chars` characters or items is refused too. A refusal is `Bounded`
(a jinja2 SecurityError) with one line naming the bound. Loop steps, output size and time of a
whole render are the renderers' own (each counts its own budget).

Plain Python (jinja2 only).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

from jinja2.exceptions import SecurityError

# A printf-style width or precision of five digits or more, or one given by "*", makes a long string.
_WIDE_PRINTF = re.compile(r"%[-#0 +]*(?:\*|\d{5,}|\d*\.(?:\*|\d{5,}))")
# The binary operators a bounded environment intercepts (jinja2's `intercepted_binops`).
INTERCEPTED_BINOPS = frozenset({"*", "**", "+", "%"})


class Bounded(SecurityError):
    """A template asked for more work or memory than one render may use."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict, range)) else 1


class ValueBounds:
    """Bounds on the values one render builds: at most `max_chars` characters or items in any
    string or list, at most `max_int_bits` bits in an integer made by `**`."""

    def __init__(self, max_chars: int, max_int_bits: int):
        self.max_chars, self.max_int_bits = int(max_chars), int(max_int_bits)

    def check_size(self, value: Any) -> Any:
        """`value`, or Bounded when it is a string, list or tuple longer than max_chars."""
        if isinstance(value, (str, list, tuple)) and len(value) > self.max_chars:
            raise Bounded(f"a value is too long ({len(value)} > {self.max_chars:,} characters or items)")
        return value

    def check_arguments(self, value: Any, args: Iterable[Any]) -> None:
        """Refuse before calling what would build a value past the bounds: a number argument above
        max_chars (a width, a count), a wide printf format, or text arguments that, repeated
        once per character or item of the value (replace, join), exceed max_chars."""
        args = list(args)
        for arg in args:
            if isinstance(arg, (int, float)) and not isinstance(arg, bool) and abs(arg) > self.max_chars:
                raise Bounded(f"a value is too long (an argument of {arg} > {self.max_chars:,})")
        for text in [value, *args]:
            if isinstance(text, str) and _WIDE_PRINTF.search(text):
                raise Bounded("a value is too long (a printf width or precision of 10000 or more, or '*')")
        texts = sum(len(a) for a in args if isinstance(a, str))
        if texts and (_size(value) + 1) * (texts + 1) > self.max_chars:
            raise Bounded(f"a value is too long (about {(_size(value) + 1) * (texts + 1)} > {self.max_chars:,} "
                          "characters)")

    def bounded_filter(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function` (a jinja2 filter) with its arguments checked before and its result after."""
        @functools.wraps(function)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            # pass_context / pass_environment / pass_eval_context filters get that object first.
            first = 1 if getattr(function, "jinja_pass_arg", None) else 0
            self.check_arguments(args[first] if len(args) > first else None, [*args[first + 1:], *kwargs.values()])
            return self.check_size(function(*args, **kwargs))

        return bounded

    def binop(self, op: str, left: Any, right: Any) -> Any:
        """`left op right` for op in INTERCEPTED_BINOPS, refused (Bounded) before a value past
        the bounds is built. A sandbox's `call_binop` returns this."""
        if op == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) and \
                    len(left) + len(right) > self.max_chars:
                raise Bounded(f"a value is too long ({len(left) + len(right)} > {self.max_chars:,})")
            return operator.add(left, right)
        if op == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and \
                        len(seq) * max(count, 0) > self.max_chars:
                    raise Bounded(f"a value is too long ({len(seq)} x {count} > {self.max_chars:,})")
            return operator.mul(left, right)
        if op == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    right * math.log2(abs(left)) > self.max_int_bits:
                raise Bounded(f"a number is too large ({left} ** {right} has more than {self.max_int_bits} bits)")
            return operator.pow(left, right)
        if op == "%":
            if isinstance(left, str):  # printf-style formatting
                self.check_arguments(left, right if isinstance(right, tuple) else [right])
                return self.check_size(operator.mod(left, right))
            return operator.mod(left, right)
        raise Bounded(f"operator {op!r} is not bounded here")
