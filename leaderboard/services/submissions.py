"""Submitting reward models: validation before any GPU is involved, the queueing of one
evaluation run per setting, and the owner's controls (publish, cancel, retry)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from jobs.models import ACTIVE_STATUSES, RETRYABLE_STATUSES
from jobs.services import JobRefused, job_cancel, job_enqueue, job_retry, redact_server_paths
from pipeline.models import Benchmark, LLMEndpoint
from pipeline.services import configuration  # noqa: I001 (a result's identity: pipeline.manifest.configuration)
from pipeline.services import benchmark_freeze, endpoint_model_refusal
from prblib.errors import ModelError
from prblib.rewards.options import OptionsError, parse_options
from prblib.rows import content_sha256
from prblib.modelcheck import inspect_model_folder
from prblib.rewards.scores import parse_scores_file
from prblib.rewards import presets
from prblib import registry
from pipeline.services import spend_estimate, spend_refusal, spend_reserved
from core.roles import RESEARCHER, has_role

from .. import identity
from ..models import EvaluationRun, Kind, PairScore, RunStatus, Setting, Submission, SubmissionAttempt

AVAILABLE_KINDS = registry.kind_names()
GENERATIVE_KINDS = registry.generative_kind_names()


class SubmissionRefused(Exception):
    """A submission that cannot be queued. `errors` maps each form field at fault (None: the
    form as a whole) to its messages, every problem found at once; `field` and the message are
    the first of them. `status`: the HTTP answer (400; 429 for the hourly limit)."""

    def __init__(self, message: str, *, field: str | None = None, link: str | None = None,
                 errors: dict[str | None, list[str]] | None = None, status: int = 400):
        # The submitter reads it: the server's folders are named, never spelled out (<models>...).
        message = redact_server_paths(str(message))
        super().__init__(message)
        self.field, self.link, self.status = field, link, status
        self.errors = {key: [redact_server_paths(str(m)) for m in messages]
                       for key, messages in (errors or {field: [message]}).items()}


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
    preset: str = ""  # a model preset (prblib/rewards/presets.py): fixes the kind and sets options


# --- submitting ---------------------------------------------------------------------------

def submission_create(*, user: AbstractBaseUser, request: SubmissionRequest) -> Submission:
    """Validate everything that can be checked before a GPU is involved, then queue one run
    per setting. Raises SubmissionRefused with a message for the form or the API.
    The attempt counts toward the hourly limit from here on, whatever its outcome."""
    if not has_role(user, RESEARCHER):
        raise SubmissionRefused("Submitting reward models needs the researcher role.")
    attempt = submission_attempt_begin(user=user)
    problems = _Problems()
    request = _apply_preset(request, problems)
    if not request.display_name.strip():
        problems.add("Give the submission a display name.", "display_name")
    benchmark = Benchmark.objects.filter(name=request.benchmark).first()
    if benchmark is None:
        problems.add(f"No benchmark named '{request.benchmark}'.", "benchmark")
    kind_known = request.kind in AVAILABLE_KINDS
    if request.kind and request.kind not in Kind.values:
        problems.add(f"Unknown kind '{request.kind}'.", "kind")
    elif request.kind and not kind_known:
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
        if kind_known and registry.kind(request.kind).single_setting and len(chosen_settings) != 1:
            problems.add(f"The {registry.kind(request.kind).label} kind runs in exactly one setting: choose the one "
                         f"its results were computed in (got {', '.join(chosen_settings)}).", "settings")
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
    else:
        for setting_name in chosen_settings:  # e.g. protocol 'release' runs only where the release has a counterpart
            refusal = parse_options(request.kind, options).setting_refusal(setting_name)
            if refusal:
                problems.add(refusal[:1].upper() + refusal[1:] + ".", "settings")
                break
    try:
        checked = _check_model(request, benchmark)
    except SubmissionRefused as exc:
        problems.absorb(exc)
    problems.raise_any()
    model_path, backend, weights_hash, parameters = checked
    if backend is not None:  # the endpoint's spend caps, against what the runs would spend at most
        estimate = spend_estimate(kind=request.kind, options=options, endpoint=backend,
                                  texts=list(benchmark.items.values_list("question", "chosen", "rejected")))
        refusal = spend_refusal(endpoint=backend, owner_id=user.pk, run=estimate, estimate=True,
                                runs=len(chosen_settings), reserved=_spend_reserved(user, backend))
        if refusal:
            raise SubmissionRefused(f"Not queued: {refusal} ({benchmark.item_count} pairs x {estimate['per_pair']} "
                                    "requests, each with its max_tokens); lower the options or ask staff.",
                                    field="options")
    # A model folder's weights are hashed on the worker (identity.run_identify); others are known now.
    # Scoped to the owner and the configuration (identity.fingerprint_of): another researcher's copy is evaluated.
    fingerprint = identity.fingerprint_of(
        weights_hash, request.kind, benchmark, options, owner_id=user.pk,
        config=configuration(kind=request.kind, options=options, dtype=request.dtype,
                             max_length=request.max_length, profile_k=request.profile_k)) if weights_hash else ""

    saved_file = None
    try:
        with transaction.atomic():
            # The owner's row lock serializes this owner's concurrent submissions: the rate limit,
            # the name and the duplicate are decided again here, each seeing the others' commits;
            # the unique constraint on (fingerprint, setting) decides across owners.
            _check_rate_limit(user, lock=True, attempt=attempt)
            _check_name_free(user, request.display_name.strip())
            duplicate = fingerprint and identity.duplicate_of(fingerprint, chosen_settings, user=user,
                                                              benchmark_name=benchmark.name)
            if duplicate:
                raise SubmissionRefused(duplicate.message, field="model_path", link=duplicate.link)
            submission = Submission.objects.create(
                owner=user, display_name=request.display_name.strip(), benchmark=benchmark, kind=request.kind,
                model_path=model_path, judge_backend=backend, weights_hash=weights_hash, dtype=request.dtype,
                max_length=request.max_length, batch_size=request.batch_size, profile_k=request.profile_k,
                options=options, parameters=request.parameters or parameters,
                license=request.license, link=request.link)
            SubmissionAttempt.objects.filter(pk=attempt).delete()  # the submission counts now
            benchmark_freeze(benchmark=benchmark)  # results now refer to these exact items
            runs = EvaluationRun.objects.bulk_create([
                EvaluationRun(submission=submission, setting=s,
                              fingerprint=fingerprint or identity.pending_fingerprint(submission.pk),
                              progress_total=benchmark.item_count) for s in chosen_settings])
            if request.scores_file is not None:  # last: nothing is written to disk for a refused submission
                request.scores_file.seek(0)
                submission.scores_file.save(f"{submission.pk}-{weights_hash[:12]}.jsonl", request.scores_file,
                                            save=True)
                saved_file = submission.scores_file.name
            for run in runs:
                run_enqueue(run=run)
    except BaseException as exc:
        if saved_file and not Submission.objects.filter(scores_file=saved_file).exists():
            submission.scores_file.storage.delete(saved_file)  # rolled back: no orphan file stays
        if isinstance(exc, IntegrityError):
            # Another submission of the same model committed between our look and our insert.
            found = fingerprint and identity.duplicate_of(fingerprint, chosen_settings, user=user,
                                                          benchmark_name=benchmark.name)
            raise SubmissionRefused(found.message if found else "This model was submitted again at the same moment; "
                                    "the other submission carries the result.", field="model_path",
                                    link=found.link if found else None) from None
        raise
    return submission


def _apply_preset(request: SubmissionRequest, problems: _Problems) -> SubmissionRequest:
    """The request with its preset expanded (kind and options, `presets.expand`); an unknown preset, one
    of another kind, or a hosted preset without a judge backend is a problem on its field."""
    if not request.preset:
        if not request.kind:
            problems.add("Choose a kind, or a preset.", "kind")
        return request
    try:
        entry = presets.preset(request.preset)
        if not isinstance(request.options, dict | None):
            return dataclasses.replace(request, kind=request.kind or entry.kind)
        kind, options = presets.expand(request.preset, request.kind, request.options)
    except presets.UnknownPreset as exc:
        problems.add(str(exc)[:1].upper() + str(exc)[1:] + ".", "preset")
        return request
    if entry.needs_endpoint and not request.judge_backend:
        problems.add(f"Preset {entry.name} runs on a judge backend configured by staff: choose one.", "judge_backend")
    return dataclasses.replace(request, kind=kind, options=options)


SETTING_NEEDS = {s.name: s.needs_hint for s in registry.SETTINGS if s.needs}


def benchmark_settings(*, benchmark: Benchmark) -> tuple[str, ...]:
    """The settings a run on `benchmark` can succeed in: `plan` only when every pair has
    planner aspects (a run fails on the first pair without)."""
    supported = [s.name for s in registry.SETTINGS if s.needs is None]
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


def submission_rate_check(*, user: AbstractBaseUser) -> None:
    """SubmissionRefused (429) if the researcher has no attempt left this hour. Cheap (two
    counts): views ask before reading an upload. Records nothing (submission_attempt_begin does)."""
    _check_rate_limit(user)


def submission_attempt_begin(*, user: AbstractBaseUser) -> int | None:
    """Count a submission attempt before anything of it is read or checked: refused (429) when
    the researcher's submissions and attempts of the last hour reach SUBMISSIONS_PER_HOUR,
    else recorded (a SubmissionAttempt, whose id is returned) and counted until it becomes a
    submission. Decided under the owner's row lock, so concurrent attempts count one after
    another: of a burst, only as many as the limit leaves get past here. Staff: not counted (None)."""
    if user.is_staff:
        return None
    with transaction.atomic():
        _check_rate_limit(user, lock=True)
        SubmissionAttempt.objects.filter(owner=user, created_at__lt=timezone.now() - timedelta(hours=1)).delete()
        return SubmissionAttempt.objects.create(owner=user).pk


def submission_attempt_refused(*, user: AbstractBaseUser) -> None:
    """Count an attempt refused before it reached submission_create (an upload over MAX_UPLOAD_MB)."""
    if not user.is_staff:
        SubmissionAttempt.objects.create(owner=user)


def _check_rate_limit(user: AbstractBaseUser, *, lock: bool = False, attempt: int | None = None) -> None:
    """At most SUBMISSIONS_PER_HOUR submission attempts per researcher per rolling hour (staff:
    none): submissions made and attempts under way or refused count alike (`attempt`, the
    caller's own, is not counted against itself).

    With lock=True (inside a transaction) the researcher's user row is first written with its
    own value: on PostgreSQL that row lock, and on SQLite the database write lock, is held until
    commit, so concurrent attempts of one researcher count and insert one after another and
    cannot all see room for one more."""
    if lock:  # staff too: the lock also serializes the name and duplicate checks
        # get_user_model(), not type(user): a view's request.user is a SimpleLazyObject.
        get_user_model().objects.filter(pk=user.pk).update(is_active=F("is_active"))
    if user.is_staff:
        return
    limit = settings.SUBMISSIONS_PER_HOUR
    since = timezone.now() - timedelta(hours=1)
    recent = (Submission.objects.filter(owner=user, created_at__gte=since).count()
              + SubmissionAttempt.objects.filter(owner=user, created_at__gte=since).exclude(pk=attempt).count())
    if recent >= limit:
        raise SubmissionRefused(f"You reached the limit of {limit} submission attempts per hour (SUBMISSIONS_PER_HOUR; "
                                "refused ones count too); try again later.", status=429)


MAX_SHOWN_NAME_BYTES = 120  # file systems hold names of up to 255 bytes; messages need less


def upload_shown_name(name: str | None, default: str = "scores.jsonl") -> str:
    """An uploaded file's own name (its last part) as messages name it and as its temporary copy
    is called: cut to MAX_SHOWN_NAME_BYTES of UTF-8, the extension kept, so any name the client
    sends (a 400-byte one in another script, say) can name a file here."""
    name = Path(name or "").name or default
    if len(name.encode()) <= MAX_SHOWN_NAME_BYTES:
        return name
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem or len(suffix.encode()) > 16:
        stem, suffix = name, ""
    room = MAX_SHOWN_NAME_BYTES - len("….".encode()) - len(suffix.encode())
    return stem.encode()[:room].decode("utf-8", "ignore") + "…" + (f".{suffix}" if suffix else "")


def _check_model(request: SubmissionRequest, benchmark: Benchmark) -> tuple[str, LLMEndpoint | None, str, int | None]:
    """(stored model path, judge backend, weights hash, parameter count) or SubmissionRefused.
    A model folder's weights hash is "" (hashed on the worker: identity.submission_weights_hash)."""
    if "scores_file" in registry.kind(request.kind).needs:
        if request.scores_file is None:
            raise SubmissionRefused("Upload a JSONL file of {id, chosen_score, rejected_score}.", field="scores_file")
        upload = request.scores_file
        (Path(settings.VAR_DIR) / "tmp").mkdir(exist_ok=True)
        # Checked under the uploaded file's own name, so messages name the file the user sent;
        # streamed in chunks, so a large upload is never held in the web process's memory.
        with tempfile.TemporaryDirectory(dir=Path(settings.VAR_DIR) / "tmp") as tmp:
            path = Path(tmp) / upload_shown_name(upload.name)
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
        refusal = endpoint_model_refusal(backend, request.model_path.strip())  # the staff's key, the staff's list
        if refusal:
            raise SubmissionRefused(refusal[:1].upper() + refusal[1:] + ".", field="model_path")
        digest = hashlib.sha256(f"{backend.name}|{backend.base_url}|{request.model_path}".encode()).hexdigest()
        return request.model_path.strip(), backend, digest, None

    if not request.model_path.strip():
        raise SubmissionRefused("Give the model folder, relative to the models folder.", field="model_path")
    task = registry.kind(request.kind).model_task
    models_root = Path(settings.MODELS_ROOT)
    raw = request.model_path.strip()
    # Relative to the root, as given: refusals name the folder as the researcher wrote it.
    candidate = Path(raw)
    if HUB_ID.match(raw) and not (models_root / candidate).exists():
        candidate, models_root = _hub_snapshot(raw)
    try:
        info = inspect_model_folder(candidate, models_root=models_root, task=task, hash_weights=False)
    except ModelError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        raise SubmissionRefused(str(exc), field="model_path", errors={"model_path": problems}) from None
    if models_root == Path(settings.MODELS_ROOT):
        stored = str(Path(info.path).relative_to(models_root.resolve()))
    else:
        stored = info.path  # a Hub snapshot already on this machine, stored as its absolute folder
    return stored, None, info.weights_hash, info.parameters


def _check_options(kind: str, raw: dict | None) -> dict:
    """The options to store: the kind's schema (prblib.rewards.options) decides; the offending
    key is named. Every data file the options need (the options model's `data_files()`, e.g.
    P-GenRM's prototypes when n > 0) must exist inside the data folder."""
    try:
        parsed = parse_options(kind, raw)
    except OptionsError as exc:
        raise SubmissionRefused(str(exc), field=exc.key or "options") from None
    root = Path(settings.DATA_ROOT).resolve()
    for key, (name, why) in parsed.data_files().items():
        path = (root / name).resolve() if name else None
        if path is None or not path.is_relative_to(root) or not path.is_file():
            raise SubmissionRefused(why, field=key)
    for key, (name, task, why) in parsed.model_folders().items():  # e.g. a DPO model's reference
        if not name:
            raise SubmissionRefused(why, field=key)
        try:
            inspect_model_folder(Path(name), models_root=Path(settings.MODELS_ROOT), task=task, hash_weights=False)
        except ModelError as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
            raise SubmissionRefused(f"{key}: {exc}", field=key, errors={key: [f"{key}: {p}" for p in problems]}) from None
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
    retried, counted = 0, []

    def count_once() -> None:  # one retry of a submission is one attempt, whatever its runs
        if not counted:
            count_retry(user)
            counted.append(True)

    for run in EvaluationRun.objects.filter(submission=submission, status__in=RETRYABLE_STATUSES):
        try:
            job_retry(user=user, job=run, before=count_once)
        except JobRefused as exc:
            if exc.status == 429:
                raise SubmissionRefused(str(exc), status=429) from None
            continue
        retried += 1
    return retried


def count_retry(user: AbstractBaseUser) -> None:
    """Count a researcher's retry (of a submission, or of a job on the Jobs page and API) as a
    submission attempt: it queues work as a submission does. JobRefused (429) when the hour's
    SUBMISSIONS_PER_HOUR submissions and attempts are used up. Staff: not counted. Called inside
    the retry's transaction, under the owner's row lock (`_check_rate_limit`)."""
    if user.is_staff:
        return
    try:
        _check_rate_limit(user, lock=True)
    except SubmissionRefused as exc:
        raise JobRefused(str(exc), status=429) from None
    SubmissionAttempt.objects.create(owner=user)


def count_job_retry(sender, *, job, user, **kwargs) -> None:
    """`jobs.services.job_retry_requested` receiver: a retry of a leaderboard job a researcher
    owns (evaluation, Best-of-N and PPO runs) counts as a submission attempt (count_retry)."""
    if sender._meta.app_label == "leaderboard" and getattr(sender, "job_owner", ""):
        count_retry(user)


def _spend_reserved(user, backend: LLMEndpoint) -> dict[str, float]:
    """What `user`'s queued and running runs at `backend` would still spend (their pairs not scored
    yet, `pipeline.services.spend_reserved`): a new run's per-day check counts it."""
    runs = []
    for run in (EvaluationRun.objects.filter(submission__owner=user, submission__judge_backend=backend,
                                             status__in=ACTIVE_STATUSES).select_related("submission__benchmark")):
        left = run.submission.benchmark.items.exclude(pk__in=PairScore.objects.filter(run=run).values("item_id"))
        runs.append((run.submission.kind, run.submission.options,
                     list(left.values_list("question", "chosen", "rejected"))))
    return spend_reserved(endpoint=backend, runs=runs)
