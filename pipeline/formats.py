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

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import formats_prb
from .domains import SUBSET_NAMES, SUBSET_TO_DOMAIN, domain_from_label
from prblib.files import atomic_path, atomic_write
from prblib.rows import (Identifier, JSONSyntaxError, Required, Row, RowError, Text, check_text, load_json, read_text,
                      type_name, validate)
from .rowfiles import iter_raw_rows  # noqa: F401  (part of this module's interface)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# JSON files that sit beside the data in published dataset folders but hold no rows.
NON_DATA_FILES = {"metadata.json", "dataset_info.json", "dataset_dict.json", "state.json"}
METADATA_FILE = "metadata.json"
KNOWN_FIELDS = ("id", "question", "profile", "rubric_aspects", "narrative", "category", "chosen", "rejected", "plan")
HISTORY_FIELDS = ("id", "user_id", "question", "history", "category", "chosen", "rejected")
PROFILE_RUBRIC = "profile_rubric"  # Personalized RewardBench / LaMP-QA rows
PAIR_HISTORY = "pair_history"  # PersonalRewardBench-style rows (PRISM, Chatbot Arena)
_CHUNK = 1 << 18


# Every problem is one RowError naming file, line (or Parquet row) and field; FormatError is its
# name here, kept for the callers that catch it.
FormatError = RowError

# Bounds of the BenchmarkItem columns these fields land in (tests pin them to the model).
SOURCE_ID_MAX, CATEGORY_MAX, USER_ID_MAX = 200, 100, 200


class Post(Row):
    id: Identifier
    text: Text()
    category: Text(optional=True) = None


class Aspect(Row):
    aspect: Text(non_empty=True)
    evidence: Text(optional=True) = None
    reason: Text(optional=True) = None


class PastPair(Row):
    prompt: Text(non_empty=True)
    chosen: Text(non_empty=True)
    rejected: Text(non_empty=True)


class _PairRow(Row):
    id: Identifier
    question: Text(non_empty=True)
    category: Text(CATEGORY_MAX, optional=True) = None
    chosen: Text(non_empty=True, optional=True) = None
    rejected: Text(non_empty=True, optional=True) = None


class ProfileRubricRow(_PairRow):
    """A Personalized-RewardBench (or LaMP-QA, without chosen/rejected) row."""

    profile: Required(list[Post])
    rubric_aspects: Required(list[Aspect])
    narrative: Text()


class PairHistoryRow(_PairRow):
    """A PersonalRewardBench-style row: a user's earlier preferences instead of posts and rubric."""

    user_id: Identifier
    history: Required(list[PastPair])


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
    # PersonalRewardBench rows: "test" rows are items, "train"/"val" rows history material.
    split: str = ""
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
    Personalized-RewardBench schema, the pair-history schema when there is a history, or a
    PersonalRewardBench source row exactly as it was read. Planner aspects go in a `plan` field
    (a list of strings), only when there are some, so a benchmark without plans exports (and
    hashes) exactly as before."""
    source_row = formats_prb.prb_row(extra or {})
    if source_row is not None:
        return source_row
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


def record_digest_row(record: Record) -> dict[str, Any]:
    """What a record contributes to the content hash: its row, plus the sampled history of a
    PersonalRewardBench test row (which depends on the import's --history-size and --seed)."""
    row = record.to_row()
    if record.split == "test":
        row = {"row": row, "history": record.history}
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


# The splits a benchmark import chooses among, and the words a file's path may name them by.
IMPORT_SPLITS = ("test", "train", "val")
_SPLIT_WORDS = {"test": "test", "train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val"}


def file_split(relative: Path) -> str | None:
    """The split (test, train or val) a data file's path names, or None: the nearest part that
    names exactly one (the file name without its suffix first, then its folders), read as words
    split at any character other than a letter or digit ("test-00000-of-00001.parquet",
    "Art_and_Entertainment/train.jsonl", "validation/part-0.json"; "contest.jsonl" names none)."""
    parts = list(Path(relative).parts)
    if parts:
        parts[-1] = Path(parts[-1]).stem
    for part in reversed(parts):
        named = {_SPLIT_WORDS[word] for word in re.split(r"[^a-z0-9]+", part.lower()) if word in _SPLIT_WORDS}
        if len(named) == 1:
            return named.pop()
    return None


def choose_split(path: Path, files: list[tuple[Path, str | None]],
                 split: str | None) -> tuple[list[tuple[Path, str | None]], str]:
    """(the files of one split, a line saying what was left out or ""), for importing `path`.

    split None: the test split when any file names a split (every file must then name one), all
    files when none does. A named split keeps the files that name it. FormatError when the
    choice cannot be made: an unknown split, a split no file names, no test split to default to,
    or files naming no split beside files that do."""
    base = Path(path)

    def relative(file: Path) -> Path:
        return file.relative_to(base) if base.is_dir() else Path(file.name)

    named = [(file, domain, file_split(relative(file))) for file, domain in files]
    counts = Counter(name for _, _, name in named if name)
    listed = ", ".join(f"{name} ({n} file{'s' if n != 1 else ''})" for name, n in sorted(counts.items()))
    if split is not None and split not in IMPORT_SPLITS:
        raise FormatError(f"unknown split {split!r} (expected one of {', '.join(IMPORT_SPLITS)})", file=path)
    if split is None:
        if not counts:
            return list(files), ""
        unnamed = [file for file, _, name in named if name is None]
        if unnamed:
            raise FormatError(f"{relative(unnamed[0])} names no split while other files do ({listed}); name its "
                              "split in its path, or move it out of the folder", file=path)
        if "test" not in counts:
            raise FormatError(f"the files name the splits {listed} and none names test; choose one with --split",
                              file=path)
        split = "test"
    kept = [(file, domain) for file, domain, name in named if name == split]
    if not kept:
        raise FormatError(f"no data file names the split {split!r} (the files name: {listed or 'no split'})",
                          file=path)
    note = ""
    if len(kept) < len(files):
        unnamed = len(files) - sum(counts.values())
        others = f"{listed}{f' and {unnamed} naming none' if unnamed else ''}"
        note = (f"{base.name} holds the splits {others}; imported the {split} split only "
                f"({len(kept)} file{'s' if len(kept) != 1 else ''}); "
                f"--split {'|'.join(s for s in IMPORT_SPLITS if s != split)} imports another")
    return kept, note


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
        meta = load_json(read_text(meta_file, name=str(meta_file)), file=meta_file)
    except JSONSyntaxError as exc:
        raise FormatError(f"not valid JSON: {exc.detail}", file=meta_file) from None
    if not isinstance(meta, dict):
        raise FormatError("expected a JSON object", file=meta_file)
    try:
        check_text(meta)
    except RowError as exc:
        raise FormatError(exc.reason, file=meta_file, field=exc.field) from None
    return meta


# --- validation -------------------------------------------------------------------------

def validate_row(row: Any, *, file: Path, line: int, unit: str = "line", position: int,
                 subset_domain: str | None, require_pair: bool = True) -> Record:
    """Check one raw row against its schema (ProfileRubricRow, or PairHistoryRow when it has a
    `history`) and return it as a Record. Raises FormatError naming file, line and field."""
    if not isinstance(row, dict):
        raise FormatError(f"expected a JSON object per row, got {type_name(row)}", file=file, line=line, unit=unit)
    history = "history" in row
    parsed = validate(PairHistoryRow if history else ProfileRubricRow, row, file=file, line=line, unit=unit)

    def fail(message: str, field_name: str) -> FormatError:
        return FormatError(message, file=file, line=line, field=field_name, unit=unit)

    if require_pair or history:
        for key in ("chosen", "rejected"):
            if getattr(parsed, key) is None:
                raise fail("missing field", key)
        if parsed.chosen.strip() == parsed.rejected.strip():
            raise fail("chosen and rejected are identical", "rejected")
    if parsed.category is None and subset_domain is None:
        raise fail("missing field", "category")
    if parsed.category is None:
        domain, category = subset_domain, SUBSET_NAMES[subset_domain]
    else:
        domain, category = domain_from_label(parsed.category), parsed.category
        if domain is None:
            raise fail(f"unknown category {category!r} (expected one of {', '.join(SUBSET_NAMES.values())})",
                       "category")
    plan = row.get("plan") or []
    if not isinstance(plan, list) or not all(isinstance(a, str) and a.strip() for a in plan):
        raise fail("plan must be a list of non-empty strings (planner aspects)", "plan")
    common = dict(plan=plan, position=position, source_id=str(parsed.id), source_id_is_int=isinstance(parsed.id, int),
                  domain=domain, category=category, question=parsed.question, chosen=parsed.chosen,
                  rejected=parsed.rejected)
    # The rows' own lists and objects are kept as written (with any extra keys) for export.
    if history:
        return Record(**common, profile=[], rubric_aspects=[], narrative="", user_id=str(parsed.user_id),
                      history=row["history"], extra={k: v for k, v in row.items() if k not in HISTORY_FIELDS})
    return Record(**common, profile=row["profile"], rubric_aspects=row["rubric_aspects"], narrative=parsed.narrative,
                  extra={k: v for k, v in row.items() if k not in KNOWN_FIELDS})


FORMATS = ("auto", "personalized-rewardbench", formats_prb.FORMAT_NAME)


def detect_format(files: list[tuple[Path, str | None]]) -> str:
    """"personalrewardbench" when the first row has that schema's fields, else "personalized-rewardbench"."""
    for file, _ in files:
        for _, row, _ in iter_raw_rows(file):
            return formats_prb.FORMAT_NAME if formats_prb.looks_like(row) else "personalized-rewardbench"
    return "personalized-rewardbench"


def import_files(path: Path, *, import_split: str | None, format: str = "auto") -> tuple[list[tuple[Path, str | None]], str]:
    """(the data files a benchmark import reads, the `choose_split` line or ""). `import_split`
    "auto" chooses as choose_split(None) does; "test", "train" or "val" names the split. A
    PersonalRewardBench source is read whole: its rows carry their split (test rows are the items,
    train and val rows their history), so only the test split (or auto) can be imported from it."""
    if format not in FORMATS:
        raise FormatError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    files = list_source_files(Path(path))
    chosen = None if import_split in (None, "auto") else import_split
    if (detect_format(files) if format == "auto" else format) == formats_prb.FORMAT_NAME:
        if chosen not in (None, "test"):
            raise FormatError(f"--split {chosen}: PersonalRewardBench rows carry their own split (test rows are the "
                              "items, train and val rows their history); only the test split can be imported",
                              file=path)
        return files, ""
    return choose_split(Path(path), files, chosen)


def read_records(path: Path, *, require_pair: bool = True, split: str = "", format: str = "auto",
                 history_size: int = formats_prb.DEFAULT_HISTORY_SIZE, seed: int = formats_prb.DEFAULT_SEED,
                 category: str | None = None, import_split: str | None = None, history_sampling: str = "prbench",
                 stats: dict[str, int] | None = None) -> Iterator[Record]:
    """Validated records of a file or folder, in order; duplicate ids are an error.
    `split` keeps only files whose path below `path` names it (e.g. "test"; a build's source).
    `import_split` (a benchmark import: "auto", "test", "train" or "val"): the files `import_files`
    chooses instead.
    `format` "auto" detects the schema from the first row; the PersonalRewardBench schema is read by
    formats_prb (history_size, seed, category, history_sampling and stats apply to it only)."""
    if format not in FORMATS:
        raise FormatError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    seen: dict[str, tuple[Path, int]] = {}
    position, kind = 0, None
    if import_split is not None:
        files, _ = import_files(Path(path), import_split=import_split, format=format)
    else:
        files = list_source_files(Path(path))
    if split:
        files = [(f, d) for f, d in files if split in str(f.relative_to(path) if Path(path).is_dir() else f.name)]
        if not files:
            raise FormatError(f"no data file names the split {split!r}", file=path)
    if (detect_format(files) if format == "auto" else format) == formats_prb.FORMAT_NAME:
        # The names a row's set (PRISM or Chatbot Arena) may be read from: the imported folder's own
        # name and the path below it, or a single file's folder and name.
        base = Path(path).resolve()
        relative = [(f, Path(base.name) / f.relative_to(path) if base.is_dir() else Path(base.parent.name, base.name))
                    for f, _ in files]
        for fields in formats_prb.read_records(relative, history_size=history_size, seed=seed, category=category,
                                               history_sampling=history_sampling, stats=stats):
            yield Record(**fields)
        return
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

    Written to a temporary file first and renamed (`ml.files.atomic_path`), so a failed export
    leaves no half file."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise FormatError(f"unsupported output type '{out.suffix}' (expected {', '.join(DATA_SUFFIXES)})", file=out)
    if suffix == ".parquet":
        with atomic_path(out) as tmp:
            return _write_parquet(rows, tmp, out)
    with atomic_write(out, "w", newline="\n") as fh:
        return _write_json(rows, fh, array=suffix == ".json")


def _write_json(rows: Iterable[dict[str, Any]], fh: Any, *, array: bool) -> int:
    count = 0
    if array:
        fh.write("[")
    for row in rows:
        text = json.dumps(row, ensure_ascii=False, allow_nan=False)
        if array:
            fh.write(("\n" if count == 0 else ",\n") + text)
        else:
            fh.write(text + "\n")
        count += 1
    if array:
        fh.write("\n]\n")
    return count


def _write_parquet(rows: Iterable[dict[str, Any]], tmp: Path, out: Path) -> int:
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
                              "export as .jsonl instead", file=out)
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
        raise FormatError(f"rows do not fit one Parquet schema ({exc}); export as .jsonl instead", file=out) from None
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        pq.write_table(pa.table({name: pa.array([], pa.string()) for name in KNOWN_FIELDS}), tmp)
    return count
