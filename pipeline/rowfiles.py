"""Raw rows of a data file, streamed: JSON lines line by line, a JSON array element by element
(ijson), Parquet batch by batch, so memory stays flat whatever the file size. Each row comes with its
line (or Parquet row) number; a problem is a RowError naming the file and line.

Shared by the benchmark reader (formats) and the PersonalRewardBench reader (formats_prb).
JSON is read within `rows.load_json`'s limits: nesting at most MAX_JSON_DEPTH (a JSON line is
scanned before it is parsed; an array element is refused at the first event past the depth).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prblib.rows import MAX_JSON_DEPTH, JSONSyntaxError, load_json
from prblib.rows import RowError as FormatError

_CHUNK = 1 << 18


def iter_raw_rows(file: Path) -> Iterator[tuple[int, Any, str]]:
    """(line or row number, parsed row, unit) for every row of one file."""
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet(file)
        return
    with open(file, "rb") as fh:
        first = _first_significant_byte(fh)
        fh.seek(0)
        if suffix == ".json" and first == b"[":
            yield from _iter_json_array(fh, file)
        else:
            yield from _iter_jsonl(fh, file)


def _first_significant_byte(fh) -> bytes:
    head = fh.read(4096).lstrip(codecs.BOM_UTF8).lstrip()
    return head[:1]


def _iter_jsonl(fh, file: Path) -> Iterator[tuple[int, Any, str]]:
    for line_no, raw in enumerate(fh, start=1):
        if line_no == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"invalid UTF-8 (byte {exc.start + 1} of the line)", file=file, line=line_no) from None
        if not text.strip():
            continue
        try:
            # NaN as the source wrote it: the row readers check every number and name the field.
            value = load_json(text, file=file, line=line_no, constants=True)
        except JSONSyntaxError as exc:
            truncated = not raw.endswith(b"\n") and _at_eof(fh)
            hint = " (the file ends in the middle of this line: truncated?)" if truncated else ""
            raise FormatError(f"invalid JSON: {exc.detail}{hint}", file=file, line=line_no) from None
        yield line_no, value, "line"


def _at_eof(fh) -> bool:
    pos = fh.tell()
    more = fh.read(1)
    fh.seek(pos)
    return not more


def _iter_json_array(fh, file: Path) -> Iterator[tuple[int, Any, str]]:
    """Stream the elements of a top-level JSON array with ijson, with the line each starts on.

    ijson's pure-Python backend, on purpose: its C backend (yajl2_c, ijson 3.6) turns a lone
    surrogate escape into '?' (the JSONL reader keeps it and refuses it with the field named),
    crashes the process on an integer of more than 4300 digits and cannot read integers beyond
    64 bits as floats. The push interface (`parse_coro`) is fed the file one line at a time (a
    line longer than 256 KiB in pieces), so memory stays bounded by the longest element and an
    event's line is the line of the piece that produced it: an element's line is the line of
    its opening '{' (or of the value itself), an error's line the line of the offending byte.
    Elements are built from the events by ijson's ObjectBuilder, numbers as int or float (as
    json.loads), NaN and Infinity refused (not JSON). The basic events are read (no prefixes:
    ijson's prefixed events cost time quadratic in the depth, 90 s for one 50,000-deep
    element), and nesting past MAX_JSON_DEPTH (the array counts as one level) is refused at
    the first event past it."""
    import ijson

    events = ijson.sendable_list()
    parser = ijson.get_backend("python").basic_parse_coro(events, use_float=True)
    line, builder, depth, start_line = 1, None, 0, 1

    def refuse(exc: Exception, at_end: bool) -> FormatError:
        cause = exc.__cause__ or exc.__context__ or (exc.args[0] if exc.args else None)
        if isinstance(cause, UnicodeDecodeError):
            return FormatError("invalid UTF-8", file=file, line=line)
        message = " ".join(str(exc).split())
        symbol = re.fullmatch(r"Unexpected symbol '(.*)' at \d+", message)
        if symbol:  # ijson's offset counts characters from the start of the file; the line says more
            message = f"unexpected {_short(symbol.group(1), 40)!r}"
        if at_end and isinstance(exc, ijson.IncompleteJSONError):
            return FormatError("file ends inside the array (truncated?)", file=file, line=line)
        if "Additional data" in message:
            return FormatError("unexpected data after the closing ']'", file=file, line=line)
        return FormatError(f"invalid JSON: {message}", file=file, line=line)

    def drain() -> Iterator[tuple[int, Any, str]]:
        nonlocal builder, depth, start_line
        for event, value in events:  # depth: 1 inside the array, 2 inside one of its elements...
            if event in ("start_map", "start_array"):
                depth += 1
                if depth > MAX_JSON_DEPTH:
                    raise FormatError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", file=file, line=line)
                if depth == 2:
                    builder, start_line = ijson.ObjectBuilder(), line
            elif event in ("end_map", "end_array"):
                depth -= 1
            elif depth == 1:
                yield line, value, "line"  # a scalar element: the reader refuses it by its line
                continue
            if builder is not None:
                builder.event(event, value)
                if depth == 1:
                    yield start_line, builder.value, "line"
                    builder = None
        del events[:]

    finished = False
    try:
        first = True
        while chunk := fh.read(_CHUNK):
            if first:
                chunk, first = chunk.removeprefix(codecs.BOM_UTF8), False
            pieces = chunk.split(b"\n")
            for i, piece in enumerate(pieces):
                newline = i < len(pieces) - 1
                if newline:
                    piece += b"\n"
                elif not piece:
                    continue  # ijson reads an empty piece as the end of the input
                try:
                    parser.send(piece)
                except ijson.JSONError as exc:
                    raise refuse(exc, at_end=False) from None
                except ValueError as exc:
                    raise FormatError(f"invalid JSON: {exc}", file=file, line=line) from None
                yield from drain()
                line += newline
        finished = True
        try:
            parser.close()
        except ijson.JSONError as exc:
            raise refuse(exc, at_end=True) from None
        yield from drain()
    finally:
        if not finished:  # stopped early (a bad row, or the caller stopped reading): end ijson quietly
            try:
                parser.close()
            except (ijson.JSONError, ValueError):
                pass


def _iter_parquet(file: Path) -> Iterator[tuple[int, Any, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"not a readable Parquet file (truncated?): {exc}", file=file) from None
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=512):
            for value in batch.to_pylist():
                row += 1
                yield row, value, "row"
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"cannot read Parquet data: {exc}", file=file, line=row + 1, unit="row") from None


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
