"""Raw rows of a data file, streamed: JSON lines line by line, a JSON array element by element,
Parquet batch by batch, so memory stays flat whatever the file size. Each row comes with its
line (or Parquet row) number; a problem is a RowError naming the file and line.

Shared by the benchmark reader (formats) and the PersonalRewardBench reader (formats_prb).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .ml.rows import RowError as FormatError

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
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            truncated = not raw.endswith(b"\n") and _at_eof(fh)
            hint = " (the file ends in the middle of this line: truncated?)" if truncated else ""
            raise FormatError(f"invalid JSON: {exc.msg} at column {exc.colno}{hint}", file=file, line=line_no) from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise FormatError(f"invalid JSON: {exc}", file=file, line=line_no) from None
        yield line_no, value, "line"


def _at_eof(fh) -> bool:
    pos = fh.tell()
    more = fh.read(1)
    fh.seek(pos)
    return not more


def _decoded_chunks(fh, file: Path) -> Iterator[str]:
    """Decode a binary stream as UTF-8 chunk by chunk, naming the line of a bad byte."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
    newlines = 0
    while True:
        chunk = fh.read(_CHUNK)
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            line = newlines + chunk[: max(exc.start, 0)].count(b"\n") + 1
            raise FormatError("invalid UTF-8", file=file, line=line) from None
        newlines += chunk.count(b"\n")
        if text:
            yield text
        if not chunk:
            return


_WS = re.compile(r"[ \t\n\r]*")


def _iter_json_array(fh, file: Path) -> Iterator[tuple[int, Any, str]]:
    """Stream the elements of a top-level JSON array, with the line each starts on.

    Keeps a text buffer and an offset into it; consumed text is dropped only when more
    is read, so each byte is copied a bounded number of times."""
    decoder = json.JSONDecoder()
    chunks = _decoded_chunks(fh, file)
    buf, pos, line, eof = "", 0, 1, False

    def fill() -> bool:
        nonlocal buf, pos, eof
        chunk = None if eof else next(chunks, None)
        if chunk is None:
            eof = True
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    def skip_ws() -> bool:
        """Move past whitespace, counting lines; False at the end of input."""
        nonlocal pos, line
        while True:
            end = _WS.match(buf, pos).end()
            line += buf.count("\n", pos, end)
            pos = end
            if pos < len(buf) or not fill():
                return pos < len(buf)

    def expect(chars: str, what: str) -> str:
        nonlocal pos
        if not skip_ws():
            raise FormatError(f"file ends where {what} was expected (truncated?)", file=file, line=line)
        found = buf[pos]
        if found not in chars:
            raise FormatError(f"invalid JSON: expected {what}, found {found!r}", file=file, line=line)
        pos += 1
        return found

    expect("[", "'['")
    if skip_ws() and buf[pos] == "]":
        pos += 1
    else:
        while True:
            if not skip_ws():
                raise FormatError("file ends where a value was expected (truncated?)", file=file, line=line)
            start_line = line
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except ValueError as exc:
                    if not isinstance(exc, json.JSONDecodeError):  # an integer of more than 4300 digits
                        raise FormatError(f"invalid JSON: {exc}", file=file, line=start_line) from None
                    if fill():
                        continue
                    err_line = start_line + buf.count("\n", pos, exc.pos)
                    hint = " (the file ends inside this value: truncated?)" if exc.pos >= len(buf.rstrip()) else ""
                    raise FormatError(f"invalid JSON: {exc.msg}{hint}", file=file, line=err_line) from None
                # A number at the very end of the buffer may continue in the next chunk.
                if end == len(buf) and fill():
                    continue
                break
            line += buf.count("\n", pos, end)
            pos = end
            yield start_line, value, "line"
            if expect(",]", "',' or ']'") == "]":
                break
    if skip_ws():
        raise FormatError("unexpected data after the closing ']'", file=file, line=line)


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


