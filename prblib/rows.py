"""One validation layer for everything prbench reads: text files and the rows and JSON blobs in them.

Plain Python (pydantic, no Django), shared by the benchmark importer (`pipeline.formats`), the
uploaded scores reader (`prblib.rewards.scores`), the outcome and benchmark-score importers, the
prototypes reader and the API serializers that take JSON blobs.

- `decode_text(data, file)` / `read_text(path)`: UTF-8 with or without a byte order mark, any
  line ending (CRLF and lone CR become LF), so the same content saved by a spreadsheet or on
  Windows reads, and hashes, the same. Invalid UTF-8 raises RowError naming the line.
- `read_lines(path, max_lines=, max_line_bytes=)`: the same lines read in chunks, for files
  from outside (uploaded scores): memory holds one chunk and one line, and a file past either
  limit (a flood of blank lines, one endless line) is refused at the first line past it.
- `check_text(value, field)`: text fields must not hold lone surrogates (half an emoji, e.g. a
  JSON escape "\\ud83c" with no partner) or NUL characters: PostgreSQL cannot store either (text
  and jsonb refuse NUL; surrogates cannot be encoded as UTF-8), so both databases refuse them
  alike, naming the field. Applied to every string (keys included) anywhere inside a row.
- `validate(model, row, file=, line=)`: a pydantic model per kind of row; the first error becomes
  one RowError "FILE, line N, field 'X': reason" (the idea of healthchecks' format_first_error).
  Bounded text fields carry the bound of the database column they land in, so an over-long
  value is refused with its line and field on SQLite and PostgreSQL alike.
- `load_json(text, file=, line=, field=)`: the one JSON reader for what a client or a file sends
  (request bodies, uploaded and imported files, model-folder files, safetensors headers, a
  model's answers). Nesting deeper than MAX_JSON_DEPTH is refused before parsing, by a scan that
  does not recurse (json.loads itself raises RecursionError near depth 1000, so the check
  cannot be left to it), and so is a number literal longer than MAX_JSON_NUMBER_CHARS (Python
  refuses integers over 4300 digits with a ValueError that says nothing useful to a client).
  NaN, Infinity and floats beyond the float range are refused unless `constants=True` (for
  readers that check every number themselves and name the field, and for model files, read as
  transformers reads them). Every refusal is one RowError naming the file, line or field and
  the limit.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

# PostgreSQL integer columns are 32-bit; a count beyond that is an input error, not a database error.
MAX_INT = 2**31 - 1
# Ids and BigIntegerField columns are 64-bit.
MAX_BIGINT = 2**63 - 1
# JSON from outside: objects and arrays nest at most this deep (no config, header, row or request
# body needs more than a handful of levels), and one number literal is at most this many characters.
MAX_JSON_DEPTH = 64
MAX_JSON_NUMBER_CHARS = 1000
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


class RowError(ValueError):
    """Input that cannot be used; the message names the file, the line (or row) and the field."""

    def __init__(self, reason: str, *, file: Path | str | None = None, line: int | None = None,
                 field: str | None = None, unit: str = "line"):
        self.file, self.line, self.field, self.unit, self.reason = file, line, field, unit, reason
        where = []
        if file is not None:
            where.append(str(file))
        if line is not None:
            where.append(f"{unit} {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {reason}" if where else reason)


# --- text ------------------------------------------------------------------------------------

def decode_text(data: bytes, *, file: Path | str | None = None) -> str:
    """UTF-8 bytes (a leading BOM dropped) as text with LF line ends."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise RowError(f"invalid UTF-8 (byte {column} of the line)", file=file, line=line) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_text(path: Path | str, *, name: str | None = None) -> str:
    """The file's text (see decode_text); errors name `name` (default: the file name)."""
    path = Path(path)
    return decode_text(path.read_bytes(), file=name or path.name)


def content_sha256(path: Path | str, *, chunk_size: int = 1 << 16) -> str:
    """sha256 of a file's content as decode_text sees it (BOM dropped, CRLF and CR as LF), read in
    chunks: equal to sha256(decode_text(data).encode()) for UTF-8 data, so copies of one text
    saved with other line ends or a BOM hash alike."""
    sha, pending_cr = hashlib.sha256(), False
    with open(path, "rb") as fh:
        chunk = fh.read(max(chunk_size, len(codecs.BOM_UTF8))).removeprefix(codecs.BOM_UTF8) or fh.read(chunk_size)
        while chunk:
            if pending_cr:
                chunk, pending_cr = b"\r" + chunk, False
            if chunk.endswith(b"\r"):
                chunk, pending_cr = chunk[:-1], True
            sha.update(chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n"))
            chunk = fh.read(chunk_size)
    if pending_cr:
        sha.update(b"\n")
    return sha.hexdigest()


def text_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every line that is not blank."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


_LINE_END = re.compile(rb"\r\n|\r|\n")


def read_lines(path: Path | str, *, name: str | None = None, max_lines: int, max_line_bytes: int,
               chunk_size: int = 1 << 16) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) for every line of the file that is not blank, as
    text_lines(read_text(path)) gives them, but read in chunks: memory holds one chunk and one
    line, and a file past a limit is refused at the first line past it, the rest never read.
    RowError (naming `name`, default the file name, and the line) for a line longer than
    `max_line_bytes`, more than `max_lines` lines (blank ones count) or invalid UTF-8."""
    file = name or Path(path).name
    number = 0

    def line_of(raw: bytes) -> str:
        nonlocal number
        number += 1
        if number > max_lines:
            raise RowError(f"more than {max_lines:,} lines (blank lines count)", file=file, line=number)
        if len(raw) > max_line_bytes:
            raise RowError(f"the line is longer than {max_line_bytes:,} bytes", file=file, line=number)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RowError(f"invalid UTF-8 (byte {exc.start + 1} of the line)", file=file, line=number) from None

    with open(path, "rb") as fh:
        held = fh.read(max(chunk_size, len(codecs.BOM_UTF8))).removeprefix(codecs.BOM_UTF8)
        more = True
        while more:
            chunk = fh.read(chunk_size)
            more = bool(chunk)
            data = held + chunk if more else held
            # A CR at the end may be the first half of a CRLF: it waits for the next chunk.
            end = len(data) - 1 if more and data.endswith(b"\r") else len(data)
            start = 0
            for match in _LINE_END.finditer(data, 0, end):
                line = line_of(data[start:match.start()])
                start = match.end()
                if line.strip():
                    yield number, line
            held = data[start:]
            if len(held) > max_line_bytes:
                line_of(held)  # raises: the line is already too long
        if held:
            line = line_of(held)
            if line.strip():
                yield number, line


def bad_char_reason(value: str) -> str | None:
    match = _BAD_CHAR.search(value)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        return f"contains a NUL character (at character {match.start() + 1}), which cannot be stored"
    return (f"contains a lone surrogate {ascii(char)} at character {match.start() + 1} "
            "(half of a character such as an emoji; not valid Unicode)")


def check_text(value: Any, field: str = "") -> None:
    """Raise RowError(field=path) at the first string, anywhere inside `value` (keys included),
    that holds a lone surrogate or NUL."""
    if isinstance(value, str):
        reason = bad_char_reason(value)
        if reason:
            raise RowError(reason, field=field or None)
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{field}.{key}" if field else str(key)
            if isinstance(key, str) and bad_char_reason(key):
                raise RowError(f"key {bad_char_reason(key)}", field=field or None)
            check_text(item, path)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_text(item, f"{field}[{i}]")


# --- JSON ------------------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"[\[{][\]}]")
_LONG_NUMBER = re.compile(r"[-+0-9.eE]{%d,}" % (MAX_JSON_NUMBER_CHARS + 1))


class JSONSyntaxError(RowError):
    """Text that is not JSON at all (as opposed to JSON past one of the limits); `detail` is the
    parser's message with the place, e.g. "Expecting value at column 7"."""

    def __init__(self, detail: str, **where: Any):
        self.detail = detail
        super().__init__(f"invalid JSON ({detail})", **where)


def _too_deep(brackets: str, limit: int) -> bool:
    """Whether a string of brackets nests deeper than `limit`. Each pass drops every innermost
    pair (one level) in C; only what is left after `limit` passes (deep or unbalanced input) is
    counted bracket by bracket. Never recursive, so any depth is measured safely."""
    rest = brackets
    for _ in range(limit):
        if not rest:
            return False
        rest = _INNERMOST.sub("", rest)
    if not rest:
        return False
    depth = 0
    for bracket in brackets:
        depth += 1 if bracket in "[{" else -1
        if depth > limit:
            return True
    return False


def json_limit_reason(text: str) -> str | None:
    """Why `text` is past the JSON limits (nesting deeper than MAX_JSON_DEPTH, a number literal
    longer than MAX_JSON_NUMBER_CHARS; brackets and digits inside strings do not count), or None."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH and len(text) <= MAX_JSON_NUMBER_CHARS:
        return None
    bare = _JSON_STRING.sub('""', text)
    if _too_deep(_NOT_BRACKET.sub("", bare), MAX_JSON_DEPTH):
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    long_number = _LONG_NUMBER.search(bare)
    if long_number:
        return f"a number {len(long_number.group())} characters long (at most {MAX_JSON_NUMBER_CHARS})"
    return None


def _json_hooks(constants: bool) -> dict[str, Any]:
    if constants:
        return {}

    def parse_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise RowError(f"the number {literal[:40]} is out of range")
        return value

    def parse_constant(name: str) -> float:
        raise RowError(f"{name} is not a JSON number")

    return {"parse_float": parse_float, "parse_constant": parse_constant}


def load_json(text: str | bytes, *, file: Path | str | None = None, line: int | None = None,
              field: str | None = None, unit: str = "line", constants: bool = False) -> Any:
    """`text` parsed as JSON within the limits (MAX_JSON_DEPTH, MAX_JSON_NUMBER_CHARS, finite
    numbers unless `constants`); RowError naming `file`, `line` and `field` otherwise
    (JSONSyntaxError for text that is not JSON)."""
    def refuse(reason: str, kind: type[RowError] = RowError) -> RowError:
        return kind(reason, file=file, line=line, field=field, unit=unit)

    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise refuse(f"invalid UTF-8 (byte {exc.start + 1})") from None
    reason = json_limit_reason(text)
    if reason:
        raise refuse(reason)
    try:
        return json.loads(text, **_json_hooks(constants))
    except RowError as exc:
        raise refuse(exc.reason) from None
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if "\n" in text.strip() else f"column {exc.colno}"
        raise refuse(f"{exc.msg} at {at}", JSONSyntaxError) from None
    except (ValueError, RecursionError):  # not expected within the limits; still one line, never a crash
        raise refuse(f"JSON this server cannot read (nested deeper than {MAX_JSON_DEPTH} levels "
                     f"or a number longer than {MAX_JSON_NUMBER_CHARS} characters)") from None


# --- field types -----------------------------------------------------------------------------

def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    for kind, name in ((str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):  # subclasses too (Django's JSONString is a str)
            return name
    return type(value).__name__


def _string(max_length: int | None, *, non_empty: bool, strip: bool, numbers_ok: bool, optional: bool = False):
    def check(value: Any) -> str | None:
        if value is None or (optional and strip and value == ""):
            if optional:
                return None
            raise ValueError("missing field")
        if numbers_ok and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type_name(value)}")
        if strip:
            value = value.strip()
        if non_empty and not value.strip():
            raise ValueError("must not be empty")
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"{len(value)} characters, more than the {max_length} this field holds")
        return value
    return BeforeValidator(check)


def Text(max_length: int | None = None, *, non_empty: bool = False, optional: bool = False):  # noqa: N802
    """A JSON string field (no coercion), optionally non-empty and bounded; optional: null allowed."""
    check = _string(max_length, non_empty=non_empty, strip=False, numbers_ok=False, optional=optional)
    return Annotated[str | None, check] if optional else Annotated[str, check]


def Label(max_length: int, *, optional: bool = False):  # noqa: N802
    """A short non-empty name from a table cell or JSON: strings (stripped) or integers, bounded;
    optional: empty or null gives None."""
    check = _string(max_length, non_empty=True, strip=True, numbers_ok=True, optional=optional)
    return Annotated[str | None, check] if optional else Annotated[str, check]


def _present(value: Any) -> Any:
    if value is None:
        raise ValueError("missing field")
    return value


def Required(tp):  # noqa: N802
    """`tp` where null reads as a missing field (as a missing key does)."""
    return Annotated[tp, BeforeValidator(_present)]


def _identifier(value: Any) -> str | int:
    if value is None:
        raise ValueError("missing field")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a string or an integer, got {type_name(value)}")
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    if len(str(value)) > 200:
        raise ValueError(f"{len(str(value))} characters, more than the 200 an id holds")
    return value


# An id as the source wrote it: a non-empty string or an integer, at most 200 characters.
Identifier = Annotated[str | int, BeforeValidator(_identifier)]


def _number(*, integer: bool, strings_ok: bool, low: float | None = None, high: float | None = None,
            optional: bool = False):
    def check(value: Any) -> float | int | None:
        if value is None or (strings_ok and isinstance(value, str) and not value.strip()):
            if optional:
                return None
            raise ValueError("missing field")
        if isinstance(value, str) and strings_ok:
            text = value.strip()
            try:
                value = int(text) if integer else float(text)
            except ValueError:
                raise ValueError(f"{value!r} is not {'a whole number' if integer else 'a number'}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {type_name(value)}")
        if integer:
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError(f"{value!r} is not a whole number")
                value = int(value)
            if abs(value) > MAX_INT:
                raise ValueError(f"a {len(str(abs(value)))}-digit number is out of range")
        else:
            try:
                value = float(value)
            except OverflowError:
                raise ValueError(f"a {len(str(abs(value)))}-digit number is out of range") from None
            if not math.isfinite(value):
                raise ValueError(f"must be a finite number, not {value!r}")
        if low is not None and value < low:
            raise ValueError(f"must be at least {low:g}")
        if high is not None and value > high:
            raise ValueError(f"must be at most {high:g}")
        return value
    return BeforeValidator(check)


def Number(*, strings_ok: bool = False, low: float | None = None, high: float | None = None,  # noqa: N802
           optional: bool = False):
    """A finite float (NaN, infinities, booleans and integers too large for a float refused);
    strings_ok: numeric strings too (CSV cells)."""
    check = _number(integer=False, strings_ok=strings_ok, low=low, high=high, optional=optional)
    return Annotated[float | None, check] if optional else Annotated[float, check]


def Integer(*, strings_ok: bool = False, low: int | None = None, high: int | None = None,  # noqa: N802
            optional: bool = False):
    """A whole number that fits a 32-bit column."""
    check = _number(integer=True, strings_ok=strings_ok, low=low, high=high, optional=optional)
    return Annotated[int | None, check] if optional else Annotated[int, check]


class Row(BaseModel):
    """Base of every row model: unknown keys are allowed (kept by the caller when it wants them)."""

    model_config = ConfigDict(extra="allow")


# --- errors ----------------------------------------------------------------------------------

def _field_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def format_first_error(exc: ValidationError) -> tuple[str | None, str]:
    """(field path such as "profile[2].text", reason) of a pydantic error's first entry."""
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], error["loc"]
    if kind == "missing":
        reason = "missing field"
    elif kind == "value_error":
        reason = str(error["ctx"]["error"])
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        reason = f"expected an object, got {type_name(error.get('input'))}"
    elif kind == "list_type":
        reason = f"expected a list, got {type_name(error.get('input'))}"
    else:
        reason = error["msg"]
    return (_field_path(loc) or None), reason


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], row: Any, *, file: Path | str | None = None, line: int | None = None,
             unit: str = "line") -> M:
    """`row` checked as `model` (every string in it first checked by check_text), or RowError."""
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type_name(row)}", file=file, line=line, unit=unit)
    try:
        check_text(row)
    except RowError as exc:
        raise RowError(exc.reason, file=file, line=line, field=exc.field, unit=unit) from None
    try:
        return model.model_validate(row)
    except ValidationError as exc:
        field, reason = format_first_error(exc)
        raise RowError(reason, file=file, line=line, field=field, unit=unit) from None


def parse(tp: Any, value: Any, *, field: str) -> Any:
    """One value (a request blob or a part of one) checked as the type `tp` (e.g. Number(low=0));
    RowError's field is `field` plus the path inside the value."""
    from pydantic import TypeAdapter

    try:
        check_text(value, field)
        return TypeAdapter(tp).validate_python(value)
    except ValidationError as exc:
        path, reason = format_first_error(exc)
        raise RowError(reason, field=field + (f".{path}" if path else "")) from None
