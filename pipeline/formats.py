"""Reading and writing benchmark files in the published Personalized-RewardBench schema.

Plain Python, no Django. Files are streamed: a JSONL file is read line by line, a JSON
array element by element and a Parquet file batch by batch, so memory stays flat
whatever the file size. Every problem is raised as a FormatError that names the file,
the line (or Parquet row) and the field.

Row schema (LaMP-QA rows are the same without chosen/rejected):
    id, question, profile [{id, text, category}], rubric_aspects [{aspect, evidence, reason}],
    narrative, category, chosen, rejected
Unknown top-level keys are kept in `extra` and written back on export.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .domains import SUBSET_NAMES, SUBSET_TO_DOMAIN, domain_from_label

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# JSON files that sit beside the data in published dataset folders but hold no rows.
NON_DATA_FILES = {"metadata.json", "dataset_info.json", "dataset_dict.json", "state.json"}
METADATA_FILE = "metadata.json"
KNOWN_FIELDS = ("id", "question", "profile", "rubric_aspects", "narrative", "category", "chosen", "rejected", "plan")
HISTORY_FIELDS = ("id", "user_id", "question", "history", "category", "chosen", "rejected")
PROFILE_RUBRIC = "profile_rubric"  # Personalized RewardBench / LaMP-QA rows
PAIR_HISTORY = "pair_history"  # PersonalRewardBench-style rows (PRISM, Chatbot Arena)
_CHUNK = 1 << 18


class FormatError(ValueError):
    """A benchmark file that cannot be imported; the message names file, line and field."""

    def __init__(self, message: str, *, file: Path | str | None = None, line: int | None = None,
                 field: str | None = None, unit: str = "line"):
        self.file, self.line, self.field, self.unit, self.reason = file, line, field, unit, message
        where = []
        if file is not None:
            where.append(str(file))
        if line is not None:
            where.append(f"{unit} {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


@dataclass(frozen=True)
class Record:
    """One validated row, in source order (`position` counts from 0 across all files)."""

    position: int
    source_id: str
    source_id_is_int: bool
    domain: str
    category: str
    question: str
    profile: list[dict[str, Any]]
    rubric_aspects: list[dict[str, Any]]
    narrative: str
    chosen: str | None
    rejected: str | None
    extra: dict[str, Any] = field(default_factory=dict)
    # PersonalRewardBench-style rows: the user's earlier preferences instead of posts and rubric.
    user_id: str = ""
    history: list[dict[str, Any]] | None = None
    # Planner aspects for the `plan` setting (strings), written as the row's `plan` field when present.
    plan: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return PAIR_HISTORY if self.history is not None else PROFILE_RUBRIC

    def to_row(self) -> dict[str, Any]:
        return published_row(
            source_id=self.source_id, source_id_is_int=self.source_id_is_int, question=self.question,
            profile=self.profile, rubric_aspects=self.rubric_aspects, narrative=self.narrative,
            category=self.category, chosen=self.chosen, rejected=self.rejected, extra=self.extra,
            user_id=self.user_id, history=self.history, plan=self.plan,
        )


def published_row(*, source_id: str, source_id_is_int: bool, question: str, profile: list, rubric_aspects: list,
                  narrative: str, category: str, chosen: str | None, rejected: str | None,
                  extra: dict | None = None, user_id: str = "",
                  history: list | None = None, plan: list[str] | None = None) -> dict[str, Any]:
    """The row as its schema writes it (chosen/rejected left out when None): the published
    Personalized-RewardBench schema, or the pair-history schema when there is a history.
    Planner aspects go in a `plan` field (a list of strings), only when there are some, so a
    benchmark without plans exports (and hashes) exactly as before."""
    row: dict[str, Any] = {"id": int(source_id) if source_id_is_int else source_id}
    if history is not None:
        row.update(user_id=user_id, question=question, history=history, category=category)
    else:
        row.update(question=question, profile=profile, rubric_aspects=rubric_aspects, narrative=narrative,
                   category=category)
    if chosen is not None:
        row["chosen"] = chosen
    if rejected is not None:
        row["rejected"] = rejected
    if plan:
        row["plan"] = list(plan)
    row.update(extra or {})
    return row


def row_digest_line(row: dict[str, Any]) -> bytes:
    """Canonical bytes of a row for content hashing (key order and spacing do not matter)."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class ContentHasher:
    """sha256 over the canonical rows in order: the same content hashes the same,
    whichever format or layout it came in."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, row: dict[str, Any]) -> None:
        self._sha.update(row_digest_line(row))

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


# --- locating files -------------------------------------------------------------------

def list_source_files(path: Path) -> list[tuple[Path, str | None]]:
    """The data files under `path` with the domain their subset name implies (or None).

    A folder is read recursively in sorted order; a file's subset is taken from the
    nearest folder or file-name prefix that names one (Art_and_Entertainment/...,
    Society_and_Culture-test.parquet, ...)."""
    path = Path(path)
    if not path.exists():
        raise FormatError("no such file or folder", file=path)
    if path.is_file():
        if path.suffix.lower() not in DATA_SUFFIXES:
            raise FormatError(f"unsupported file type '{path.suffix}' (expected {', '.join(DATA_SUFFIXES)})", file=path)
        return [(path, _subset_domain(path.parts))]
    files = []
    for candidate in sorted(path.rglob("*")):
        rel = candidate.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or not candidate.is_file():
            continue
        if candidate.suffix.lower() in DATA_SUFFIXES and candidate.name not in NON_DATA_FILES:
            files.append((candidate, _subset_domain(rel.parts)))
    if not files:
        raise FormatError(f"folder holds no {', '.join(DATA_SUFFIXES)} files", file=path)
    return files


def _subset_domain(parts: Iterable[str]) -> str | None:
    for part in reversed(list(parts)):
        for subset, domain in SUBSET_TO_DOMAIN.items():
            if part == subset or part.startswith(subset + "-") or part.startswith(subset + ".") \
                    or part.startswith(subset + "_"):
                return domain
    return None


def read_metadata(path: Path) -> dict[str, Any]:
    """A folder's metadata.json (an object), or {} when there is none."""
    meta_file = Path(path) / METADATA_FILE
    if not Path(path).is_dir() or not meta_file.exists():
        return {}
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"not valid UTF-8 JSON: {exc}", file=meta_file) from None
    if not isinstance(meta, dict):
        raise FormatError("expected a JSON object", file=meta_file)
    return meta


# --- raw rows --------------------------------------------------------------------------

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
            yield line_no, json.loads(text), "line"
        except json.JSONDecodeError as exc:
            truncated = not raw.endswith(b"\n") and _at_eof(fh)
            hint = " (the file ends in the middle of this line: truncated?)" if truncated else ""
            raise FormatError(f"invalid JSON: {exc.msg} at column {exc.colno}{hint}", file=file, line=line_no) from None


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
                except json.JSONDecodeError as exc:
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


# --- validation -------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


class _RowChecker:
    def __init__(self, row: Any, file: Path, line: int, unit: str):
        self.row, self.file, self.line, self.unit = row, file, line, unit

    def fail(self, message: str, field_name: str | None = None) -> FormatError:
        return FormatError(message, file=self.file, line=self.line, field=field_name, unit=self.unit)

    def value(self, obj: dict, key: str, path: str, *, required: bool = True) -> Any:
        if key not in obj or obj[key] is None:
            if required:
                raise self.fail("missing field", path)
            return None
        return obj[key]

    def string(self, obj: dict, key: str, path: str, *, required: bool = True, non_empty: bool = False) -> str | None:
        value = self.value(obj, key, path, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(f"expected a string, got {_type_name(value)}", path)
        if non_empty and not value.strip():
            raise self.fail("must not be empty", path)
        return value

    def identifier(self, obj: dict, key: str, path: str) -> str | int:
        value = self.value(obj, key, path)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(f"expected a string or an integer, got {_type_name(value)}", path)
        if isinstance(value, str) and not value.strip():
            raise self.fail("must not be empty", path)
        return value

    def object_list(self, obj: dict, key: str, path: str) -> list[dict]:
        value = self.value(obj, key, path)
        if not isinstance(value, list):
            raise self.fail(f"expected a list, got {_type_name(value)}", path)
        for i, element in enumerate(value):
            if not isinstance(element, dict):
                raise self.fail(f"expected an object, got {_type_name(element)}", f"{path}[{i}]")
        return value


def validate_row(row: Any, *, file: Path, line: int, unit: str = "line", position: int,
                 subset_domain: str | None, require_pair: bool = True) -> Record:
    """Check one raw row against the schema and return it as a Record."""
    check = _RowChecker(row, file, line, unit)
    if not isinstance(row, dict):
        raise check.fail(f"expected a JSON object per row, got {_type_name(row)}")
    if "history" in row:
        return _validate_history_row(check, row, position=position, subset_domain=subset_domain)
    source_id = check.identifier(row, "id", "id")
    question = check.string(row, "question", "question", non_empty=True)

    profile = check.object_list(row, "profile", "profile")
    for i, post in enumerate(profile):
        check.identifier(post, "id", f"profile[{i}].id")
        check.string(post, "text", f"profile[{i}].text")
        check.string(post, "category", f"profile[{i}].category", required=False)

    aspects = check.object_list(row, "rubric_aspects", "rubric_aspects")
    for i, aspect in enumerate(aspects):
        check.string(aspect, "aspect", f"rubric_aspects[{i}].aspect", non_empty=True)
        check.string(aspect, "evidence", f"rubric_aspects[{i}].evidence", required=False)
        check.string(aspect, "reason", f"rubric_aspects[{i}].reason", required=False)

    narrative = check.string(row, "narrative", "narrative")
    domain, category = _domain_of(check, row, subset_domain)

    chosen = rejected = None
    if require_pair:
        chosen = check.string(row, "chosen", "chosen", non_empty=True)
        rejected = check.string(row, "rejected", "rejected", non_empty=True)
        if chosen.strip() == rejected.strip():
            raise check.fail("chosen and rejected are identical", "rejected")

    plan = row.get("plan", [])
    if plan is None:
        plan = []
    if not isinstance(plan, list) or not all(isinstance(a, str) and a.strip() for a in plan):
        raise check.fail("plan must be a list of non-empty strings (planner aspects)", "plan")
    extra = {k: v for k, v in row.items() if k not in KNOWN_FIELDS}
    return Record(
        position=position, source_id=str(source_id), source_id_is_int=isinstance(source_id, int),
        domain=domain, category=category, question=question, profile=profile, rubric_aspects=aspects,
        narrative=narrative, chosen=chosen, rejected=rejected, extra=extra, plan=plan,
    )


def _validate_history_row(check: "_RowChecker", row: dict, *, position: int, subset_domain: str | None) -> Record:
    """A PersonalRewardBench-style row: a user's earlier chosen/rejected pairs and a new pair."""
    source_id = check.identifier(row, "id", "id")
    user_id = check.identifier(row, "user_id", "user_id")
    question = check.string(row, "question", "question", non_empty=True)
    history = check.object_list(row, "history", "history")
    for i, past in enumerate(history):
        for key in ("prompt", "chosen", "rejected"):
            check.string(past, key, f"history[{i}].{key}", non_empty=True)
    domain, category = _domain_of(check, row, subset_domain)
    chosen = check.string(row, "chosen", "chosen", non_empty=True)
    rejected = check.string(row, "rejected", "rejected", non_empty=True)
    if chosen.strip() == rejected.strip():
        raise check.fail("chosen and rejected are identical", "rejected")
    return Record(position=position, source_id=str(source_id), source_id_is_int=isinstance(source_id, int),
                  domain=domain, category=category, question=question, profile=[], rubric_aspects=[], narrative="",
                  chosen=chosen, rejected=rejected, extra={k: v for k, v in row.items() if k not in HISTORY_FIELDS},
                  user_id=str(user_id), history=history)


def _domain_of(check: "_RowChecker", row: dict, subset_domain: str | None) -> tuple[str, str]:
    category = check.string(row, "category", "category", required=subset_domain is None)
    if category is None:
        return subset_domain, SUBSET_NAMES[subset_domain]
    domain = domain_from_label(category)
    if domain is None:
        raise check.fail(f"unknown category {category!r} (expected one of {', '.join(SUBSET_NAMES.values())})",
                         "category")
    return domain, category


def read_records(path: Path, *, require_pair: bool = True, split: str = "") -> Iterator[Record]:
    """Validated records of a file or folder, in order; duplicate ids are an error.
    `split` keeps only files whose path below `path` names it (e.g. "test")."""
    seen: dict[str, tuple[Path, int]] = {}
    position, kind = 0, None
    files = list_source_files(Path(path))
    if split:
        files = [(f, d) for f, d in files if split in str(f.relative_to(path) if Path(path).is_dir() else f.name)]
        if not files:
            raise FormatError(f"no data file names the split {split!r}", file=path)
    for file, subset_domain in files:
        for line, row, unit in iter_raw_rows(file):
            record = validate_row(row, file=file, line=line, unit=unit, position=position,
                                  subset_domain=subset_domain, require_pair=require_pair)
            if kind is None:
                kind = record.kind
            elif record.kind != kind:
                raise FormatError(f"mixes {kind.replace('_', '-')} rows with {record.kind.replace('_', '-')} rows; "
                                  "a benchmark holds one kind", file=file, line=line, unit=unit)
            if record.source_id in seen:
                first_file, first_line = seen[record.source_id]
                raise FormatError(f"duplicate id {record.source_id!r} (first seen in {first_file}, {unit} {first_line})",
                                  file=file, line=line, field="id", unit=unit)
            seen[record.source_id] = (file, line)
            position += 1
            yield record


# --- writing ----------------------------------------------------------------------------

def write_rows(rows: Iterable[dict[str, Any]], out: Path) -> int:
    """Write rows as JSONL, a JSON array or Parquet (by the file's suffix); returns the count.

    Written to a temporary file first and renamed, so a failed export leaves no half file."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise FormatError(f"unsupported output type '{out.suffix}' (expected {', '.join(DATA_SUFFIXES)})", file=out)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        if suffix == ".parquet":
            count = _write_parquet(rows, tmp)
        else:
            count = _write_json(rows, tmp, array=suffix == ".json")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _write_json(rows: Iterable[dict[str, Any]], tmp: Path, *, array: bool) -> int:
    count = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        if array:
            fh.write("[")
        for row in rows:
            text = json.dumps(row, ensure_ascii=False)
            if array:
                fh.write(("\n" if count == 0 else ",\n") + text)
            else:
                fh.write(text + "\n")
            count += 1
        if array:
            fh.write("\n]\n")
    return count


def _write_parquet(rows: Iterable[dict[str, Any]], tmp: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, schema, batch, count = None, None, [], 0

    def flush() -> None:
        nonlocal writer, schema
        if not batch:
            return
        if schema is None:
            schema = pa.Table.from_pylist(batch).schema
            writer = pq.ParquetWriter(tmp, schema)
        keys = {key for row in batch for key in row}
        missing = keys - set(schema.names)
        if missing:
            raise FormatError(f"rows carry fields the first rows did not ({', '.join(sorted(missing))}); "
                              "export as .jsonl instead", file=tmp)
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        batch.clear()

    try:
        for row in rows:
            batch.append(row)
            count += 1
            if len(batch) >= 512:
                flush()
        flush()
    except pa.ArrowException as exc:
        # Parquet needs one type per column: ids that are numbers in some rows and
        # strings in others, say, cannot be written. JSONL keeps them as they are.
        raise FormatError(f"rows do not fit one Parquet schema ({exc}); export as .jsonl instead", file=tmp) from None
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pq.write_table(pa.table({name: pa.array([], pa.string()) for name in KNOWN_FIELDS}), tmp)
    return count
