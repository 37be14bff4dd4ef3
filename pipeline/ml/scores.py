"""Uploaded scores: a submitter ran their reward model elsewhere and uploads its scores.

The file is JSON Lines, one object per pair: {"id": ..., "chosen_score": number,
"rejected_score": number} (more fields are allowed and ignored, so an `evaluate_rm --out` file
can be uploaded as is). It must cover exactly the benchmark's pairs. It is checked as a whole
before any score is used (all-or-nothing); the first problem is reported with the file name and
line number.

No options (ModelSpec.options must be empty). The platform may set, in ModelSpec.runtime:
    benchmark_ids  every pair id of the benchmark. When given, the file is checked against it
                   (so a run on a subset, e.g. --limit, still accepts a file for the whole
                   benchmark); otherwise against the pairs being scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pipeline.ml.base import ModelError, ModelSpec, PairInput, PairResult, ProgressFn, setting_info
from pipeline.ml.rows import Identifier, Number, Row, RowError, read_text, text_lines, validate

SCORE_FIELDS = ("chosen_score", "rejected_score")
INPUTS_NOTE = "uploaded scores: the model ran outside prbench, so its inputs are not known"


class ScoreRow(Row):
    """One line of a scores file; other keys (e.g. an `evaluate_rm --out` line's) are ignored."""

    id: Identifier
    chosen_score: Number()
    rejected_score: Number()


def parse_scores_file(path: str | Path, expected_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Read and check a scores file; return {id: (chosen_score, rejected_score)}.

    The text is read by `rows.read_text` (UTF-8 with or without BOM, any line ending). Raises
    ModelError "scores file NAME, line N, field 'X': reason" for: unreadable file, invalid UTF-8
    or JSON, a line that is not an object, a missing or invalid id, a missing field, a score that
    is not a finite number (strings, booleans, NaN, infinities and integers too large for a float
    are refused), a lone surrogate or NUL in any string, a duplicate id, an id that is not in the
    benchmark; and, once the file is read, for benchmark ids the file does not score.
    """
    path = Path(path)
    name = f"scores file {path.name}"
    expected = set(expected_ids)
    scores: dict[str, tuple[float, float]] = {}
    first_line: dict[str, int] = {}
    try:
        text = read_text(path, name=name)
    except OSError as exc:
        raise ModelError(f"cannot read {name}: {exc.strerror or exc}") from None
    except RowError as exc:
        raise ModelError(str(exc)) from None
    for number, line in text_lines(text):
        where = f"{name}, line {number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ModelError(f"{where}: not valid JSON ({exc})") from None
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


class UploadedScores:
    kind = "scores"
    scores_groups = False  # nothing to score generated samples with

    def __init__(self, path: str | Path, benchmark_ids: Sequence[str] | None = None):
        self.path = Path(path)
        self.benchmark_ids = None if benchmark_ids is None else set(benchmark_ids)

    @classmethod
    def load(cls, spec: ModelSpec) -> "UploadedScores":
        from pipeline.ml.options import parse_options

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
