"""Imports: downstream outcomes and accuracies on other benchmarks computed elsewhere
(CSV or JSON; all or nothing; every refusal names file, line and field)."""

from __future__ import annotations

from pathlib import Path

from django.db import transaction

from pipeline.models import Domain
from pipeline.services import manifest
from prblib.rows import Integer, JSONSyntaxError, Label, Number, Row, RowError, content_sha256, decode_text, load_json, text_lines, validate
from prblib.rewards import presets

from ..models import ExternalBenchmarkScore, OutcomeKind, RunStatus, Setting, Submission
from .outcomes import outcome_store


class ImportRefused(Exception):
    """A file refused whole; the message names the line and field."""


# Bounds are those of the DownstreamOutcome / ExternalBenchmarkScore columns (tests pin them).
class OutcomeRow(Row):
    """An imported outcome: the RM as `submission` (our id) or `rm` + `source` (see _resolve_rm)."""

    submission: Integer(strings_ok=True, low=1, optional=True) = None
    rm: Label(120, optional=True) = None
    kind: Label(12, optional=True) = None
    policy: Label(200, optional=True) = None
    setting: Label(40, optional=True) = None
    domain: Label(40, optional=True) = None
    k: Integer(strings_ok=True, low=1, optional=True) = None
    outcome: Number(strings_ok=True)
    n: Integer(strings_ok=True, low=0)
    source: Label(200, optional=True) = None


class BenchmarkScoreRow(Row):
    benchmark: Label(120)
    submission: Integer(strings_ok=True, low=1, optional=True) = None
    rm: Label(120, optional=True) = None
    accuracy: Number(strings_ok=True, low=0, high=100)
    setting: Label(40, optional=True) = None
    source: Label(200, optional=True) = None
    domain: Label(40, optional=True) = None
    rm_type: Label(16, optional=True) = None


def _read_table(path: Path, model: type[Row]) -> list[tuple[int, Row]]:
    """(line, validated row) from a CSV (header line) or a JSON list / JSON lines file, read as
    UTF-8 with or without BOM and any line ending. Raises ImportRefused naming file, line, field."""
    import csv
    import io

    path = Path(path)
    try:
        text = decode_text(path.read_bytes(), file=path.name)
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(io.StringIO(text, newline=""), restkey="(extra columns)")
            raw = []
            for row in reader:
                raw.append((reader.line_num, row))
        elif text.lstrip().startswith("["):
            try:
                rows = load_json(text, file=path.name, constants=True)  # the row models check every number
            except JSONSyntaxError as exc:
                raise RowError(f"invalid JSON ({exc.detail})", file=path.name) from None
            if not isinstance(rows, list):
                raise RowError("expected a JSON list of objects", file=path.name)
            raw = [(i, row) for i, row in enumerate(rows, start=1)]
        else:
            raw = []
            for number, line in text_lines(text):
                raw.append((number, load_json(line, file=path.name, line=number, constants=True)))
        return [(line, validate(model, row, file=path.name, line=line)) for line, row in raw]
    except csv.Error as exc:
        raise ImportRefused(f"{path.name}: not a readable CSV file ({exc})") from None
    except RowError as exc:
        raise ImportRefused(str(exc)) from None


def _number(row: dict, key: str, line: int, name: str, *, integer: bool = False, required: bool = True):
    """A number of an already validated row (the row model checked its type and range)."""
    value = row.get(key)
    if value in (None, ""):
        if required:
            raise ImportRefused(f"{name}, line {line}, field '{key}': missing")
        return None
    return int(value) if integer else float(value)


def _resolve_rm(row: dict, line: int, name: str) -> tuple[Submission | None, str, str]:
    """(submission, rm name, source) of an imported row, or ImportRefused naming the line.

    A row names its RM by `submission` (our id), or by `rm` + `source` for an external model
    (unique per source). An `rm` without a source (or with source "prbench", ours) is taken
    as one of our submissions only when exactly one live submission has that display name
    (or "owner/name"); otherwise the row is refused, naming the candidates."""
    raw_id = row.get("submission")
    source = str(row.get("source") or "").strip()
    if raw_id not in (None, ""):
        submission_id = _number(row, "submission", line, name, integer=True)
        submission = Submission.objects.select_related("owner").filter(pk=submission_id).first()
        if submission is None:
            raise ImportRefused(f"{name}, line {line}, field 'submission': no submission #{submission_id}")
        return submission, submission.display_name, "prbench"
    rm = str(row.get("rm") or "").strip()
    if not rm:
        raise ImportRefused(f"{name}, line {line}, field 'rm': missing (give 'submission', or 'rm' and 'source')")
    if source and source != "prbench":
        return None, rm, source
    owner, _, display = rm.rpartition("/")
    candidates = Submission.objects.filter(display_name=display if owner else rm).select_related("owner")
    if owner:
        candidates = candidates.filter(owner__username=owner)
    live = [s for s in candidates.order_by("pk") if s.runs.exclude(
        status__in=[RunStatus.FAILED, RunStatus.CANCELLED]).exists()]
    if len(live) == 1:
        return live[0], live[0].display_name, "prbench"
    if not live:
        raise ImportRefused(f"{name}, line {line}, field 'rm': no submission named {rm!r}; give 'submission' "
                            "(our id), or 'source' for an external model")
    listed = ", ".join(f"#{s.pk} ({s.owner.get_username()}/{s.display_name})" for s in live)
    raise ImportRefused(f"{name}, line {line}, field 'rm': {rm!r} is ambiguous: {listed}; give 'submission'")


def _row_setting(row: dict, line: int, name: str, default: str | None, *, allowed: tuple[str, ...]) -> str:
    setting = str(row.get("setting") or default or "").strip()
    if setting not in allowed:
        raise ImportRefused(f"{name}, line {line}, field 'setting': {setting!r} is not one of {', '.join(allowed)}")
    return setting


def outcomes_import(*, path: Path, kind: str | None = None, policy: str | None = None,
                    setting: str | None = None) -> int:
    """Import downstream outcomes computed elsewhere. All or nothing; returns the row count.

    Rows (CSV or JSON): the RM as `submission` (our id) or `rm` + `source` (see `_resolve_rm`),
    domain ("" / "all" = all domains), outcome, n, and optionally kind, policy, k and setting
    (the setting the RM scored in; default `setting`, else "profile"). An existing outcome
    with the same (RM, kind, policy, setting, domain, k) is updated."""
    path, rows = Path(path), []
    for line, typed in _read_table(path, OutcomeRow):
        row = typed.model_dump()  # checked for type, length and text by the row model
        submission, rm, source = _resolve_rm(row, line, path.name)
        row_kind = str(row.get("kind") or kind or "").strip()
        if row_kind not in OutcomeKind.values:
            raise ImportRefused(f"{path.name}, line {line}, field 'kind': {row_kind!r} is not one of "
                                f"{', '.join(OutcomeKind.values)} (a PPO outcome must come from PPO)")
        domain = str(row.get("domain") or "").strip()
        if domain.lower() in ("all", "overall"):
            domain = ""
        rows.append(dict(submission=submission, rm_name=rm, source=source, kind=row_kind,
                         policy=str(row.get("policy") or policy or "Qwen2.5-0.5B-Instruct"),
                         setting=_row_setting(row, line, path.name, setting or Setting.PROFILE,
                                              allowed=tuple(Setting.values)),
                         domain=domain, k=_number(row, "k", line, path.name, integer=True, required=False),
                         outcome=_number(row, "outcome", line, path.name),
                         n=_number(row, "n", line, path.name, integer=True)))
    if not rows:
        raise ImportRefused(f"{path.name}: no rows")
    with transaction.atomic():
        for r in rows:
            outcome_store(**r, manifest=_import_manifest(path, r["submission"]))
    return len(rows)


def _import_manifest(path: Path, submission: Submission | None) -> dict:
    """What an imported figure traces to: the file (name and content sha256), the code that
    imported it and, for one of our submissions, its weights hash."""
    return manifest(import_file=path.name, import_sha256=content_sha256(path),
                    weights_hash=submission.weights_hash if submission is not None else None)


def _reported_domain_and_type(row: dict, line: int, name: str) -> dict[str, str]:
    """{domain, rm_type} of an imported figure: domain "" (also "all"/"overall") or one of ours;
    rm_type "" or one of presets.RM_TYPES (the paper's table groups reported rows by it)."""
    domain = str(row.get("domain") or "").strip()
    if domain.lower() in ("all", "overall"):
        domain = ""
    if domain and domain not in Domain.values:
        raise ImportRefused(f"{name}, line {line}, field 'domain': {domain!r} is not one of {', '.join(Domain.values)} "
                            "(or empty / all for every pair)")
    rm_type = str(row.get("rm_type") or "").strip()
    types = [t for t, _ in presets.RM_TYPES]
    if rm_type and rm_type not in types:
        raise ImportRefused(f"{name}, line {line}, field 'rm_type': {rm_type!r} is not one of {', '.join(types)}")
    return {"domain": domain, "rm_type": rm_type}


def external_scores_import(*, path: Path) -> int:
    """Import accuracies on other benchmarks. All or nothing; returns the row count.

    Rows: benchmark, the RM as `submission` or `rm` + `source` (see `_resolve_rm`), accuracy
    (a fraction, or a percentage when above 1), optional setting (free text: other benchmarks
    have their own), optional domain (one of ours, "" / all: every pair) and rm_type (the
    paper's group: scalar, generative, fine_tuned, other), for figures a paper reports on our own
    benchmark (the paper table shows them in rows of their own, marked reported). An existing
    (benchmark, setting, domain, RM) is updated."""
    path, rows = Path(path), []
    for line, typed in _read_table(path, BenchmarkScoreRow):
        row = typed.model_dump()  # checked for type, length and text by the row model
        if not str(row.get("benchmark") or "").strip():
            raise ImportRefused(f"{path.name}, line {line}, field 'benchmark': missing")
        submission, rm, source = _resolve_rm(row, line, path.name)
        accuracy = _number(row, "accuracy", line, path.name)
        if accuracy > 1:
            accuracy /= 100  # given in percent
        rows.append(dict(benchmark=str(row["benchmark"]).strip(), submission=submission, rm_name=rm,
                         setting=str(row.get("setting") or "").strip(), accuracy=accuracy, source=source,
                         **_reported_domain_and_type(row, line, path.name)))
    if not rows:
        raise ImportRefused(f"{path.name}: no rows")
    with transaction.atomic():
        for r in rows:
            key = dict(benchmark=r["benchmark"], setting=r["setting"], domain=r["domain"], submission=r["submission"])
            if r["submission"] is None:
                key.update(source=r["source"], rm_name=r["rm_name"])
            ExternalBenchmarkScore.objects.update_or_create(
                **key, defaults={"accuracy": r["accuracy"], "rm_name": r["rm_name"], "source": r["source"],
                                 "rm_type": r["rm_type"],
                                 "manifest": _import_manifest(path, r["submission"])})
    return len(rows)
