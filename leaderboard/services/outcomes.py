"""Downstream outcomes of our reward models: the one upsert of a stored outcome, and the
Best-of-N and PPO runs that record them. The experiments themselves run in the pipeline
(`pipeline.services.best_of_n_execute` / `ppo_execute`); a run here gives them the RM as a
ModelSpec and keeps their units (BestOfNSample, PPOAnswer) and outcomes (DownstreamOutcome)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from jobs.services import job_enqueue, job_execute, job_fail, job_progress, job_unit_write
from pipeline.models import BuildStatus, LLMEndpoint, PolicySampleSet
from pipeline.services import BestOfNUnits, PPOUnits, best_of_n_execute, downstream_template_versions, manifest, ppo_execute, samples_generate
from prblib.errors import ModelError
from prblib.rewards.options import parse_run_options

from ..models import (BestOfNRun, BestOfNSample, DownstreamOutcome, OutcomeKind, PPOAnswer, PPORun, RunStatus,
                      Submission)
from .runs import model_spec_for


# What a manifest holds that does not make an outcome what it is: the process's environment and
# where it ran. Everything else in a run's manifest is part of the outcome's identity.
OUTCOME_KEY_IGNORES = ("code_version", "python", "libraries", "device", "run")


def outcome_config_key(run_manifest: dict) -> str:
    """sha256 hex of the run's manifest without OUTCOME_KEY_IGNORES, as canonical JSON (sorted
    keys): the judge endpoint and its model, the policy and its sampling or PPO options, the RM's
    kind and options, the benchmark's content hash. Two runs differing in any of them give two
    keys (so two DownstreamOutcome rows); the same configuration run again gives the same key."""
    import hashlib
    import json

    kept = {k: v for k, v in run_manifest.items() if k not in OUTCOME_KEY_IGNORES}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def outcome_store(*, submission: Submission | None, rm_name: str, source: str, kind: str, policy: str, setting: str,
                  domain: str, k: int | None, outcome: float, n: int, ci_low: float | None = None,
                  ci_high: float | None = None, manifest: dict | None = None, config_key: str = "",
                  bon_run: BestOfNRun | None = None, ppo_run: PPORun | None = None, synthetic: bool = False) -> None:
    """Upsert one downstream outcome under its identity: (submission, kind, policy, setting,
    domain, k, config_key) for our RMs, (source, rm_name, kind, policy, setting, domain, k,
    config_key) for others, with the manifest that reproduces it (its run's, or its import's).
    config_key: `outcome_config_key` of the run's manifest ("" for imports), so outcomes of one RM
    made with another judge, judge model or run options are kept beside each other, never replaced."""
    key = dict(kind=kind, policy=policy, setting=setting, domain=domain, k=k, config_key=config_key)
    if submission is not None:
        key.update(submission=submission)
    else:
        key.update(submission=None, source=source, rm_name=rm_name)
    DownstreamOutcome.objects.update_or_create(**key, defaults={
        "outcome": outcome, "ci_low": ci_low, "ci_high": ci_high, "n": n, "rm_name": rm_name, "source": source,
        "manifest": manifest or {}, "bon_run": bon_run, "ppo_run": ppo_run, "synthetic": synthetic})


# --- Best-of-N ---------------------------------------------------------------------------------

RANDOM_BASELINE = "Random selection"


def bon_run_create(*, submission: Submission, policy: str, policy_model: str, policy_endpoint: LLMEndpoint | None,
                   judge: LLMEndpoint, judge_model: str, setting: str, options: dict | None = None) -> BestOfNRun:
    """The Best-of-N run of (submission, sample set, setting, judge), created once; its sample
    set (the policy's answers, shared by every RM) is sampled here first when it is not yet.

    options: `prblib.rewards.options.BestOfNOptions` as a JSON object (n, temperature, top_p,
    max_new_tokens, seed, protocol: "release" fills in the release's knobs and runs in no_profile);
    OptionsError names a bad key. ModelError when sampling fails."""
    o = parse_run_options("best_of_n", options)
    sample_set, _ = PolicySampleSet.objects.get_or_create(
        benchmark=submission.benchmark, policy=policy, endpoint=policy_endpoint, model=policy_model, n=o.n,
        temperature=o.temperature, top_p=o.top_p, max_tokens=o.max_new_tokens, seed=o.seed)
    if sample_set.status != BuildStatus.SUCCEEDED and samples_generate(sample_set=sample_set) != "SUCCEEDED":
        sample_set.refresh_from_db()
        raise ModelError(f"sampling failed: {sample_set.error} (run again to resume)")
    if o.protocol == "release":  # the release's RM reads the question (and profile text) alone
        setting = "no_profile"
    run, _ = BestOfNRun.objects.get_or_create(submission=submission, sample_set=sample_set, setting=setting,
                                              judge=judge, judge_model=judge_model, protocol=o.protocol)
    return run


def bon_run_here(*, run: BestOfNRun) -> str:
    """Run a Best-of-N run in this process (the command line) unless it already succeeded;
    returns its final status."""
    if run.status == RunStatus.SUCCEEDED:
        return run.status
    job_enqueue(run, send=False)
    return bon_run_execute(run_id=run.pk)


def bon_run_execute(*, run_id: int) -> str:
    """Score a sample set with the run's RM, pick best-of-k for k in 1..N, judge the picks
    against each item's rubric aspects, and store the outcome per k (all domains and each
    domain), with the random-selection baseline judged the same way. Resumable: each sample's
    RM score and each pick's grade is a BestOfNSample row, done once. Returns the final status."""
    return job_execute(BestOfNRun, run_id, _best_of_n, expected=(ModelError,))


def bon_options(sample_set: PolicySampleSet) -> dict[str, Any]:
    """The run's sampling knobs (BestOfNOptions), as stored on its sample set."""
    return {"n": sample_set.n, "temperature": sample_set.temperature, "top_p": sample_set.top_p,
            "max_new_tokens": sample_set.max_tokens, "seed": sample_set.seed}


def _best_of_n(run) -> dict:
    run = BestOfNRun.objects.select_related("submission__benchmark", "sample_set__benchmark", "judge").get(pk=run.pk)
    units = BestOfNSample.objects.filter(run=run)

    def stored_scores() -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for item, rm_score in units.order_by("item_id", "index").values_list("item_id", "rm_score"):
            out.setdefault(item, []).append(rm_score)
        return out

    def save_scores(by_item: dict[int, list[float]]) -> None:
        with job_unit_write(run):
            BestOfNSample.objects.bulk_create(
                [BestOfNSample(run=run, item_id=item, index=i, rm_score=v)
                 for item, values in by_item.items() for i, v in enumerate(values)], ignore_conflicts=True)

    def stored_grades() -> dict[tuple[int, int], float | None]:
        return {(i, x): v for i, x, v in units.filter(judged=True).values_list("item_id", "index", "judge_score")}

    def save_grade(item: int, index: int, grade: float | None) -> None:
        with job_unit_write(run):
            units.filter(item_id=item, index=index).update(judged=True, judge_score=grade)

    results = best_of_n_execute(
        spec=model_spec_for(run.submission), sample_set=run.sample_set, setting=run.setting, judge=run.judge,
        judge_model=run.judge_model, units=BestOfNUnits(stored_scores, save_scores, stored_grades, save_grade),
        progress=lambda done, total=None: job_progress(run, done, total), protocol=run.protocol)
    if results.get("missing"):
        job_fail(run, missing_reason(results["missing"], what="grades"))
    sample_set = run.sample_set
    results["manifest"] = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        rm_kind=run.submission.kind, rm_options=run.submission.options,
        benchmark_content_hash=sample_set.benchmark.content_hash, policy=sample_set.policy,
        policy_model=sample_set.model, policy_endpoint=str(sample_set.endpoint or ""), **bon_options(sample_set),
        protocol=run.protocol, judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE,
        templates=downstream_template_versions(rm_kind=run.submission.kind, rm_options=run.submission.options,
                                               protocol=run.protocol),
        run={"type": "best_of_n", "id": run.pk})
    with job_unit_write(run):
        _bon_store(run, run.submission.display_name, results["rm"], submission=run.submission,
                   manifest=results["manifest"])
        _bon_store(run, RANDOM_BASELINE, results["random"], manifest=baseline_manifest(results["manifest"]))
    return {"results": results}


def missing_reason(missing: dict, *, what: str) -> str:
    """The failure reason of a Best-of-N or PPO run some of whose units are missing:
    `missing` is {"count", "total", "reasons": {reason: count}, "examples": {reason: message}}
    (pipeline.services.best_of_n_execute / ppo_execute)."""
    reasons = "; ".join(f"{n} {r}: {missing.get('examples', {}).get(r, '')}".rstrip(": ")
                        for r, n in sorted(missing["reasons"].items()))
    return (f"{missing['count']} of {missing['total']} {what} missing, their judge requests failed ({reasons}); "
            f"no outcome was stored. Retry to ask for the missing {what} only; the others are kept.")


# What names the RM in a Best-of-N manifest: a private submission's id, weights hash and options.
RM_MANIFEST_KEYS = ("rm_submission", "weights_hash", "rm_kind", "rm_options")


def baseline_manifest(run_manifest: dict) -> dict:
    """The random-selection baseline's manifest: the run's without what names its RM (the keys in
    RM_MANIFEST_KEYS, the RM's own prompt templates and the run id). The baseline row belongs to no
    submission and is shared by every RM of the sample set, so it is public and must not carry a
    private RM's identity; nothing the RM did changes it."""
    templates = {role: key for role, key in (run_manifest.get("templates") or {}).items()
                 if not role.startswith("rm_")}
    return {**{k: v for k, v in run_manifest.items() if k not in RM_MANIFEST_KEYS and k != "run"},
            "templates": templates}


def _bon_store(run, rm_name: str, by_k: dict, submission: Submission | None = None, *, manifest: dict) -> None:
    """Outcomes per k (all domains and each domain) of one (RM, setting, policy)."""
    config_key = outcome_config_key(manifest)
    for k, result in by_k.items():
        scopes = [("", result)] + list((result.get("by_domain") or {}).items())
        for domain, r in scopes:
            if r.get("mean") is None:
                continue
            outcome_store(submission=submission, rm_name=rm_name, source="prbench", kind=OutcomeKind.BEST_OF_N,
                          policy=run.sample_set.policy, setting=run.setting, domain=domain, k=int(k),
                          outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0,
                          manifest=manifest, config_key=config_key,
                          bon_run=run if submission is not None else None)


# --- PPO ----------------------------------------------------------------------------------------

# The knobs kept in PPORun's own columns; the others are in PPORun.options.
PPO_COLUMNS = ("steps", "batch_size", "response_length", "seed", "eval_fraction")


def ppo_run_create(*, submission: Submission, policy: str, policy_model: str, judge: LLMEndpoint, judge_model: str,
                   setting: str, options: dict | None = None) -> PPORun:
    """A new PPO run (not queued). options: `prblib.rewards.options.PPOOptions` as a JSON object,
    every knob with its default filled in; OptionsError names a bad key."""
    o = parse_run_options("ppo", options).model_dump()
    if o["protocol"] == "release":  # the release's RM reads the question (and profile text) alone
        setting = "no_profile"
    return PPORun.objects.create(submission=submission, policy=policy, policy_model=policy_model, setting=setting,
                                 judge=judge, judge_model=judge_model, **{k: o.pop(k) for k in PPO_COLUMNS},
                                 options=o)


def ppo_run_here(*, run: PPORun) -> str:
    """Run a PPO run in this process (the command line); returns its final status."""
    job_enqueue(run, send=False)
    return ppo_run_execute(run_id=run.pk)


def ppo_options(run: PPORun) -> Any:
    """The run's PPOOptions: its columns (steps, batch size, ...) and its stored options.
    OptionsError naming the key, or saying the stored options are not a JSON object."""
    return parse_run_options("ppo", run.options, columns={k: getattr(run, k) for k in PPO_COLUMNS})


def ppo_run_key(run: PPORun) -> str:
    """The run's name for its trained-policy folder: its id and creation time to the microsecond,
    so a database rebuilt from scratch (ids reused) never finds another run's policy."""
    return f"run-{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def ppo_run_execute(*, run_id: int) -> str:
    """Train the policy with PPO against the run's RM on the benchmark's training questions,
    answer the held-out ones, judge those answers against their rubric aspects and store a
    PPO outcome (all domains and each domain). Only PPO: other trainers' outcomes are imported.
    Resumable: a finished training is kept (`pipeline.services.ppo_policy_folder`), and each
    held-out answer and its grade is a PPOAnswer row, done once. Returns the final status."""
    return job_execute(PPORun, run_id, _ppo, expected=(ModelError,))


def _ppo(run) -> dict:
    run = PPORun.objects.select_related("submission__benchmark", "judge").get(pk=run.pk)
    options = ppo_options(run)
    answers = PPOAnswer.objects.filter(run=run)

    def save_answers(by_item: dict[int, Any]) -> None:
        with job_unit_write(run):
            PPOAnswer.objects.bulk_create([PPOAnswer(run=run, item_id=i, answer=a.text, truncated=a.truncated)
                                           for i, a in by_item.items()], ignore_conflicts=True)

    def save_grade(item: int, grade: float | None) -> None:
        with job_unit_write(run):
            answers.filter(item_id=item).update(judged=True, judge_score=grade)

    units = PPOUnits(stored_answers=lambda: dict(answers.values_list("item_id", "answer")),
                     save_answers=save_answers,
                     stored_grades=lambda: dict(answers.filter(judged=True).values_list("item_id", "judge_score")),
                     save_grade=save_grade)
    result = ppo_execute(spec=model_spec_for(run.submission), benchmark=run.submission.benchmark,
                         setting=run.setting, policy_model=run.policy_model, options=options, judge=run.judge,
                         judge_model=run.judge_model, run_key=ppo_run_key(run), units=units,
                         progress=lambda done, total=None: job_progress(run, done, total))
    if result.get("missing"):
        job_fail(run, missing_reason(result["missing"], what="grades"))
    ppo_manifest = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        rm_kind=run.submission.kind, rm_options=run.submission.options,
        benchmark_content_hash=run.submission.benchmark.content_hash, policy=run.policy,
        policy_model=run.policy_model, **options.model_dump(), judge=run.judge.name,
        judge_model=run.judge_model, device=settings.RM_DEVICE,
        templates=downstream_template_versions(rm_kind=run.submission.kind, rm_options=run.submission.options,
                                               protocol=options.protocol),
        run={"type": "ppo", "id": run.pk})
    with job_unit_write(run):
        _store_trained_outcome(run, result["outcome"], manifest=ppo_manifest)
    # Truncated answers (cut at the cap after one retry) are graded as they are, not dropped: dropping
    # them would lift the mean of a policy that learned to ramble past the cap. Counted here.
    answer_counts = {"n": answers.count(), "truncated": answers.filter(truncated=True).count()}
    return {"results": {**result, "answers": answer_counts, "manifest": ppo_manifest}}


def _store_trained_outcome(run: PPORun, outcome: dict, *, manifest: dict) -> None:
    scopes = [("", outcome)] + list((outcome.get("by_domain") or {}).items())
    config_key = outcome_config_key(manifest)
    for domain, r in scopes:
        if r.get("mean") is None:
            continue
        outcome_store(submission=run.submission, rm_name=run.submission.display_name, source="prbench",
                      kind=OutcomeKind.PPO, policy=run.policy, setting=run.setting, domain=domain, k=None,
                      outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0,
                      manifest=manifest, config_key=config_key, ppo_run=run)
