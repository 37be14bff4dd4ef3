"""Executing an evaluation run: score the pairs not scored yet, a chunk at a time, then
summarise every stored pair (the job lifecycle of jobs/services.py around it)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from jobs.services import JobStopped, job_execute, job_on_stop, job_progress, job_unit_write
from pipeline.services import (SpendCapReached, rm_cancel, spend_charge, spend_estimate, spend_of_usage, spend_record,
                               spend_refusal)
from pipeline.services import evaluation_manifest, model_spec, progress_chunk_size, reward_model_get, rm_score_items, rm_summarize, rm_usage
from prblib.rewards.base import ModelSpec
from prblib.errors import ModelError
from prblib import registry

from .. import identity
from ..models import EvaluationRun, PairScore, Submission


def run_execute(*, run_id: int) -> str:
    """The body of the evaluation task (see jobs.services.job_execute). Returns the run's final status."""
    return job_execute(EvaluationRun, run_id, _evaluate, expected=(ModelError, SpendCapReached))


def _evaluate(run: EvaluationRun) -> dict | None:
    run = EvaluationRun.objects.select_related("submission__benchmark", "submission__judge_backend").get(pk=run.pk)
    identity.run_identify(run)
    _score_missing(run)
    return _summary(run)


def model_spec_for(submission: Submission, *, device: str | None = None) -> ModelSpec:
    """How the worker loads a submission: its own options (validated against the kind's
    schema when submitted) and a runtime decided by the platform alone (endpoint connection,
    cache, roots: `pipeline.services.model_spec`), so nothing a researcher typed reaches the
    worker's configuration."""
    benchmark_ids = None
    if submission.judge_backend is not None:
        path = submission.model_path  # the model's name at the endpoint
    elif "scores_file" in registry.kind(submission.kind).needs:
        path = submission.scores_file.path
        benchmark_ids = list(submission.benchmark.items.values_list("source_id", flat=True))
    else:  # relative to MODELS_ROOT, or the absolute folder of a local Hub snapshot
        path = str(Path(settings.MODELS_ROOT) / submission.model_path)
    return model_spec(kind=submission.kind, path=path, device=device or settings.RM_DEVICE, dtype=submission.dtype,
                      max_length=submission.max_length, batch_size=submission.batch_size,
                      profile_k=submission.profile_k, options=dict(submission.options),
                      endpoint=submission.judge_backend, cache_key=identity.submission_weights_hash(submission),
                      benchmark_ids=benchmark_ids)


def _score_missing(run: EvaluationRun) -> None:
    """Score the pairs that have no PairScore yet, a chunk at a time (JobStopped once the run
    was cancelled)."""
    submission = run.submission
    items = (submission.benchmark.items.exclude(pk__in=PairScore.objects.filter(run=run).values("item_id"))
             .order_by("position"))
    if not items.exists():
        return
    endpoint = submission.judge_backend
    charge = None  # a reply without usage counts at the per-request estimate, never as 0 (spend_charge)
    if endpoint is not None:
        charge = spend_charge(spend_estimate(kind=submission.kind, options=submission.options, endpoint=endpoint,
                                             texts=list(submission.benchmark.items.values_list(
                                                 "question", "chosen", "rejected"))), endpoint)
    earlier = spend_of_usage((EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk) or {})
                             .get("usage"), charge)  # what earlier deliveries of this run spent
    if endpoint is not None:  # a cap reached before this delivery: stop before any request
        refusal = spend_refusal(endpoint=endpoint, owner_id=submission.owner_id, run=earlier, estimate=False)
        if refusal:
            raise SpendCapReached(_stopped(refusal, run))
    model = reward_model_get(model_spec_for(submission))
    job_on_stop(run, lambda: rm_cancel(model))  # a cancel ends the judge's requests at once, freeing the worker
    recorded = {"requests": 0.0, "tokens": 0.0, "cost": 0.0}  # of this delivery, in the day's ledger

    def save_chunk(results) -> bool:
        with job_unit_write(run):  # nothing once this execution no longer owns the run
            PairScore.objects.bulk_create(
                [PairScore(run=run, item=item, chosen_score=r.chosen_score, rejected_score=r.rejected_score,
                           correct=r.correct, tie=r.tie, details=r.details) for item, r in results],
                ignore_conflicts=True)  # a pair scored by an earlier delivery keeps its first score
        done = PairScore.objects.filter(run=run).count()
        job_progress(run, done)
        if endpoint is not None:  # spend caps, checked after every chunk (the chunk is kept)
            now = spend_of_usage({k: v - (before or {}).get(k, 0) for k, v in (rm_usage(model) or {}).items()
                                  if isinstance(v, (int, float))}, charge)
            spend_record(endpoint=endpoint, owner_id=submission.owner_id,
                         delta={m: now[m] - recorded[m] for m in recorded})
            recorded.update(now)
            refusal = spend_refusal(endpoint=endpoint, owner_id=submission.owner_id,
                                    run={m: earlier[m] + now[m] for m in now}, estimate=False,
                                    more=done < total)  # after the last pair: reaching a cap exactly is fine
            if refusal:
                raise SpendCapReached(_stopped(refusal, run))
        return True

    total = submission.benchmark.items.count()
    before = rm_usage(model)
    chunk = progress_chunk_size(total=run.progress_total or submission.benchmark.item_count,
                                batch_size=submission.batch_size, cap=settings.RUN_CHUNK_PAIRS)
    try:
        rm_score_items(model=model, items=items.iterator(chunk_size=256), setting=run.setting,
                       on_chunk=save_chunk, chunk_size=chunk)
    finally:
        if before is not None:  # what this delivery asked of the judge, added to earlier deliveries'
            spent = {k: v - before.get(k, 0) for k, v in rm_usage(model).items() if isinstance(v, (int, float))}
            try:
                with job_unit_write(run):
                    previous = (EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk)
                                or {}).get("usage") or {}
                    usage = {k: spent.get(k, 0) + (previous.get(k) or 0) for k in spent}
                    if usage.get("requests_without_usage"):  # some replies' tokens are unknown: so is the bill
                        usage["cost"] = None
                    run.metrics = {"usage": usage}
                    EvaluationRun.objects.filter(pk=run.pk).update(metrics=run.metrics)
            except JobStopped:  # superseded: the execution that owns the run now keeps the account
                pass


def _stopped(refusal: str, run: EvaluationRun) -> str:
    """The reason a run stopped at a spend cap, with what it keeps."""
    done = PairScore.objects.filter(run=run).count()
    return (f"Stopped at a spend cap: {refusal}. The {done} pair{'s' if done != 1 else ''} scored so far "
            f"{'are' if done != 1 else 'is'} kept; a retry goes on from there once the cap allows (staff set the caps "
            "on the judge backend).")


def _summary(run: EvaluationRun) -> dict:
    """The fields stored with SUCCEEDED: `pipeline.services.rm_summarize` over every stored pair
    (what `evaluate_rm` prints for the same run), with the manifest that reproduces it."""
    rows = PairScore.objects.filter(run=run).order_by("item__position").values_list(
        "item__domain", "correct", "tie", "details", "chosen_score", "rejected_score")
    submission = run.submission
    usage = (EvaluationRun.objects.values_list("metrics", flat=True).get(pk=run.pk) or {}).get("usage")
    metrics = rm_summarize(rows, kind=submission.kind, options=submission.options, usage=usage, setting=run.setting)
    metrics["manifest"] = run_manifest(run=run)
    return {"metrics": metrics, "progress_done": metrics["n"]}


def run_manifest(*, run: EvaluationRun) -> dict:
    """What reproduces an evaluation run's figures: `pipeline.services.evaluation_manifest`, the
    one function `evaluate_rm` calls too (same keys): code and libraries, benchmark content hash,
    weights hash, the model relative to MODELS_ROOT, device, dtype, limits, options as stored and
    resolved (defaults and presets filled in), the effective seed, the protocol, the prompt
    templates' name@vN, the tokenizer's, chat template's and data files' hashes. `manage.py
    rerun` takes it back."""
    submission = run.submission
    return evaluation_manifest(
        kind=submission.kind, setting=run.setting, benchmark=submission.benchmark, model=submission.model_shown,
        weights_hash=submission.weights_hash, device=settings.RM_DEVICE, dtype=submission.dtype,
        max_length=submission.max_length, batch_size=submission.batch_size, profile_k=submission.profile_k,
        options=submission.options, folder=identity.submission_folder(submission),
        judge_backend=submission.judge_backend)
