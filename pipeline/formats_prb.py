"""Reading and writing the published PersonalRewardBench files (PRISM and Chatbot Arena personalised sets).

Plain Python, no Django. One row of those files is

    {conversation_id, user_id, context: [{content, role}, ...], chosen: {content, role},
     rejected: {content, role}, chosen_score, rejected_score, turns, type, split: train|val|test, flip}

(more keys may be present, e.g. `dataset`; they are kept). A row stores no history: a user's
history is their other rows. How the importer turns rows into benchmark items:

- the query is the first user turn of `context` (the release shows only that turn);
- `split` decides the role of a row: each `test` row becomes one item; `train` and `val` rows are
  history and prototype material (kept beside the items, exported back, read by build_prototypes);
- a test row's history is a seeded sample of up to `history_size` (default 6, as the release) of the
  SAME user's train rows, as [{prompt, chosen, rejected}], identical entries removed first. Sampling
  uses one `random.Random(seed)` (default seed 42, as the release), users in sorted order of user_id,
  each user's test rows in file order, `rng.sample(pool, min(history_size, len(pool)))`;
  `history_sampling="release"` samples the RAW pool instead, repeated train rows included, as the
  release does (QC `Character-GenRM/utils.py:240-251`): one repeated row changes every later draw, so
  the two rules give other histories as soon as a user has one. The import counts the repeated rows
  removed (`stats["history_duplicates_removed"]`; 0 under "release");
- item id = conversation_id (a repeated conversation_id gets "#2", "#3", ... in file order);
- category (PRISM or Chatbot Arena) from the row's `category` or `dataset` field, else from a folder or
  file name naming it (prism_personalized_0125/, chatbot_arena_personalized_0125/...), else the
  `category` argument; neither -> FormatError;
- the whole source row is kept on the record (`extra["personalrewardbench"]`) and written back
  unchanged on export, so scores, type, turns and flip survive the round trip (a NaN or infinite
  number, e.g. a missing score read from Parquet, is kept as null: JSON has no such numbers).

Rows are validated by pydantic models; a bad row is a FormatError naming file, line and field.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prblib.rows import RowError as FormatError
from .rowfiles import iter_raw_rows
from .domains import ARENA, PRISM, SUBSET_NAMES, domain_from_label

FORMAT_NAME = "personalrewardbench"
ROW_KEY = "personalrewardbench"  # the key of Record.extra holding the source row
DEFAULT_HISTORY_SIZE = 6  # the release's number of few-shot history pairs
DEFAULT_SEED = 42  # the release's sampling seed
SPLITS = ("train", "val", "test")
DOMAINS = (PRISM, ARENA)
MATERIAL_SPLITS = ("train", "val")  # rows that are history/prototype material, not items
# The fields whose presence says a row is in this schema (format detection).
SIGNATURE = frozenset({"conversation_id", "user_id", "context", "chosen", "rejected", "split"})


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: str
    role: str


class PRBRow(BaseModel):
    """One PersonalRewardBench row (other keys allowed and kept)."""

    model_config = ConfigDict(extra="allow")
    conversation_id: str | int
    user_id: str | int
    context: list[Message] = Field(min_length=1)
    chosen: Message
    rejected: Message
    chosen_score: float | None = None
    rejected_score: float | None = None
    turns: int | None = None
    type: str | None = None
    split: Literal["train", "val", "test"]
    flip: bool | None = None

    @field_validator("conversation_id", "user_id")
    @classmethod
    def _not_blank(cls, value: str | int) -> str | int:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def query(self) -> str:
        return next(m.content for m in self.context if m.role == "user")


@dataclass(frozen=True)
class SourceRow:
    """A validated row with where it came from."""

    position: int
    file: Path
    line: int
    unit: str
    domain: str
    row: dict[str, Any]  # the row exactly as read
    parsed: PRBRow

    @property
    def user_id(self) -> str:
        return str(self.parsed.user_id)

    @property
    def split(self) -> str:
        return self.parsed.split

    def pair(self) -> dict[str, str]:
        """The row as a history entry: {prompt, chosen, rejected}."""
        return {"prompt": self.parsed.query, "chosen": self.parsed.chosen.content,
                "rejected": self.parsed.rejected.content}


def looks_like(row: Any) -> bool:
    """Whether a raw row is in this schema (has every signature field)."""
    return isinstance(row, dict) and SIGNATURE <= row.keys()


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _first_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of pydantic's first error, in words a user reads."""
    error = exc.errors()[0]
    field_path = _field_path(error.get("loc", ()))
    kind = error.get("type", "")
    if kind == "missing":
        return field_path, "missing field"
    if kind == "literal_error":
        return field_path, f"must be one of {', '.join(SPLITS)}, not {error.get('input')!r}"
    if kind == "too_short":
        return field_path, "must not be empty"
    return field_path, error.get("msg", "invalid value")


def _set_of(label: Any) -> str | None:
    domain = domain_from_label(label.replace("_", " ")) if isinstance(label, str) else None
    return domain if domain in DOMAINS else None


def _domain(row: dict[str, Any], names: Iterable[str], category: str | None) -> str | None:
    for label in (row.get("category"), row.get("dataset"), *reversed(list(names)), category):
        if _set_of(label):
            return _set_of(label)
    return None


def read_rows(files: Iterable[tuple[Path, Path]], *, category: str | None = None) -> Iterator[SourceRow]:
    """Validated rows of (file, path relative to the imported folder) pairs, in order."""
    position = 0
    for file, rel in files:
        for line, raw, unit in iter_raw_rows(file):
            if not isinstance(raw, dict):
                raise FormatError("expected a JSON object per row", file=file, line=line, unit=unit)
            try:
                parsed = PRBRow.model_validate(raw)
                parsed.query  # noqa: B018 - raises StopIteration without a user turn
            except ValidationError as exc:
                field_path, message = _first_error(exc)
                raise FormatError(message, file=file, line=line, field=field_path, unit=unit) from None
            except StopIteration:
                raise FormatError("has no user turn (the query)", file=file, line=line, field="context",
                                  unit=unit) from None
            domain = _domain(raw, rel.parts, category)
            if domain is None:
                raise FormatError("cannot tell which set this row belongs to (PRISM or Chatbot Arena): give rows "
                                  "a category, keep the dataset's folder name, or pass --category", file=file,
                                  line=line, field="category", unit=unit)
            yield SourceRow(position=position, file=file, line=line, unit=unit, domain=domain, row=_finite(raw),
                            parsed=parsed)
            position += 1


def _finite(value: Any) -> Any:
    """The value with every NaN or infinite number replaced by None: JSON has no such numbers (PostgreSQL's
    jsonb refuses them), and a missing score in a Parquet file often reads as NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def unique_pairs(rows: Iterable[SourceRow]) -> list[dict[str, str]]:
    """The rows as history entries, identical entries kept once (first occurrence)."""
    seen, pairs = set(), []
    for row in rows:
        pair = row.pair()
        key = (pair["prompt"].strip(), pair["chosen"].strip(), pair["rejected"].strip())
        if key not in seen:
            seen.add(key)
            pairs.append(pair)
    return pairs


HISTORY_SAMPLINGS = ("prbench", "release")


def test_histories(rows: list[SourceRow], *, history_size: int, seed: int, sampling: str = "prbench",
                   stats: dict[str, int] | None = None) -> dict[int, list[dict[str, str]]]:
    """{position of a test row: its sampled history} (see the module docstring for the rule).
    sampling "prbench": identical train rows kept once before sampling; "release": the raw pool.
    `stats`, when given, gets history_duplicates_removed: the repeated train rows removed from the
    pools of users with test rows (0 under "release")."""
    if sampling not in HISTORY_SAMPLINGS:
        raise FormatError(f"history sampling must be one of {', '.join(HISTORY_SAMPLINGS)}, not {sampling!r}")
    train: dict[str, list[SourceRow]] = defaultdict(list)
    tests: dict[str, list[SourceRow]] = defaultdict(list)
    for row in rows:
        if row.split == "test":
            tests[row.user_id].append(row)
        elif row.split == "train":
            train[row.user_id].append(row)
    rng = random.Random(seed)
    histories = {}
    removed = 0
    for user in sorted(tests):
        raw = [row.pair() for row in train.get(user, ())]
        pool = raw if sampling == "release" else unique_pairs(train.get(user, ()))
        removed += len(raw) - len(pool)
        for row in tests[user]:
            histories[row.position] = rng.sample(pool, min(history_size, len(pool)))
    if stats is not None:
        stats["history_duplicates_removed"] = removed
    return histories


def material_history(rows: list[SourceRow], user: str, *, leave_out: int | None = None) -> list[dict[str, str]]:
    """A user's train+val rows as history entries, deduplicated, leaving out the row at `leave_out`
    (leave-one-out history for the row being judged when prototypes are built from inferred personas)."""
    return unique_pairs(r for r in rows if r.user_id == user and r.position != leave_out)


def prb_row(extra: dict[str, Any]) -> dict[str, Any] | None:
    """The source row kept on a record or item (export writes it back unchanged), or None."""
    row = (extra or {}).get(ROW_KEY)
    return row if isinstance(row, dict) else None


def domain_label(domain: str) -> str:
    return SUBSET_NAMES[domain]


def read_records(files: list[tuple[Path, Path]], *, history_size: int = DEFAULT_HISTORY_SIZE,
                 seed: int = DEFAULT_SEED, category: str | None = None, history_sampling: str = "prbench",
                 stats: dict[str, int] | None = None) -> Iterator[Any]:
    """The fields of a formats.Record for every row (formats.read_records builds the Records), in
    file order: test rows with their sampled history, train/val rows (split set, history empty) as
    material. The whole file is read before the first record is returned, since a test row's
    history may come from any later row."""
    if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 0:
        raise FormatError(f"--history-size must be a whole number >= 0, not {history_size!r}")
    rows = list(read_rows(files, category=category))
    histories = test_histories(rows, history_size=history_size, seed=seed, sampling=history_sampling, stats=stats)
    seen: dict[str, int] = {}
    for row in rows:
        conversation = str(row.parsed.conversation_id)
        seen[conversation] = seen.get(conversation, 0) + 1
        source_id = conversation if seen[conversation] == 1 else f"{conversation}#{seen[conversation]}"
        chosen, rejected = row.parsed.chosen.content, row.parsed.rejected.content
        if row.split == "test" and (not chosen.strip() or not rejected.strip() or chosen.strip() == rejected.strip()):
            field_name = "chosen.content" if not chosen.strip() else "rejected.content"
            reason = "must not be empty" if not (chosen.strip() and rejected.strip()) else \
                "chosen and rejected are identical"
            raise FormatError(reason, file=row.file, line=row.line, field=field_name, unit=row.unit)
        yield dict(position=row.position, source_id=source_id, source_id_is_int=False, domain=row.domain,
                   category=domain_label(row.domain), question=row.parsed.query, profile=[], rubric_aspects=[],
                   narrative="", chosen=chosen, rejected=rejected, extra={ROW_KEY: row.row},
                   user_id=row.user_id, history=histories.get(row.position, []), split=row.split)
