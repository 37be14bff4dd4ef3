"""Submissions and evaluation runs: validation, queueing, execution, recovery.

A run's life: PENDING -> QUEUED -> RUNNING (progress, heartbeat) -> SUCCEEDED | FAILED |
CANCELLED. Work is claimed with conditional UPDATEs, so two deliveries of the same task
never both run it; per-pair scores are unique per (run, item), so a retried, re-queued
or redelivered run scores only what is still missing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import socket
import tempfile
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from pipeline.endpoints import llm_backend, model_runtime
from pipeline.manifest import manifest
from pipeline.ml.base import ModelError
from pipeline.models import Benchmark, LLMEndpoint
from pipeline.services import benchmark_freeze, reward_model_get, rm_score_items, rm_summarize
from prbench.roles import RESEARCHER, has_role

from .models import (
    ACTIVE_STATUSES, EvaluationRun, Kind, PairScore, RunStatus, Setting, Submission,
)

if TYPE_CHECKING:
    from pipeline.ml.base import ModelSpec

log = logging.getLogger(__name__)

AVAILABLE_KINDS = (Kind.SCALAR, Kind.PAIRWISE, Kind.POINTWISE, Kind.SCORES, Kind.PGENRM)
GENERATIVE_KINDS = (Kind.PAIRWISE, Kind.POINTWISE, Kind.PGENRM)


class SubmissionRefused(Exception):
    """A submission that cannot be queued; `field` names the form field at fault."""

    def __init__(self, message: str, *, field: str | None = None, link: str | None = None):
        super().__init__(message)
        self.field, self.link = field, link


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
    if not request.display_name.strip():
        raise SubmissionRefused("Give the submission a display name.", field="display_name")
    benchmark = Benchmark.objects.filter(name=request.benchmark).first()
    if benchmark is None:
        raise SubmissionRefused(f"No benchmark named '{request.benchmark}'.", field="benchmark")
    if request.kind not in Kind.values:
        raise SubmissionRefused(f"Unknown kind '{request.kind}'.", field="kind")
    if request.kind not in AVAILABLE_KINDS:
        raise SubmissionRefused(f"The {Kind(request.kind).label} kind is not available yet.", field="kind")
    chosen_settings = tuple(dict.fromkeys(request.settings))
    if not chosen_settings or any(s not in Setting.values for s in chosen_settings):
        raise SubmissionRefused(f"Choose settings among {', '.join(Setting.values)}.", field="settings")
    if request.kind == Kind.SCORES and len(chosen_settings) != 1:
        raise SubmissionRefused("A scores file was computed in exactly one setting: choose that one "
                                f"(got {', '.join(chosen_settings)}).", field="settings")
    _check_name_free(user, request.display_name.strip())
    if not 1 <= request.batch_size <= 512:
        raise SubmissionRefused("Batch size must be between 1 and 512.", field="batch_size")
    if not 64 <= request.max_length <= 131072:
        raise SubmissionRefused("Max length must be between 64 and 131072 tokens.", field="max_length")
    if not 0 <= request.profile_k <= 50:
        raise SubmissionRefused("Profile posts (k) must be between 0 and 50.", field="profile_k")

    options = _check_options(request.kind, request.options)
    model_path, backend, weights_hash, parameters = _check_model(request, benchmark)
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
        get_user_model().objects.filter(pk=user.pk).update(is_active=F("is_active"))  # request.user is lazy
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
        digest = hashlib.sha256()
        (Path(settings.VAR_DIR) / "tmp").mkdir(exist_ok=True)
        # Checked under the uploaded file's own name, so messages name the file the user sent;
        # streamed in chunks, so a large upload is never held in the web process's memory.
        with tempfile.TemporaryDirectory(dir=Path(settings.VAR_DIR) / "tmp") as tmp:
            path = Path(tmp) / (Path(upload.name or "scores.jsonl").name or "scores.jsonl")
            upload.seek(0)
            with open(path, "wb") as fh:
                for chunk in upload.chunks():
                    digest.update(chunk)
                    fh.write(chunk)
            try:
                parse_scores_file(path, expected_ids=set(benchmark.items.values_list("source_id", flat=True)))
            except ModelError as exc:
                raise SubmissionRefused(str(exc), field="scores_file") from None
        return "", None, digest.hexdigest(), None

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
        raise SubmissionRefused(str(exc), field="model_path") from None
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
    if kind == Kind.PGENRM and (parsed.n > 0 or parsed.prototypes):
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
    from .tasks import evaluate_run

    EvaluationRun.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, queued_at=timezone.now(),
                                                   error="", heartbeat_at=None, worker="")
    evaluate_run.delay_on_commit(run.pk)


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
    return (EvaluationRun.objects.filter(submission=submission, status__in=ACTIVE_STATUSES)
            .update(status=RunStatus.CANCELLED, finished_at=timezone.now(), error="Cancelled by " + user.get_username()))


def submission_retry(*, user: AbstractBaseUser, submission: Submission) -> int:
    """Re-queue failed or cancelled runs; pairs already scored are kept and not redone."""
    if not can_act(user, submission):
        raise PermissionError("Only the submitter or staff can retry this submission.")
    retried = 0
    with transaction.atomic():
        for run in EvaluationRun.objects.select_for_update().filter(
                submission=submission, status__in=[RunStatus.FAILED, RunStatus.CANCELLED]):
            clash = (EvaluationRun.objects.filter(fingerprint=run.fingerprint, setting=run.setting)
                     .exclude(pk=run.pk).exclude(status__in=[RunStatus.FAILED, RunStatus.CANCELLED]).exists())
            if clash:
                continue  # the same model was submitted again meanwhile; that run carries the result
            run.finished_at = None
            run.save(update_fields=["finished_at"])
            run_enqueue(run=run)
            retried += 1
    return retried


def runs_recover_stale(*, stale_after: timedelta | None = None) -> list[int]:
    """Re-queue RUNNING runs whose worker stopped sending heartbeats (killed, lost power,
    OOM); after RUN_MAX_ATTEMPTS deliveries the run fails instead of looping forever.

    The broker alone cannot be trusted here: Redis redelivers an unacknowledged message
    only after its visibility timeout, and the filesystem transport loses it."""
    stale_after = stale_after or timedelta(seconds=settings.RUN_STALE_SECONDS)
    cutoff = timezone.now() - stale_after
    recovered = []
    for run in EvaluationRun.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=cutoff):
        if run.attempts >= settings.RUN_MAX_ATTEMPTS:
            EvaluationRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, heartbeat_at=run.heartbeat_at).update(
                status=RunStatus.FAILED, finished_at=timezone.now(),
                error=f"The worker running this was lost {run.attempts} times (last: {run.worker}); giving up.")
            continue
        with transaction.atomic():
            # Conditional: only if nobody touched the run since we read it.
            changed = EvaluationRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING,
                                                   heartbeat_at=run.heartbeat_at).update(status=RunStatus.QUEUED)
            if changed:
                log.warning("run %s: no heartbeat from %s since %s; re-queued", run.pk, run.worker, run.heartbeat_at)
                run_enqueue(run=run)
                recovered.append(run.pk)
    return recovered


# --- executing ----------------------------------------------------------------------------

def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Heartbeat:
    """Touches the run's heartbeat from a background thread while the task works, so a
    long model load or a slow batch does not look like a dead worker."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(settings.RUN_HEARTBEAT_SECONDS):
                EvaluationRun.objects.filter(pk=self.run_id, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now())
        finally:
            connection.close()


def run_execute(*, run_id: int) -> str:
    """The body of the evaluation task. Returns the run's final status."""
    now = timezone.now()
    claimed = EvaluationRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.RUNNING, heartbeat_at=now, worker=worker_id(), attempts=F("attempts") + 1, error="")
    if not claimed:
        status = EvaluationRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        log.info("run %s is %s; this delivery has nothing to do", run_id, status)
        return status or "MISSING"
    EvaluationRun.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=now)
    run = EvaluationRun.objects.select_related("submission__benchmark", "submission__judge_backend").get(pk=run_id)
    try:
        with _Heartbeat(run.pk):
            finished = _score_missing(run)
        if finished:
            return run_finalize(run=run)
        return EvaluationRun.objects.values_list("status", flat=True).get(pk=run.pk)
    except BaseException as exc:
        reason = _readable_reason(exc)
        EvaluationRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, error=reason, log_tail=traceback.format_exc()[-4000:],
            finished_at=timezone.now())
        log.warning("run %s failed: %s", run.pk, reason)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return RunStatus.FAILED


def _readable_reason(exc: BaseException) -> str:
    from celery.exceptions import SoftTimeLimitExceeded

    if isinstance(exc, SoftTimeLimitExceeded):
        return f"Stopped by the time limit ({settings.CELERY_TASK_SOFT_TIME_LIMIT} s)."
    if isinstance(exc, ModelError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


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


def _score_missing(run: EvaluationRun) -> bool:
    """Score the pairs that have no PairScore yet. False if the run was cancelled meanwhile."""
    submission = run.submission
    items = (submission.benchmark.items.exclude(pk__in=PairScore.objects.filter(run=run).values("item_id"))
             .order_by("position"))
    if not items.exists():
        return True
    model = reward_model_get(model_spec_for(submission))

    def save_chunk(results) -> bool:
        """Store a chunk; False stops the loop when the run is no longer RUNNING (cancelled)."""
        with transaction.atomic():
            PairScore.objects.bulk_create(
                [PairScore(run=run, item=item, chosen_score=r.chosen_score, rejected_score=r.rejected_score,
                           correct=r.correct, tie=r.tie, details=r.details) for item, r in results],
                ignore_conflicts=True)  # a pair scored by an earlier delivery keeps its first score
            done = PairScore.objects.filter(run=run).count()
            return bool(EvaluationRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                progress_done=done, heartbeat_at=timezone.now()))

    before = _usage(model)
    finished = rm_score_items(model=model, items=items.iterator(chunk_size=256), setting=run.setting,
                              on_chunk=save_chunk, chunk_size=settings.RUN_CHUNK_PAIRS)
    if before is not None:
        spent = {k: v - before.get(k, 0) for k, v in _usage(model).items() if isinstance(v, (int, float))}
        previous = (EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk) or {}).get("usage") or {}
        run.metrics = {"usage": {k: spent.get(k, 0) + previous.get(k, 0) for k in spent}}
        EvaluationRun.objects.filter(pk=run.pk).update(metrics=run.metrics)
    return finished


def _usage(model) -> dict | None:
    """Requests, tokens and cost so far of a generative RM's backends (None for other kinds)."""
    usage = getattr(model, "usage", None)
    return usage() if callable(usage) else None


def run_finalize(*, run: EvaluationRun) -> str:
    """Summarise a fully scored run with `pipeline.services.rm_summarize` (what `evaluate_rm`
    prints) and mark it SUCCEEDED."""
    rows = PairScore.objects.filter(run=run).values_list(
        "item__domain", "correct", "tie", "details", "chosen_score", "rejected_score")
    submission = run.submission
    metrics = rm_summarize(rows, kind=submission.kind, options=submission.options,
                           usage=(run.metrics or {}).get("usage"))
    metrics["manifest"] = manifest(
        kind=submission.kind, setting=run.setting, benchmark=submission.benchmark.name,
        benchmark_content_hash=submission.benchmark.content_hash, weights_hash=submission.weights_hash,
        model=submission.model_path, judge_backend=submission.judge_backend.name if submission.judge_backend else None,
        device=settings.RM_DEVICE, dtype=submission.dtype, max_length=submission.max_length,
        batch_size=submission.batch_size, profile_k=submission.profile_k, options=submission.options)
    done = EvaluationRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
        status=RunStatus.SUCCEEDED, metrics=metrics, progress_done=metrics["n"], finished_at=timezone.now())
    return RunStatus.SUCCEEDED if done else EvaluationRun.objects.values_list("status", flat=True).get(pk=run.pk)


# --- downstream outcomes and other benchmarks (imports) -----------------------------------------

class ImportRefused(Exception):
    """A file refused whole; the message names the line and field."""


def _read_table(path: Path) -> list[tuple[int, dict]]:
    """(line, row) from a CSV (header line) or a JSON list / JSON lines file."""
    import csv
    import json

    text = Path(path).read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return [(i + 2, dict(row)) for i, row in enumerate(csv.DictReader(text.splitlines()))]
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            return [(i + 1, row) for i, row in enumerate(json.loads(text))]
        return [(i, json.loads(line)) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    except json.JSONDecodeError as exc:
        raise ImportRefused(f"{path.name}: invalid JSON ({exc.msg}, line {exc.lineno})") from None


def _number(row: dict, key: str, line: int, name: str, *, integer: bool = False, required: bool = True):
    import math

    value = row.get(key)
    if value in (None, ""):
        if required:
            raise ImportRefused(f"{name}, line {line}, field '{key}': missing")
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise ImportRefused(f"{name}, line {line}, field '{key}': {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ImportRefused(f"{name}, line {line}, field '{key}': must be finite")
    return number


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
    from .models import DownstreamOutcome, OutcomeKind

    path, rows = Path(path), []
    for line, row in _read_table(path):
        if not isinstance(row, dict):
            raise ImportRefused(f"{path.name}, line {line}: expected an object")
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
    for line, row in _read_table(path):
        if not isinstance(row, dict):
            raise ImportRefused(f"{path.name}, line {line}: expected an object")
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
    domain), with the random-selection baseline judged the same way."""
    from pipeline.downstream import samples_by_item
    from pipeline.ml import bon
    from pipeline.models import BenchmarkItem
    from pipeline.services import item_score_input

    from .models import BestOfNRun

    if not BestOfNRun.objects.filter(pk=run_id, status__in=[RunStatus.PENDING, RunStatus.QUEUED, RunStatus.FAILED]) \
            .update(status=RunStatus.RUNNING, error=""):
        return BestOfNRun.objects.values_list("status", flat=True).get(pk=run_id)
    run = BestOfNRun.objects.select_related("submission", "sample_set", "judge").get(pk=run_id)
    try:
        samples = samples_by_item(sample_set=run.sample_set)
        items = {i.pk: i for i in BenchmarkItem.objects.filter(pk__in=samples)}
        ks = tuple(k for k in bon.KS if k <= run.sample_set.n)
        groups = [item_score_input(items[pk], texts) for pk, texts in samples.items()]
        model = reward_model_get(model_spec_for(run.submission))
        # Judges and P-GenRM score each sample by its margin over the pair's rubric-blind answer.
        references = None if run.submission.kind == Kind.SCALAR else {str(pk): items[pk].rejected for pk in samples}
        scores = bon.score_samples(model, groups, setting=run.setting, references=references)
        picks = bon.select_all(scores, ks=ks)
        random_picks = dict(zip(sorted(scores), bon.random_baseline(len(scores), ks=ks, seed=run.sample_set.seed)))
        judged = _bon_judge(run, items, samples, {"rm": picks, "random": random_picks})
        domains = {str(pk): items[pk].domain for pk in samples}
        results = {name: bon.outcomes({(item, k): judged[(item, idx)] for item, by_k in chosen.items()
                                       for k, idx in by_k.items()}, domains, seed=run.sample_set.seed)
                   for name, chosen in (("rm", picks), ("random", random_picks))}
    except Exception as exc:
        BestOfNRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=_readable_reason(exc))
        return RunStatus.FAILED
    _bon_store(run, run.submission.display_name, results["rm"], submission=run.submission)
    _bon_store(run, RANDOM_BASELINE, results["random"])
    sample_set = run.sample_set
    results["manifest"] = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        benchmark_content_hash=sample_set.benchmark.content_hash, policy=sample_set.policy,
        policy_model=sample_set.model, policy_endpoint=str(sample_set.endpoint or ""), n=sample_set.n,
        temperature=sample_set.temperature, max_tokens=sample_set.max_tokens, seed=sample_set.seed,
        judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE)
    BestOfNRun.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, results=results)
    return RunStatus.SUCCEEDED


def _bon_judge(run, items, samples, selections) -> dict[tuple[str, int], float | None]:
    """Each distinct (item, sample) picked by anyone is judged once (answers are cached too)."""
    from pipeline.ml import bon

    wanted = {(item, idx) for chosen in selections.values() for item, by_k in chosen.items()
              for idx in by_k.values()}
    judge = llm_backend(run.judge, run.judge_model)
    requests = [bon.JudgeRequest(key=f"{item}:{idx}", question=items[int(item)].question,
                                 aspects=tuple(items[int(item)].rubric_aspects),
                                 answer=samples[int(item)][idx]) for item, idx in sorted(wanted)]
    out = {}
    for key, score, _raw in bon.judge_answers(judge, requests):
        item, idx = key.rsplit(":", 1)
        out[(item, int(idx))] = score
    return out


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
    PPO outcome (all domains and each domain). Only PPO: other trainers' outcomes are imported."""
    from pipeline.ml import bon, ppo
    from pipeline.ml.modelcheck import inspect_model_folder
    from pipeline.services import item_pair_input

    from .models import PPORun

    if not PPORun.objects.filter(pk=run_id, status__in=[RunStatus.PENDING, RunStatus.QUEUED, RunStatus.FAILED]) \
            .update(status=RunStatus.RUNNING, error=""):
        return PPORun.objects.values_list("status", flat=True).get(pk=run_id)
    run = PPORun.objects.select_related("submission__benchmark", "judge").get(pk=run_id)
    try:
        if run.submission.kind == Kind.SCORES:
            raise ModelError("uploaded scores cannot score new answers: PPO needs a model "
                             "(import outcomes computed elsewhere instead)")
        items = list(run.submission.benchmark.items.order_by("position"))
        train = [i for i in items if not _held_out(i.source_id, run.eval_fraction)]
        held = [i for i in items if _held_out(i.source_id, run.eval_fraction)]
        if len(train) < run.batch_size or not held:
            raise ModelError(f"{len(train)} training and {len(held)} held-out questions: too few for batch size "
                              f"{run.batch_size}")
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
        trained = ppo.train_ppo(policy_path=policy.path, reward=reward, prompts=prepared.prompts,
                                reward_prompts=prepared.reward_prompts, out_dir=out_dir, steps=run.steps,
                                batch_size=run.batch_size, seed=run.seed, response_length=run.response_length,
                                device=settings.RM_DEVICE)
        held_rows = [{"id": i.source_id, "question": i.question, "profile_texts": list(item_pair_input(i).profile)}
                     for i in held]
        answers = ppo.generate_answers(trained.out_dir, ppo.policy_prompts(held_rows).prompts,
                                       max_new_tokens=run.response_length, seed=run.seed)
        judge = llm_backend(run.judge, run.judge_model)
        requests = [bon.JudgeRequest(key=i.source_id, question=i.question, aspects=tuple(i.rubric_aspects),
                                     answer=a) for i, a in zip(held, answers) if i.rubric_aspects]
        judged = {(key, 0): score for key, score, _raw in bon.judge_answers(judge, requests)}
        outcome = bon.outcomes(judged, {i.source_id: i.domain for i in held}, seed=run.seed)[0]
    except Exception as exc:
        PPORun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error=_readable_reason(exc))
        return RunStatus.FAILED
    _store_trained_outcome(run, outcome)
    PPORun.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, results={
        "training": trained.as_dict(), "outcome": outcome, "manifest": manifest(
            rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
            benchmark_content_hash=run.submission.benchmark.content_hash, policy=run.policy,
            policy_model=run.policy_model, steps=run.steps, batch_size=run.batch_size,
            response_length=run.response_length, seed=run.seed, eval_fraction=run.eval_fraction,
            judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE)})
    return RunStatus.SUCCEEDED


def _store_trained_outcome(run, outcome: dict) -> None:
    from .models import OutcomeKind

    scopes = [("", outcome)] + list((outcome.get("by_domain") or {}).items())
    for domain, r in scopes:
        if r.get("mean") is None:
            continue
        outcome_store(submission=run.submission, rm_name=run.submission.display_name, source="prbench",
                      kind=OutcomeKind.PPO, policy=run.policy, setting=run.setting, domain=domain, k=None,
                      outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0)
