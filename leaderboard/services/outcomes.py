"""Downstream outcomes of our reward models: the one upsert of a stored outcome, and the
Best-of-N and PPO runs that produce them."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from django.conf import settings
from django.db import transaction

from jobs.services import job_execute, job_progress
from pipeline.endpoints import llm_backend
from pipeline.manifest import downstream_template_versions, manifest
from pipeline.ml.base import ModelError
from pipeline.services import reward_model_get

from ..models import (BestOfNRun, BestOfNSample, DownstreamOutcome, Kind, OutcomeKind, PPOAnswer, PPORun,
                      RunStatus, Submission)
from .runs import model_spec_for


def outcome_store(*, submission: Submission | None, rm_name: str, source: str, kind: str, policy: str, setting: str,
                  domain: str, k: int | None, outcome: float, n: int, ci_low: float | None = None,
                  ci_high: float | None = None, manifest: dict | None = None) -> None:
    """Upsert one downstream outcome under its identity: (submission, kind, policy, setting,
    domain, k) for our RMs, (source, rm_name, kind, policy, setting, domain, k) for others,
    with the manifest that reproduces it (its run's, or its import's)."""
    key = dict(kind=kind, policy=policy, setting=setting, domain=domain, k=k)
    if submission is not None:
        key.update(submission=submission)
    else:
        key.update(submission=None, source=source, rm_name=rm_name)
    DownstreamOutcome.objects.update_or_create(**key, defaults={
        "outcome": outcome, "ci_low": ci_low, "ci_high": ci_high, "n": n, "rm_name": rm_name, "source": source,
        "manifest": manifest or {}})


# --- Best-of-N ---------------------------------------------------------------------------------

RANDOM_BASELINE = "Random selection"


def bon_run_execute(*, run_id: int) -> str:
    """Score a sample set with the run's RM, pick best-of-k for k in 1..N, judge the picks
    against each item's rubric aspects, and store the outcome per k (all domains and each
    domain), with the random-selection baseline judged the same way. Resumable: each sample's
    RM score and each pick's grade is a BestOfNSample row, done once. Returns the final status."""
    return job_execute(BestOfNRun, run_id, _best_of_n, expected=(ModelError,))


def _chunks(values: list, size: int):
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _best_of_n(run) -> dict:
    from pipeline.downstream import samples_by_item
    from pipeline.ml import bon
    from pipeline.models import BenchmarkItem
    from pipeline.services import item_score_input

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
    sample_set = run.sample_set
    results["manifest"] = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        rm_kind=run.submission.kind, rm_options=run.submission.options,
        benchmark_content_hash=sample_set.benchmark.content_hash, policy=sample_set.policy,
        policy_model=sample_set.model, policy_endpoint=str(sample_set.endpoint or ""), n=sample_set.n,
        temperature=sample_set.temperature, max_tokens=sample_set.max_tokens, seed=sample_set.seed,
        judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE,
        templates=downstream_template_versions(rm_kind=run.submission.kind, rm_options=run.submission.options),
        run={"type": "best_of_n", "id": run.pk})
    with transaction.atomic():
        _bon_store(run, run.submission.display_name, results["rm"], submission=run.submission,
                   manifest=results["manifest"])
        _bon_store(run, RANDOM_BASELINE, results["random"], manifest=results["manifest"])
    return {"results": results}


def _bon_store(run, rm_name: str, by_k: dict, submission: Submission | None = None, *, manifest: dict) -> None:
    """Outcomes per k (all domains and each domain) of one (RM, setting, policy)."""
    for k, result in by_k.items():
        scopes = [("", result)] + list((result.get("by_domain") or {}).items())
        for domain, r in scopes:
            if r.get("mean") is None:
                continue
            outcome_store(submission=submission, rm_name=rm_name, source="prbench", kind=OutcomeKind.BEST_OF_N,
                          policy=run.sample_set.policy, setting=run.setting, domain=domain, k=int(k),
                          outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0,
                          manifest=manifest)


# --- PPO ----------------------------------------------------------------------------------------

def _held_out(source_id: str, fraction: float) -> bool:
    return hashlib.sha256(f"prbench-ppo-split:{source_id}".encode()).digest()[0] < 256 * fraction


def ppo_run_execute(*, run_id: int) -> str:
    """Train the policy with PPO against the run's RM on the benchmark's training questions,
    answer the held-out ones, judge those answers against their rubric aspects and store a
    PPO outcome (all domains and each domain). Only PPO: other trainers' outcomes are imported.
    Resumable: a finished training is kept (results["training"]), and each held-out answer and
    its grade is a PPOAnswer row, done once. Returns the final status."""
    return job_execute(PPORun, run_id, _ppo, expected=(ModelError,))


def _ppo(run) -> dict:
    from pipeline.ml import bon, ppo
    from pipeline.ml.modelcheck import inspect_model_folder
    from pipeline.services import item_pair_input

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
        PPOAnswer.objects.bulk_create([PPOAnswer(run=run, item=i, answer=a.text, truncated=a.truncated)
                                       for i, a in zip(chunk, answers)], ignore_conflicts=True)
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
    ppo_manifest = manifest(
        rm_submission=run.submission_id, weights_hash=run.submission.weights_hash, setting=run.setting,
        rm_kind=run.submission.kind, rm_options=run.submission.options,
        benchmark_content_hash=run.submission.benchmark.content_hash, policy=run.policy,
        policy_model=run.policy_model, steps=run.steps, batch_size=run.batch_size,
        response_length=run.response_length, seed=run.seed, eval_fraction=run.eval_fraction,
        judge=run.judge.name, judge_model=run.judge_model, device=settings.RM_DEVICE,
        templates=downstream_template_versions(rm_kind=run.submission.kind, rm_options=run.submission.options),
        run={"type": "ppo", "id": run.pk})
    _store_trained_outcome(run, outcome, manifest=ppo_manifest)
    # Truncated answers (cut at the cap after one retry) are graded as they are, not dropped: dropping
    # them would lift the mean of a policy that learned to ramble past the cap. Counted here.
    answer_counts = {"n": PPOAnswer.objects.filter(run=run).count(),
                     "truncated": PPOAnswer.objects.filter(run=run, truncated=True).count()}
    return {"results": {"training": training, "outcome": outcome, "answers": answer_counts,
                        "manifest": ppo_manifest}, "progress_done": total}


def _store_trained_outcome(run, outcome: dict, *, manifest: dict) -> None:
    scopes = [("", outcome)] + list((outcome.get("by_domain") or {}).items())
    for domain, r in scopes:
        if r.get("mean") is None:
            continue
        outcome_store(submission=run.submission, rm_name=run.submission.display_name, source="prbench",
                      kind=OutcomeKind.PPO, policy=run.policy, setting=run.setting, domain=domain, k=None,
                      outcome=r["mean"], ci_low=r.get("ci_low"), ci_high=r.get("ci_high"), n=r.get("n") or 0,
                      manifest=manifest)
