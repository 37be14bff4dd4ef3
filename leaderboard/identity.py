"""What makes a result unique, settled on the worker: a submission's weights hash and each
run's fingerprint, and the duplicate check that uses them.

Hashing a model folder reads every byte of its weights (about 0.7 CPU s per GB), so the web
request only checks the folder (config, head, tokenizer, safetensors headers; every problem at
once) and stores its runs with a pending fingerprint (`pending:<submission id>`). The first run
of the submission to reach a worker hashes the weights, once per submission (the row is locked
while it hashes, so a second run of the same submission waits and reuses the hash), and each
run then takes its real fingerprint sha256(weights hash | kind | benchmark content hash |
protocol | owner | configuration hash), the configuration being `pipeline.manifest.configuration`
(options after defaults, dtype, limits, the folder's tokenizer and chat template hashes, the
prototypes file's hash): one model may hold several configurations, each its own result. The
owner is part of it: a duplicate is refused only against the same owner's results, so another
researcher's earlier (or private) submission of the same weights never decides the fate of
yours, and a refusal never confirms what a competitor evaluates; both are evaluated, and a page
says "same weights as submission N" only where its reader may see N (`same_weights_as`). A
run whose fingerprint already has a live or successful result in its setting fails with the
same reason a submission refused at create time gets, with a link to the earlier submission.

"First" is the first to submit, not the first through the queue: submissions are ordered by
`created_at`, then id. A run also fails as a duplicate of an earlier submission of the same
owner (same kind and benchmark, another submission) whose run in the same setting still holds a pending
fingerprint: that submission's weights are hashed then, on this worker (stored once, so its
own run reuses the hash; a folder refused now is skipped, its own run fails on it), and the
earlier run itself is left to identify normally when it reaches a worker. Racing with it: it
is either still pending when looked at (found here) or already holds its real fingerprint (the
live-result check, or the unique constraint when it took it in between, finds it). A run
holds no lock while it waits for an earlier submission's row, so workers cannot deadlock.

Kinds whose identity is cheap (an uploaded scores file, already parsed whole to validate it;
a backend and model name) are fingerprinted at create time and refused there.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse

from jobs.models import JobStatus
from jobs.services import job_fail
from pipeline.services import configuration, configuration_sha256
from prblib import registry

from .models import EvaluationRun, Submission

log = logging.getLogger(__name__)

PENDING = "pending:"


def pending_fingerprint(submission_id: int) -> str:
    """The fingerprint of a run whose weights are not hashed yet (unique per submission, so
    the unique-result constraint never matches two pending runs)."""
    return f"{PENDING}{submission_id}"


def fingerprint_of(weights_hash: str, kind: str, benchmark, options: dict | None = None, *,
                   owner_id: int | None = None, config: dict | None = None) -> str:
    """sha256 hex of "weights hash|kind|benchmark content hash", with "|protocol" appended for a
    protocol other than the default (`registry.protocol_of` the submission's options): with the
    setting, what makes a result unique (EvaluationRun's `run_unique_result` constraint). The same
    model may thus hold one result per protocol; results under the default keep their fingerprint. The
    options' `fingerprint_extra()` (e.g. "reference-free:avg" for a DPO policy scored alone) is appended
    likewise when not empty."""
    protocol = registry.protocol_of(kind, options)
    suffix = "" if protocol == registry.DEFAULT_PROTOCOL else f"|{protocol}"
    extra = _fingerprint_extra(kind, options)  # e.g. a reference-free DPO reward
    suffix += f"|{extra}" if extra else ""
    # The owner: a duplicate is refused only against the same owner's results; another researcher's
    # copy of the same weights is evaluated on its own (the page says "same weights as submission N"
    # where the viewer may see that one). The configuration (`pipeline.manifest.configuration`:
    # options after defaults, tokenizer, chat template and prototypes hashes, dtype, limits): the
    # same weights run otherwise are another result.
    if owner_id is not None:
        suffix += f"|owner:{owner_id}"
    if config is not None:
        suffix += f"|config:{configuration_sha256(config)}"
    return hashlib.sha256(f"{weights_hash}|{kind}|{benchmark.content_hash}{suffix}".encode()).hexdigest()


def submission_folder(submission: Submission) -> Path | None:
    """The submission's model folder on this machine (under MODELS_ROOT, or a local Hub snapshot's
    absolute folder), or None for kinds without one (uploaded scores, a served model)."""
    if submission.judge_backend_id is not None or "scores_file" in registry.kind(submission.kind).needs:
        return None
    if not submission.model_path:
        return None
    path = Path(submission.model_path)
    return path if path.is_absolute() else Path(settings.MODELS_ROOT) / path


def submission_configuration(submission: Submission) -> dict:
    """`pipeline.manifest.configuration` of a submission: its kind, options after defaults, dtype,
    max length, profile k, its folder's tokenizer and chat template hashes and its data files'
    hashes (read here: on the worker for a model folder). What its fingerprint hashes."""
    return configuration(kind=submission.kind, options=submission.options, dtype=submission.dtype,
                         max_length=submission.max_length, profile_k=submission.profile_k,
                         folder=submission_folder(submission))


def submission_fingerprint(submission: Submission) -> str:
    """The fingerprint of a submission whose weights are hashed: `fingerprint_of` with its owner
    and configuration."""
    return fingerprint_of(submission.weights_hash, submission.kind, submission.benchmark, submission.options,
                          owner_id=submission.owner_id, config=submission_configuration(submission))


def _options_of(kind: str, options: dict | None):
    """The kind's typed options (stored options were validated when submitted)."""
    from prblib.rewards.options import parse_options

    return parse_options(kind, options or {})


def _fingerprint_extra(kind: str, options: dict | None) -> str:
    """The options' `fingerprint_extra()` ("" for options without one, or that no longer parse)."""
    if not options:
        return ""
    from prblib.rewards.options import OptionsError

    try:
        return _options_of(kind, options).fingerprint_extra()
    except OptionsError:
        return ""


@dataclass(frozen=True)
class Duplicate:
    message: str
    link: str | None  # the earlier submission's page, only when `user` may see it


def duplicate_of(fingerprint: str, in_settings: tuple[str, ...] | list[str], *, user, benchmark_name: str,
                 exclude_run: int | None = None, stored: bool = False) -> Duplicate | None:
    """The live or successful run with this fingerprint in one of `in_settings`, described for
    `user`: with a link when it is theirs, published, or `user` is staff; otherwise without
    any id or link (another researcher's private submission). None when there is none.

    stored=True: the message becomes a run's failure reason, which everyone reads once that
    run's submission is published, so being staff gives no link (only ownership or publication)."""
    existing = (EvaluationRun.objects.filter(fingerprint=fingerprint, setting__in=list(in_settings))
                .exclude(status__in=[JobStatus.FAILED, JobStatus.CANCELLED]))
    if exclude_run is not None:
        existing = existing.exclude(pk=exclude_run)
    existing = existing.select_related("submission").first()
    if existing is None:
        return None
    return _described(existing, user=user, benchmark_name=benchmark_name, stored=stored)


def _described(existing: EvaluationRun, *, user, benchmark_name: str, stored: bool) -> Duplicate:
    """`existing` (the earlier run holding the result) as a duplicate reason for `user`:
    duplicate_of's rules."""
    mine = existing.submission.published or existing.submission.owner_id == user.pk or (user.is_staff and not stored)
    if not mine:  # someone else's private submission: say nothing about it but that it exists
        return Duplicate(f"This model was already submitted for {benchmark_name} in the "
                         f"\"{existing.get_setting_display()}\" setting by another researcher; its result will "
                         "appear when they publish it.", None)
    url = reverse("leaderboard:submission", args=[existing.submission_id])
    return Duplicate(f"This model was already evaluated on {benchmark_name} in the \"{existing.get_setting_display()}\" "
                     f"setting (submission #{existing.submission_id}, {existing.get_status_display().lower()}): "
                     f"see {url}", url)


def submission_weights_hash(submission: Submission) -> str:
    """The submission's weights hash, computed here (on the worker) the first time and stored;
    `submission.weights_hash` is set in place. The folder is checked again first (it may have
    changed since it was submitted): ModelError if it is refused now. Other model folders the options
    name (`model_folders()`: a DPO model's reference) are checked and hashed too, and folded in as
    sha256(hash | key=their hash). Once per submission: the row is locked while hashing, so a run of
    the same submission on another worker waits."""
    if submission.weights_hash:
        return submission.weights_hash
    from prblib.modelcheck import check_model_folder, weights_digest

    with transaction.atomic():
        stored = Submission.objects.select_for_update().values_list("weights_hash", flat=True).get(pk=submission.pk)
        if not stored:
            relative = not Path(submission.model_path).is_absolute()  # absolute: a local Hub snapshot
            root = Path(settings.MODELS_ROOT) if relative else None
            task = registry.kind(submission.kind).model_task
            folder, _, weights = check_model_folder(
                (root / submission.model_path) if root else Path(submission.model_path), task=task, models_root=root)
            stored = weights_digest(folder, weights)
            # Other model folders the options name (a DPO model's reference) are part of the model.
            for key, (name, task, _) in sorted(_options_of(submission.kind, submission.options).model_folders().items()):
                other, _, other_weights = check_model_folder(Path(settings.MODELS_ROOT) / name, task=task,
                                                             models_root=Path(settings.MODELS_ROOT))
                stored = hashlib.sha256(f"{stored}|{key}={weights_digest(other, other_weights)}".encode()).hexdigest()
            Submission.objects.filter(pk=submission.pk).update(weights_hash=stored)
    submission.weights_hash = stored
    return stored


def run_identify(run: EvaluationRun) -> None:
    """The first step of an evaluation run (on the worker): hash the submission's weights if
    nobody has yet and replace the run's pending fingerprint with the real one. A duplicate of
    a live or successful run, or of an earlier submission whose run is still pending, fails
    this run (jobs' job_fail: FAILED with the reason, JobStopped raised) without scoring
    anything. `run.submission` must be loaded with its benchmark."""
    if not run.fingerprint.startswith(PENDING):
        return
    submission = run.submission
    submission_weights_hash(submission)
    fingerprint = submission_fingerprint(submission)

    def duplicate() -> Duplicate | None:
        return duplicate_of(fingerprint, [run.setting], user=submission.owner,
                            benchmark_name=submission.benchmark.name, exclude_run=run.pk, stored=True)

    found = duplicate() or _earlier_pending_duplicate(run, fingerprint)
    if found is None:
        try:
            with transaction.atomic():
                EvaluationRun.objects.filter(pk=run.pk).update(fingerprint=fingerprint)
            run.fingerprint = fingerprint
            return
        except IntegrityError:  # another run took this fingerprint between the look and the update
            found = duplicate()
    job_fail(run, found.message if found else "This model was submitted again at the same moment; "
                                                "the other submission carries the result.")


def _earlier_pending_duplicate(run: EvaluationRun, fingerprint: str) -> Duplicate | None:
    """The earliest submission created before `run`'s (created_at, then id) whose run in the same
    setting still holds a pending fingerprint and whose weights give `fingerprint`, described
    as duplicate_of does (stored=True); None when there is none. Same kind and benchmark,
    other submissions only, its run neither failed nor cancelled. Each one looked at has its
    weights hashed here (once per submission, see submission_weights_hash); one whose folder
    is refused now, or cannot be read, is skipped (its own run fails on it)."""
    submission = run.submission
    earlier = (EvaluationRun.objects
               .filter(setting=run.setting, fingerprint__startswith=PENDING, submission__owner_id=submission.owner_id,
                       submission__kind=submission.kind, submission__benchmark_id=submission.benchmark_id)
               .filter(Q(submission__created_at__lt=submission.created_at)
                       | Q(submission__created_at=submission.created_at, submission_id__lt=submission.pk))
               .exclude(submission_id=submission.pk)
               .exclude(status__in=[JobStatus.FAILED, JobStatus.CANCELLED])
               .select_related("submission")
               .order_by("submission__created_at", "submission_id"))
    for other in earlier:
        try:
            submission_weights_hash(other.submission)
            other.submission.benchmark = submission.benchmark
            theirs = submission_fingerprint(other.submission)
        except Exception as exc:  # noqa: BLE001 - another submission's folder never fails this run
            # Refused now, unreadable, or made to break the reader: its own run fails on it.
            log.info("run %s: earlier submission %s skipped in the duplicate check: %r", run.pk, other.submission_id, exc)
            continue
        if theirs == fingerprint:
            return _described(other, user=submission.owner, benchmark_name=submission.benchmark.name, stored=True)
    return None


def same_weights_as(submission: Submission, viewer) -> list[Submission]:
    """Other submissions with the same weights hash that `viewer` may know of: published ones and
    the viewer's own (never another researcher's private work, whoever is looking), oldest first.
    [] while the weights are not hashed yet."""
    if not submission.weights_hash:
        return []
    others = Submission.objects.filter(weights_hash=submission.weights_hash).exclude(pk=submission.pk)
    mine = Q(owner_id=viewer.pk) if viewer is not None and viewer.is_authenticated else Q(pk__in=[])
    return list(others.filter(Q(published=True) | mine).order_by("created_at", "pk"))
