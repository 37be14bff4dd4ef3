"""Submissions and evaluation runs, downstream runs (Best-of-N, PPO) and imports.

Every run follows the job lifecycle of jobs/services.py (claimed by a conditional UPDATE,
heartbeat, progress, cancel, retry, stale sweep). Per-unit results are unique per run and
unit (PairScore per item, BestOfNSample per sample, PPOAnswer per held-out question), so a
retried, re-queued or redelivered run does only what is still missing.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from jobs.models import ACTIVE_STATUSES, RETRYABLE_STATUSES
from jobs.services import JobRefused, job_cancel, job_enqueue, job_execute, job_progress, job_retry
from pipeline.endpoints import llm_backend, model_runtime
from pipeline.manifest import manifest
from pipeline.ml.base import ModelError
from pipeline.ml.rows import Integer, Label, Number, Row, RowError, content_sha256, decode_text, text_lines, validate
from pipeline.models import Benchmark, LLMEndpoint
from pipeline.services import (benchmark_freeze, progress_chunk_size, reward_model_get, rm_score_items,
                               rm_summarize, rm_usage)
from prbench.roles import RESEARCHER, has_role

from .models import EvaluationRun, Kind, PairScore, RunStatus, Setting, Submission

if TYPE_CHECKING:
    from pipeline.ml.base import ModelSpec

log = logging.getLogger(__name__)

AVAILABLE_KINDS = (Kind.SCALAR, Kind.PAIRWISE, Kind.POINTWISE, Kind.SCORES, Kind.PGENRM)
GENERATIVE_KINDS = (Kind.PAIRWISE, Kind.POINTWISE, Kind.PGENRM)


class SubmissionRefused(Exception):
    """A submission that cannot be queued. `errors` maps each form field at fault (None: the
    form as a whole) to its messages, every problem found at once; `field` and the message are
    the first of them."""

    def __init__(self, message: str, *, field: str | None = None, link: str | None = None,
                 errors: dict[str | None, list[str]] | None = None):
        super().__init__(message)
        self.field, self.link = field, link
        self.errors = errors or {field: [message]}


class _Problems:
    """Collects refusals so a submitter sees all of them in one answer."""

    def __init__(self):
        self.errors: dict[str | None, list[str]] = {}
        self.link: str | None = None

    def add(self, message: str, field: str | None = None) -> None:
        self.errors.setdefault(field, []).append(message)

    def absorb(self, exc: SubmissionRefused) -> None:
        for field, messages in exc.errors.items():
            for message in messages:
                self.add(message, field)
        self.link = self.link or exc.link

    def raise_any(self) -> None:
        if self.errors:
            field, messages = next(iter(self.errors.items()))
            raise SubmissionRefused(messages[0], field=field, link=self.link, errors=self.errors)


@dataclass(frozen=True)
class SubmissionRequest:
    display_name: str
    benchmark: str
    kind: str
    settings: tuple[str, ...]
    model_path: str = ""
    judge_backend: str = ""
    scores_file: UploadedFile | None = None
    dtype: str = "auto"
    max_length: int = 4096
    batch_size: int = 8
    profile_k: int = 10
    options: dict | None = None
    parameters: int | None = None
    license: str = ""
    link: str = ""


# --- submitting ---------------------------------------------------------------------------

def submission_create(*, user: AbstractBaseUser, request: SubmissionRequest) -> Submission:
    """Validate everything that can be checked before a GPU is involved, then queue one run
    per setting. Raises SubmissionRefused with a message for the form or the API."""
    if not has_role(user, RESEARCHER):
        raise SubmissionRefused("Submitting reward models needs the researcher role.")
    _check_rate_limit(user)  # early answer; checked again atomically below
    problems = _Problems()
    if not request.display_name.strip():
        problems.add("Give the submission a display name.", "display_name")
    benchmark = Benchmark.objects.filter(name=request.benchmark).first()
    if benchmark is None:
        problems.add(f"No benchmark named '{request.benchmark}'.", "benchmark")
    kind_known = request.kind in AVAILABLE_KINDS
    if request.kind not in Kind.values:
        problems.add(f"Unknown kind '{request.kind}'.", "kind")
    elif not kind_known:
        problems.add(f"The {Kind(request.kind).label} kind is not available yet.", "kind")
    chosen_settings = tuple(dict.fromkeys(request.settings))
    if not chosen_settings or any(s not in Setting.values for s in chosen_settings):
        problems.add(f"Choose settings among {', '.join(Setting.values)}.", "settings")
    else:
        if benchmark is not None:
            unsupported = [s for s in chosen_settings if s not in benchmark_settings(benchmark=benchmark)]
            if unsupported:
                problems.add(f"Benchmark {benchmark.name} does not support the {', '.join(unsupported)} setting: "
                             f"{SETTING_NEEDS[unsupported[0]]}", "settings")
        if request.kind == Kind.SCORES and len(chosen_settings) != 1:
            problems.add("A scores file was computed in exactly one setting: choose that one "
                         f"(got {', '.join(chosen_settings)}).", "settings")
    try:
        _check_name_free(user, request.display_name.strip())
    except SubmissionRefused as exc:
        problems.absorb(exc)
    if not 1 <= request.batch_size <= 512:
        problems.add("Batch size must be between 1 and 512.", "batch_size")
    if not 64 <= request.max_length <= 131072:
        problems.add("Max length must be between 64 and 131072 tokens.", "max_length")
    if not 0 <= request.profile_k <= 50:
        problems.add("Profile posts (k) must be between 0 and 50.", "profile_k")
    if benchmark is None or not kind_known:
        problems.raise_any()

    options, checked = None, None
    try:
        options = _check_options(request.kind, request.options)
    except SubmissionRefused as exc:
        problems.absorb(exc)
    try:
        checked = _check_model(request, benchmark)
    except SubmissionRefused as exc:
        problems.absorb(exc)
    problems.raise_any()
    model_path, backend, weights_hash, parameters = checked
    fingerprint = hashlib.sha256(f"{weights_hash}|{request.kind}|{benchmark.content_hash}".encode()).hexdigest()
    existing = (EvaluationRun.objects.filter(fingerprint=fingerprint, setting__in=chosen_settings)
                .exclude(status__in=[RunStatus.FAILED, RunStatus.CANCELLED]).select_related("submission").first())
    if existing is not None:
        mine = existing.submission.published or existing.submission.owner_id == user.pk or user.is_staff
        if not mine:  # someone else's private submission: say nothing about it but that it exists
            raise SubmissionRefused(
                f"This model was already submitted for {benchmark.name} in the '{existing.setting}' setting by "
                "another researcher; its result will appear when they publish it.", field="model_path")
        url = reverse("leaderboard:submission", args=[existing.submission_id])
        raise SubmissionRefused(
            f"This model was already evaluated on {benchmark.name} in the '{existing.setting}' setting "
            f"(submission #{existing.submission_id}, {existing.status}): see {url}", field="model_path", link=url)

    with transaction.atomic():
        _check_rate_limit(user, lock=True)
        submission = Submission.objects.create(
            owner=user, display_name=request.display_name.strip(), benchmark=benchmark, kind=request.kind,
            model_path=model_path, judge_backend=backend, weights_hash=weights_hash, dtype=request.dtype,
            max_length=request.max_length, batch_size=request.batch_size, profile_k=request.profile_k,
            options=options, parameters=request.parameters or parameters,
            license=request.license, link=request.link)
        if request.scores_file is not None:
            request.scores_file.seek(0)
            submission.scores_file.save(f"{submission.pk}-{weights_hash[:12]}.jsonl", request.scores_file, save=True)
        benchmark_freeze(benchmark=benchmark)  # results now refer to these exact items
        runs = EvaluationRun.objects.bulk_create([
            EvaluationRun(submission=submission, setting=s, fingerprint=fingerprint,
                          progress_total=benchmark.item_count) for s in chosen_settings])
        for run in runs:
            run_enqueue(run=run)
    return submission


SETTING_NEEDS = {
    Setting.PLAN: "every pair needs planner aspects; make a planned version first with "
                  "manage.py plan_benchmark --benchmark NAME --planner ENDPOINT --planner-model MODEL --name NEW.",
}


def benchmark_settings(*, benchmark: Benchmark) -> tuple[str, ...]:
    """The settings a run on `benchmark` can succeed in: `plan` only when every pair has
    planner aspects (a run fails on the first pair without)."""
    supported = [Setting.NO_PROFILE, Setting.PROFILE]
    if benchmark.item_count and not benchmark.items.filter(plan=[]).exists():
        supported.append(Setting.PLAN)
    return tuple(str(s) for s in supported)


def _check_name_free(user: AbstractBaseUser, name: str) -> None:
    """Display names are unique per owner among live submissions (one whose runs all failed
    or were cancelled frees its name), so "owner/name" identifies a reward model."""
    taken = (Submission.objects.filter(owner=user, display_name=name)
             .filter(runs__status__in=[*ACTIVE_STATUSES, RunStatus.SUCCEEDED]).values_list("pk", flat=True).first())
    if taken is not None:
        raise SubmissionRefused(f"You already have a submission named '{name}' (#{taken}); choose another name.",
                                field="display_name", link=reverse("leaderboard:submission", args=[taken]))


def _check_rate_limit(user: AbstractBaseUser, *, lock: bool = False) -> None:
    """At most SUBMISSIONS_PER_HOUR submissions per researcher per rolling hour (staff: none).

    With lock=True (inside the transaction that creates the submission) the researcher's user
    row is first written with its own value: on PostgreSQL that row lock, and on SQLite the
    database write lock, is held until commit, so concurrent submissions of one researcher
    count and insert one after another and cannot all see room for one more."""
    if user.is_staff:
        return
    if lock:
        # get_user_model(), not type(user): a view's request.user is a SimpleLazyObject.
        get_user_model().objects.filter(pk=user.pk).update(is_active=F("is_active"))
    limit = settings.SUBMISSIONS_PER_HOUR
    recent = Submission.objects.filter(owner=user, created_at__gte=timezone.now() - timedelta(hours=1)).count()
    if recent >= limit:
        raise SubmissionRefused(f"You reached the limit of {limit} submissions per hour; try again later.")


def _check_model(request: SubmissionRequest, benchmark: Benchmark) -> tuple[str, LLMEndpoint | None, str, int | None]:
    """(stored model path, judge backend, weights hash, parameter count) or SubmissionRefused."""
    from pipeline.ml.modelcheck import inspect_model_folder

    if request.kind == Kind.SCORES:
        if request.scores_file is None:
            raise SubmissionRefused("Upload a JSONL file of {id, chosen_score, rejected_score}.", field="scores_file")
        from pipeline.ml.scores import parse_scores_file

        upload = request.scores_file
        (Path(settings.VAR_DIR) / "tmp").mkdir(exist_ok=True)
        # Checked under the uploaded file's own name, so messages name the file the user sent;
        # streamed in chunks, so a large upload is never held in the web process's memory.
        with tempfile.TemporaryDirectory(dir=Path(settings.VAR_DIR) / "tmp") as tmp:
            path = Path(tmp) / (Path(upload.name or "scores.jsonl").name or "scores.jsonl")
            upload.seek(0)
            with open(path, "wb") as fh:
                for chunk in upload.chunks():
                    fh.write(chunk)
            try:
                parse_scores_file(path, expected_ids=set(benchmark.items.values_list("source_id", flat=True)))
            except ModelError as exc:
                raise SubmissionRefused(str(exc), field="scores_file") from None
            # The content, not the bytes: a copy saved with a BOM or CRLF line ends is the same model.
            content_digest = content_sha256(path)
        return "", None, content_digest, None

    backend = None
    if request.kind in GENERATIVE_KINDS and request.judge_backend:
        backend = LLMEndpoint.objects.filter(name=request.judge_backend, enabled=True).first()
        if backend is None:
            raise SubmissionRefused(f"No enabled judge backend named '{request.judge_backend}'.", field="judge_backend")
        if not request.model_path.strip():
            raise SubmissionRefused("Name the model served by the backend.", field="model_path")
        digest = hashlib.sha256(f"{backend.name}|{backend.base_url}|{request.model_path}".encode()).hexdigest()
        return request.model_path.strip(), backend, digest, None

    if not request.model_path.strip():
        raise SubmissionRefused(f"Give the model folder, relative to {settings.MODELS_ROOT}.", field="model_path")
    task = "sequence-classification" if request.kind == Kind.SCALAR else "causal-lm"
    models_root = Path(settings.MODELS_ROOT)
    raw = request.model_path.strip()
    candidate = Path(raw) if Path(raw).is_absolute() else models_root / raw
    if HUB_ID.match(raw) and not candidate.exists():
        candidate, models_root = _hub_snapshot(raw)
    try:
        info = inspect_model_folder(candidate, models_root=models_root, task=task)
    except ModelError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        raise SubmissionRefused(str(exc), field="model_path", errors={"model_path": problems}) from None
    if models_root == Path(settings.MODELS_ROOT):
        stored = str(Path(info.path).relative_to(models_root.resolve()))
    else:
        stored = info.path  # a Hub snapshot already on this machine, stored as its absolute folder
    return stored, None, info.weights_hash, info.parameters


def _check_options(kind: str, raw: dict | None) -> dict:
    """The options to store: the kind's schema (pipeline.ml.options) decides; the offending
    key is named. A P-GenRM prototypes file must exist inside the data folder."""
    from pipeline.ml.options import OptionsError, parse_options

    try:
        parsed = parse_options(kind, raw)
    except OptionsError as exc:
        raise SubmissionRefused(str(exc), field=exc.key or "options") from None
    # n > 0 may come from the paper preset too.
    if kind == Kind.PGENRM and (parsed.resolved()["n"] > 0 or parsed.prototypes):
        root = Path(settings.DATA_ROOT).resolve()
        path = (root / parsed.prototypes).resolve() if parsed.prototypes else None
        if path is None or not path.is_relative_to(root) or not path.is_file():
            raise SubmissionRefused("n > 0 needs 'prototypes': a prototypes JSON named relative to the data folder "
                                    "(manage.py build_prototypes).", field="prototypes")
    return parsed.model_dump(exclude_unset=True)


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_snapshot(repo_id: str) -> tuple[Path, Path]:
    """(snapshot folder, cache root) of a Hub model the machine already holds. Nothing is
    downloaded: Hub ids are accepted only when settings allow them and the files are local."""
    if not settings.ALLOW_HUB_MODELS:
        raise SubmissionRefused(f"'{repo_id}' is not a folder under the models folder, and Hub model ids are "
                                "disabled here (ALLOW_HUB_MODELS); place the model under MODELS_ROOT.",
                                field="model_path")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise SubmissionRefused(f"Hub model '{repo_id}' is not in this machine's cache; models are never "
                                "downloaded at evaluation time.", field="model_path") from None
    return Path(folder), Path(constants.HF_HUB_CACHE)


# --- queueing and control -----------------------------------------------------------------

def run_enqueue(*, run: EvaluationRun) -> None:
    """Mark a run QUEUED and send its task once the transaction commits."""
    job_enqueue(run)


def can_act(user: AbstractBaseUser, run_or_submission: EvaluationRun | Submission) -> bool:
    submission = run_or_submission.submission if isinstance(run_or_submission, EvaluationRun) else run_or_submission
    return user.is_staff or (submission.owner_id == user.pk and has_role(user, RESEARCHER))


def submission_publish(*, user: AbstractBaseUser, submission: Submission) -> bool:
    """Make a submission public (its page, results, options and per-pair predictions), by its
    owner or staff. Publishing is one-way for owners (a published figure may be cited); staff
    can withdraw one in the admin. Returns False if it was already published."""
    if not can_act(user, submission):
        raise PermissionError("Only the submitter or staff can publish this submission.")
    return bool(Submission.objects.filter(pk=submission.pk, published=False)
                .update(published=True, published_at=timezone.now()))


def submission_cancel(*, user: AbstractBaseUser, submission: Submission) -> int:
    """Cancel the submission's unfinished runs; a running task stops at its next chunk."""
    if not can_act(user, submission):
        raise PermissionError("Only the submitter or staff can cancel this submission.")
    return sum(job_cancel(user=user, job=run)
               for run in EvaluationRun.objects.filter(submission=submission, status__in=ACTIVE_STATUSES))


def submission_retry(*, user: AbstractBaseUser, submission: Submission) -> int:
    """Re-queue failed or cancelled runs; pairs already scored are kept and not redone. A run
    whose model was submitted again meanwhile is left alone (that run carries the result)."""
    if not can_act(user, submission):
        raise PermissionError("Only the submitter or staff can retry this submission.")
    retried = 0
    for run in EvaluationRun.objects.filter(submission=submission, status__in=RETRYABLE_STATUSES):
        try:
            job_retry(user=user, job=run)
        except JobRefused:
            continue
        retried += 1
    return retried


# --- executing ----------------------------------------------------------------------------

def run_execute(*, run_id: int) -> str:
    """The body of the evaluation task (see jobs.services.job_execute). Returns the run's final status."""
    return job_execute(EvaluationRun, run_id, _evaluate, expected=(ModelError,))


def _evaluate(run: EvaluationRun) -> dict | None:
    run = EvaluationRun.objects.select_related("submission__benchmark", "submission__judge_backend").get(pk=run.pk)
    _score_missing(run)
    return _summary(run)


def model_spec_for(submission: Submission, *, device: str | None = None) -> "ModelSpec":
    """How the worker loads a submission: its own options (validated against the kind's
    schema when submitted) and a runtime decided by the platform alone (endpoint connection,
    cache, roots), so nothing a researcher typed reaches the worker's configuration."""
    from pipeline.ml.base import ModelSpec

    benchmark_ids = None
    if submission.judge_backend is not None:
        path = submission.model_path  # the model's name at the endpoint
    elif submission.kind == Kind.SCORES:
        path = submission.scores_file.path
        benchmark_ids = list(submission.benchmark.items.values_list("source_id", flat=True))
    else:  # relative to MODELS_ROOT, or the absolute folder of a local Hub snapshot
        path = str(Path(settings.MODELS_ROOT) / submission.model_path)
    runtime = model_runtime(kind=submission.kind, path=path, endpoint=submission.judge_backend,
                            cache_key=submission.weights_hash, benchmark_ids=benchmark_ids)
    return ModelSpec(kind=submission.kind, path=path, device=device or settings.RM_DEVICE, dtype=submission.dtype,
                     max_length=submission.max_length, batch_size=submission.batch_size,
                     profile_k=submission.profile_k, options=dict(submission.options), runtime=runtime)


def _score_missing(run: EvaluationRun) -> None:
    """Score the pairs that have no PairScore yet, a chunk at a time (JobStopped once the run
    was cancelled)."""
    submission = run.submission
    items = (submission.benchmark.items.exclude(pk__in=PairScore.objects.filter(run=run).values("item_id"))
             .order_by("position"))
    if not items.exists():
        return
    model = reward_model_get(model_spec_for(submission))

    def save_chunk(results) -> bool:
        with transaction.atomic():
            PairScore.objects.bulk_create(
                [PairScore(run=run, item=item, chosen_score=r.chosen_score, rejected_score=r.rejected_score,
                           correct=r.correct, tie=r.tie, details=r.details) for item, r in results],
                ignore_conflicts=True)  # a pair scored by an earlier delivery keeps its first score
        job_progress(run, PairScore.objects.filter(run=run).count())
        return True

    before = rm_usage(model)
    chunk = progress_chunk_size(total=run.progress_total or submission.benchmark.item_count,
                                batch_size=submission.batch_size, cap=settings.RUN_CHUNK_PAIRS)
    try:
        rm_score_items(model=model, items=items.iterator(chunk_size=256), setting=run.setting,
                       on_chunk=save_chunk, chunk_size=chunk)
    finally:
        if before is not None:  # what this delivery asked of the judge, added to earlier deliveries'
            spent = {k: v - before.get(k, 0) for k, v in rm_usage(model).items() if isinstance(v, (int, float))}
            previous = (EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk) or {}).get("usage") or {}
            run.metrics = {"usage": {k: spent.get(k, 0) + previous.get(k, 0) for k in spent}}
            EvaluationRun.objects.filter(pk=run.pk).update(metrics=run.metrics)


def _summary(run: EvaluationRun) -> dict:
    """The fields stored with SUCCEEDED: `pipeline.services.rm_summarize` over every stored pair
    (what `evaluate_rm` prints for the same run), with the manifest that reproduces it."""
    rows = PairScore.objects.filter(run=run).order_by("item__position").values_list(
        "item__domain", "correct", "tie", "details", "chosen_score", "rejected_score")
    submission = run.submission
    usage = (EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk) or {}).get("usage")
    metrics = rm_summarize(rows, kind=submission.kind, options=submission.options, usage=usage)
    metrics["manifest"] = manifest(
        kind=submission.kind, setting=run.setting, benchmark=submission.benchmark.name,
        benchmark_content_hash=submission.benchmark.content_hash, weights_hash=submission.weights_hash,
        model=submission.model_path, judge_backend=submission.judge_backend.name if submission.judge_backend else None,
        device=settings.RM_DEVICE, dtype=submission.dtype, max_length=submission.max_length,
        batch_size=submission.batch_size, profile_k=submission.profile_k, options=submission.options)
    return {"metrics": metrics, "progress_done": metrics["n"]}


# --- downstream outcomes and other benchmarks (imports) -----------------------------------------

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


def _read_table(path: Path, model: type[Row]) -> list[tuple[int, Row]]:
    """(line, validated row) from a CSV (header line) or a JSON list / JSON lines file, read as
    UTF-8 with or without BOM and any line ending. Raises ImportRefused naming file, line, field."""
    import csv
    import io
    import json

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
                rows = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RowError(f"invalid JSON ({exc.msg})", file=path.name, line=exc.lineno) from None
            if not isinstance(rows, list):
                raise RowError("expected a JSON list of objects", file=path.name)
            raw = [(i, row) for i, row in enumerate(rows, start=1)]
        else:
            raw = []
            for number, line in text_lines(text):
                try:
                    raw.append((number, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise RowError(f"invalid JSON ({exc.msg}, column {exc.colno})", file=path.name, line=number) \
                        from None
        return [(line, validate(model, row, file=path.name, line=line)) for line, row in raw]
    except csv.Error as exc:
        raise ImportRefused(f"{path.name}: not a readable CSV file ({exc})") from None
    except RowError as exc:
        raise ImportRefused(str(exc)) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ImportRefused(f"{path.name}: invalid JSON ({exc})") from None


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
    from .models import OutcomeKind

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
            outcome_store(**r)
    return len(rows)


def outcome_store(*, submission: Submission | None, rm_name: str, source: str, kind: str, policy: str, setting: str,
                  domain: str, k: int | None, outcome: float, n: int, ci_low: float | None = None,
                  ci_high: float | None = None) -> None:
    """Upsert one downstream outcome under its identity: (submission, kind, policy, setting,
    domain, k) for our RMs, (source, rm_name, kind, policy, setting, domain, k) for others."""
    from .models import DownstreamOutcome

    key = dict(kind=kind, policy=policy, setting=setting, domain=domain, k=k)
    if submission is not None:
        key.update(submission=submission)
    else:
        key.update(submission=None, source=source, rm_name=rm_name)
    DownstreamOutcome.objects.update_or_create(**key, defaults={
        "outcome": outcome, "ci_low": ci_low, "ci_high": ci_high, "n": n, "rm_name": rm_name, "source": source})


def external_scores_import(*, path: Path) -> int:
    """Import accuracies on other benchmarks. All or nothing; returns the row count.

    Rows: benchmark, the RM as `submission` or `rm` + `source` (see `_resolve_rm`), accuracy
    (a fraction, or a percentage when above 1), optional setting (free text: other benchmarks
    have their own). An existing (benchmark, setting, RM) is updated."""
    from .models import ExternalBenchmarkScore

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
                         setting=str(row.get("setting") or "").strip(), accuracy=accuracy, source=source))
    if not rows:
        raise ImportRefused(f"{path.name}: no rows")
    with transaction.atomic():
        for r in rows:
            key = dict(benchmark=r["benchmark"], setting=r["setting"], submission=r["submission"])
            if r["submission"] is None:
                key.update(source=r["source"], rm_name=r["rm_name"])
            ExternalBenchmarkScore.objects.update_or_create(
                **key, defaults={"accuracy": r["accuracy"], "rm_name": r["rm_name"], "source": r["source"]})
    return len(rows)


# --- Best-of-N ---------------------------------------------------------------------------------

RANDOM_BASELINE = "Random selection"


def bon_run_execute(*, run_id: int) -> str:
    """Score a sample set with the run's RM, pick best-of-k for k in 1..N, judge the picks
    against each item's rubric aspects, and store the outcome per k (all domains and each
    domain), with the random-selection baseline judged the same way. Resumable: each sample's
    RM score and each pick's grade is a BestOfNSample row, done once. Returns the final status."""
    from .models import BestOfNRun

    return job_execute(BestOfNRun, run_id, _best_of_n, expected=(ModelError,))


def _chunks(values: list, size: int):
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _best_of_n(run) -> dict:
    from pipeline.downstream import samples_by_item
    from pipeline.ml import bon
    from pipeline.models import BenchmarkItem
    from pipeline.services import item_score_input

    from .models import BestOfNRun, BestOfNSample

    run = BestOfNRun.objects.select_related("submission", "sample_set", "judge").get(pk=run.pk)
    if run.sample_set.status != RunStatus.SUCCEEDED:
        raise ModelError(f"the sample set '{run.sample_set}' is {run.sample_set.status}: sample it first")
    samples = samples_by_item(sample_set=run.sample_set)
    items = {i.pk: i for i in BenchmarkItem.objects.filter(pk__in=samples)}
    ks = bon.k_grid(run.sample_set.n)

    # 1. The RM's score of every sample, a chunk of items at a time.
    scored = set(BestOfNSample.objects.filter(run=run).values_list("item_id", flat=True).distinct())
    todo = [pk for pk in samples if pk not in scored]
    job_progress(run, len(scored), 2 * len(samples))
    if todo:
        model = reward_model_get(model_spec_for(run.submission))
        # Judges and P-GenRM score each sample by its margin over the pair's rubric-blind answer.
        references = None if run.submission.kind == Kind.SCALAR else {str(pk): items[pk].rejected for pk in todo}
        for chunk in _chunks(todo, settings.RUN_CHUNK_PAIRS):
            groups = [item_score_input(items[pk], samples[pk]) for pk in chunk]
            chunk_scores = bon.score_samples(model, groups, setting=run.setting, references=references)
            BestOfNSample.objects.bulk_create(
                [BestOfNSample(run=run, item_id=int(item), index=i, rm_score=v)
                 for item, values in chunk_scores.items() for i, v in enumerate(values)], ignore_conflicts=True)
            scored.update(chunk)
            job_progress(run, len(scored))
    scores: dict[str, list[float]] = {}
    for item, rm_score in BestOfNSample.objects.filter(run=run).order_by("item_id", "index") \
            .values_list("item_id", "rm_score"):
        scores.setdefault(str(item), []).append(rm_score)

    # 2. The judge's grade of each sample some k (or the random baseline) picked, once.
    picks = bon.select_all(scores, ks=ks)
    random_picks = dict(zip(sorted(scores), bon.random_baseline(len(scores), ks=ks, seed=run.sample_set.seed)))
    wanted = {(item, idx) for chosen in (picks, random_picks) for item, by_k in chosen.items()
              for idx in by_k.values()}
    units = BestOfNSample.objects.filter(run=run)
    judged_before = {(str(i), x) for i, x in units.filter(judged=True).values_list("item_id", "index")}
    missing = sorted(wanted - judged_before)
    done = len(judged_before & wanted)
    job_progress(run, len(scores) + done, len(scores) + len(wanted))
    if missing:
        judge = llm_backend(run.judge, run.judge_model)
        requests = [bon.JudgeRequest(key=f"{item}:{idx}", question=items[int(item)].question,
                                     aspects=tuple(items[int(item)].rubric_aspects),
                                     answer=samples[int(item)][idx]) for item, idx in missing]
        for key, score, _raw in bon.judge_answers(judge, requests):
            item, idx = key.rsplit(":", 1)
            units.filter(item_id=int(item), index=int(idx)).update(judged=True, judge_score=score)
            done += 1
            job_progress(run, len(scores) + done)
    judged = {(str(i), x): v for i, x, v in units.filter(judged=True).values_list("item_id", "index", "judge_score")}

    # 3. Outcomes per k, stored for the RM and for the random baseline.
    domains = {str(pk): items[pk].domain for pk in samples}
    results = {name: bon.outcomes({(item, k): judged[(item, idx)] for item, by_k in chosen.items()
                                   for k, idx in by_k.items()}, domains, seed=run.sample_set.seed)
               for name, chosen in (("rm", picks), ("random", random_picks))}
    with transaction.atomic():
        _bon_store(run, run.submission.display_name, results["rm"], submission=run.submission)
        _bon_store(run, RANDOM_BASELINE, results["random"])
    sample_set = run.sample_set
    results["manifest"] = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        benchmark_content_hash=sample_set.benchmark.content_hash, policy=sample_set.policy,
        policy_model=sample_set.model, policy_endpoint=str(sample_set.endpoint or ""), n=sample_set.n,
        temperature=sample_set.temperature, max_tokens=sample_set.max_tokens, seed=sample_set.seed,
        judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE)
    return {"results": results}


def _bon_store(run, rm_name: str, by_k: dict, submission: Submission | None = None) -> None:
    """Outcomes per k (all domains and each domain) of one (RM, setting, policy)."""
    from .models import OutcomeKind

    for k, result in by_k.items():
        scopes = [("", result)] + list((result.get("by_domain") or {}).items())
        for domain, r in scopes:
            if r.get("mean") is None:
                continue
            outcome_store(submission=submission, rm_name=rm_name, source="prbench", kind=OutcomeKind.BEST_OF_N,
                          policy=run.sample_set.policy, setting=run.setting, domain=domain, k=int(k),
                          outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0)


# --- PPO ----------------------------------------------------------------------------------------

def _held_out(source_id: str, fraction: float) -> bool:
    return hashlib.sha256(f"prbench-ppo-split:{source_id}".encode()).digest()[0] < 256 * fraction


def ppo_run_execute(*, run_id: int) -> str:
    """Train the policy with PPO against the run's RM on the benchmark's training questions,
    answer the held-out ones, judge those answers against their rubric aspects and store a
    PPO outcome (all domains and each domain). Only PPO: other trainers' outcomes are imported.
    Resumable: a finished training is kept (results["training"]), and each held-out answer and
    its grade is a PPOAnswer row, done once. Returns the final status."""
    from .models import PPORun

    return job_execute(PPORun, run_id, _ppo, expected=(ModelError,))


def _ppo(run) -> dict:
    from pipeline.ml import bon, ppo
    from pipeline.ml.modelcheck import inspect_model_folder
    from pipeline.services import item_pair_input

    from .models import PPOAnswer, PPORun

    run = PPORun.objects.select_related("submission__benchmark", "judge").get(pk=run.pk)
    if run.submission.kind == Kind.SCORES:
        raise ModelError("uploaded scores cannot score new answers: PPO needs a model "
                         "(import outcomes computed elsewhere instead)")
    items = list(run.submission.benchmark.items.order_by("position"))
    train = [i for i in items if not _held_out(i.source_id, run.eval_fraction)]
    held = [i for i in items if _held_out(i.source_id, run.eval_fraction)]
    if len(train) < run.batch_size or not held:
        raise ModelError(f"{len(train)} training and {len(held)} held-out questions: too few for batch size "
                         f"{run.batch_size}")
    total = run.steps + 2 * len(held)  # training steps, then an answer and a grade per held-out question

    # 1. Training (one unit: a killed training starts again; a finished one is kept).
    training = (run.results or {}).get("training")
    if not training or not Path(training["out_dir"]).is_dir():
        job_progress(run, 0, total)
        rows = [{"id": i.source_id, "question": i.question, "profile_texts": list(item_pair_input(i).profile)}
                for i in train]
        prepared = ppo.policy_prompts(rows, plans={i.source_id: i.plan for i in train})
        rm = reward_model_get(model_spec_for(run.submission))
        if run.submission.kind == Kind.SCALAR:
            reward = ppo.TextRewardModule(ppo.scalar_scorer(rm, setting=run.setting, contexts=prepared.contexts))
        else:
            # Judges compare answers: the reward is the margin over the pair's rubric-blind answer;
            # an unparseable judgement counts as no margin (training needs a number; evaluation never
            # defaults, but a missing reward here only slows learning).
            scorer = ppo.pairwise_scorer(rm, setting=run.setting, contexts=prepared.contexts,
                                         references={i.source_id: i.rejected for i in train})
            reward = ppo.TextRewardModule(scorer, missing_score=0.0)
        policy = inspect_model_folder(Path(settings.MODELS_ROOT) / run.policy_model,
                                      models_root=Path(settings.MODELS_ROOT), task="causal-lm")
        out_dir = Path(settings.VAR_DIR) / "ppo" / f"run-{run.pk}-{secrets.token_hex(4)}"
        steps_done = [0]

        def step_done(n: int) -> None:
            steps_done[0] += n
            job_progress(run, min(steps_done[0], run.steps))

        training = ppo.train_ppo(policy_path=policy.path, reward=reward, prompts=prepared.prompts,
                                 reward_prompts=prepared.reward_prompts, out_dir=out_dir, steps=run.steps,
                                 batch_size=run.batch_size, seed=run.seed, response_length=run.response_length,
                                 device=settings.RM_DEVICE, progress=step_done).as_dict()
        PPORun.objects.filter(pk=run.pk).update(results={"training": training})

    # 2. The trained policy answers each held-out question not answered yet.
    answered = set(PPOAnswer.objects.filter(run=run).values_list("item_id", flat=True))
    job_progress(run, run.steps + len(answered), total)
    for chunk in _chunks([i for i in held if i.pk not in answered], 16):
        rows = [{"id": i.source_id, "question": i.question, "profile_texts": list(item_pair_input(i).profile)}
                for i in chunk]
        answers = ppo.generate_answers(training["out_dir"], ppo.policy_prompts(rows).prompts,
                                       max_new_tokens=run.response_length, seed=run.seed)
        PPOAnswer.objects.bulk_create([PPOAnswer(run=run, item=i, answer=a) for i, a in zip(chunk, answers)],
                                      ignore_conflicts=True)
        answered.update(i.pk for i in chunk)
        job_progress(run, run.steps + len(answered))

    # 3. The judge grades each answer not graded yet (questions without rubric aspects are skipped).
    graded = PPOAnswer.objects.filter(run=run, item__in=[i for i in held if i.rubric_aspects])
    todo = list(graded.filter(judged=False).select_related("item"))
    done = graded.filter(judged=True).count()
    if todo:
        judge = llm_backend(run.judge, run.judge_model)
        requests = [bon.JudgeRequest(key=a.pk, question=a.item.question, aspects=tuple(a.item.rubric_aspects),
                                     answer=a.answer) for a in todo]
        for key, score, _raw in bon.judge_answers(judge, requests):
            PPOAnswer.objects.filter(pk=key).update(judged=True, judge_score=score)
            done += 1
            job_progress(run, run.steps + len(held) + done)
    judged = {(source_id, 0): score for source_id, score in
              graded.filter(judged=True).values_list("item__source_id", "judge_score")}
    outcome = bon.outcomes(judged, {i.source_id: i.domain for i in held}, seed=run.seed)[0]
    _store_trained_outcome(run, outcome)
    return {"results": {"training": training, "outcome": outcome, "manifest": manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        benchmark_content_hash=run.submission.benchmark.content_hash, policy=run.policy,
        policy_model=run.policy_model, steps=run.steps, batch_size=run.batch_size,
        response_length=run.response_length, seed=run.seed, eval_fraction=run.eval_fraction,
        judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE)}, "progress_done": total}


def _store_trained_outcome(run, outcome: dict) -> None:
    from .models import OutcomeKind

    scopes = [("", outcome)] + list((outcome.get("by_domain") or {}).items())
    for domain, r in scopes:
        if r.get("mean") is None:
            continue
        outcome_store(submission=run.submission, rm_name=run.submission.display_name, source="prbench",
                      kind=OutcomeKind.PPO, policy=run.policy, setting=run.setting, domain=domain, k=None,
                      outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0)
