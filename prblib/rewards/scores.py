"""Uploaded scores: a submitter ran their reward model elsewhere and uploads its scores.

The file is JSON Lines, one object per pair: {"id": ..., "chosen_score": number,
"rejected_score": number} (more fields are allowed and ignored, so an `evaluate_rm --out` file
can be uploaded as is). It must cover exactly the benchmark's pairs. It is checked as a whole
before any score is used (all-or-nothing); the first problem is reported with the file name and
line number. What checking costs is bounded by the benchmark, not the file: at most 2 lines per
pair plus 1,000 (blank lines count) and 1 MiB per line, read in chunks and refused at the first
line past either bound.

No options (ModelSpec.options must be empty). The platform may set, in ModelSpec.runtime:
    benchmark_ids  every pair id of the benchmark. When given, the file is checked against it
                   (so a run on a subset, e.g. --limit, still accepts a file for the whole
                   benchmark); otherwise against the pairs being scored.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from prblib.rewards.base import ModelSpec, PairInput, PairResult, ProgressFn
from prblib.registry import setting_info
from prblib.errors import ModelError
from prblib.rows import Identifier, JSONSyntaxError, Number, Row, RowError, load_json, read_lines, validate

SCORE_FIELDS = ("chosen_score", "rejected_score")
# The file is read line by line within these bounds, so what it costs is set by the benchmark,
# not by the file: a line is a small JSON object (an `evaluate_rm --out` line is ~150 bytes), and
# a file has one line per pair; blank lines are allowed up to as many again, plus SPARE_LINES.
MAX_LINE_BYTES = 1 << 20
SPARE_LINES = 1000
INPUTS_NOTE = "uploaded scores: the model ran outside prbench, so its inputs are not known"


class ScoreRow(Row):
    """One line of a scores file; other keys (e.g. an `evaluate_rm --out` line's) are ignored."""

    id: Identifier
    chosen_score: Number()
    rejected_score: Number()


def parse_scores_file(path: str | Path, expected_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Read and check a scores file; return {id: (chosen_score, rejected_score)}.

    The text is read by `rows.read_lines` (UTF-8 with or without BOM, any line ending), in
    chunks. Raises ModelError "scores file NAME, line N, field 'X': reason" for: unreadable file,
    more lines than `max_lines(len(expected_ids))` (blank lines count: a flood of them is refused
    after reading a few kilobytes), a line longer than MAX_LINE_BYTES, invalid UTF-8 or JSON, a
    line that is not an object, a missing or invalid id, a missing field, a score that is not a
    finite number (strings, booleans, NaN, infinities and integers too large for a float are
    refused), a lone surrogate or NUL in any string, a duplicate id, an id that is not in the
    benchmark; and, once the file is read, for benchmark ids the file does not score.
    """
    path = Path(path)
    name = f"scores file {path.name}"
    expected = set(expected_ids)
    scores: dict[str, tuple[float, float]] = {}
    first_line: dict[str, int] = {}
    for number, line in _lines(path, name, len(expected)):
        where = f"{name}, line {number}"
        try:
            # NaN, Infinity and 1e999 reach the row check, which names the field; depth and number size bounded.
            row = load_json(line, file=name, line=number, constants=True)
        except JSONSyntaxError as exc:
            raise ModelError(f"{where}: not valid JSON ({exc.detail})") from None
        except RowError as exc:
            raise ModelError(str(exc)) from None
        try:
            parsed = validate(ScoreRow, row, file=name, line=number)
        except RowError as exc:
            raise ModelError(str(exc)) from None
        pair_id = str(parsed.id)
        if pair_id in first_line:
            raise ModelError(f"{where}, field 'id': {pair_id!r} appears again (first on line {first_line[pair_id]})")
        if pair_id not in expected:
            raise ModelError(f"{where}, field 'id': {pair_id!r} is not a pair of this benchmark")
        first_line[pair_id] = number
        scores[pair_id] = (parsed.chosen_score, parsed.rejected_score)
    missing = sorted(expected - scores.keys())
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelError(f"{name} has no scores for {len(missing)} pair(s) of this benchmark: "
                         f"{shown}{more}")
    return scores


def max_lines(pairs: int) -> int:
    """The most lines a scores file for `pairs` pairs may have, blank ones included."""
    return 2 * pairs + SPARE_LINES


def _lines(path: Path, name: str, pairs: int) -> Iterator[tuple[int, str]]:
    """The file's non-blank lines within the bounds (rows.read_lines); ModelError past them."""
    try:
        yield from read_lines(path, name=name, max_lines=max_lines(pairs), max_line_bytes=MAX_LINE_BYTES)
    except OSError as exc:
        raise ModelError(f"cannot read {name}: {exc.strerror or exc}") from None
    except RowError as exc:
        if exc.line is not None and exc.line > max_lines(pairs):  # say where the line limit comes from
            raise ModelError(f"{exc}; the limit is 2 lines per pair of the benchmark ({pairs:,} pairs) "
                             f"plus {SPARE_LINES:,}") from None
        raise ModelError(str(exc)) from None


class UploadedScores:
    kind = "scores"
    scores_groups = False  # nothing to score generated samples with

    def __init__(self, path: str | Path, benchmark_ids: Sequence[str] | None = None):
        self.path = Path(path)
        self.benchmark_ids = None if benchmark_ids is None else set(benchmark_ids)

    @classmethod
    def load(cls, spec: ModelSpec) -> "UploadedScores":
        from prblib.rewards.options import parse_options

        parse_options(cls.kind, spec.options)
        ids = spec.runtime.get("benchmark_ids")
        if ids is not None and (not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids)):
            raise ModelError("benchmark_ids must be a list of pair ids")
        path = Path(spec.path)
        if not path.is_file():
            raise ModelError(f"scores file {path.name or spec.path!r} does not exist")
        return cls(path, ids)

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        setting_info(setting)  # a known setting; what it needs (a plan) is not: nothing is computed here
        pairs = list(pairs)
        ids = {p.id for p in pairs}
        expected = self.benchmark_ids if self.benchmark_ids is not None else ids
        outside = sorted(ids - expected)
        if outside:
            raise ModelError(f"pair(s) {', '.join(map(repr, outside[:5]))} are not in the benchmark's ids")
        # The evaluation loop calls this once per chunk of pairs: parse and check the file once.
        key = frozenset(expected)
        if getattr(self, "_parsed_for", None) != key:
            self._parsed, self._parsed_for = parse_scores_file(self.path, expected), key
        return self._results(pairs, self._parsed, progress)

    @staticmethod
    def _results(pairs: list[PairInput], scores: dict[str, tuple[float, float]],
                 progress: ProgressFn | None) -> Iterator[PairResult]:
        for pair in pairs:
            chosen, rejected = scores[pair.id]
            if progress is not None:
                progress(1)
            yield PairResult(pair.id, chosen, rejected, {"source": "uploaded"})

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """("", ""): prbench never gave this model any input (see INPUTS_NOTE)."""
        return "", ""

    def usage(self) -> None:
        """None: no model runs here."""
        return None

    def reusable(self) -> bool:
        """True: the scores are read once and nothing is held that could stop working."""
        return True

    def close(self) -> None:
        pass
