"""Downstream experiments: policy samples, Best-of-N and PPO with a reward model.

Policy samples for Best-of-N are sampled once per (benchmark, policy), reused by every RM. A
sample set is a job (jobs/services.py). Resumable: its units are each item's N samples,
unique per (set, item, index), so only items without samples are sampled again, and the LLM
cache means answers already paid for are not requested twice.

`best_of_n_execute` and `ppo_execute` run a Best-of-N or PPO experiment for one reward model
(given as a ModelSpec) and return its outcomes. They know nothing of who asked: the caller
(the leaderboard's runs) keeps each unit's result through the callbacks of `BestOfNUnits` /
`PPOUnits` and reports progress, so a redelivered run does only what its units lack."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from jobs.services import job_enqueue, job_execute, job_fail, job_progress, job_unit_write

from .endpoints import endpoint_remember_capabilities, llm_backend
from .inputs import item_pair_input, item_score_input, reward_model_get
from prblib import registry
from prblib.rewards.base import ModelSpec
from prblib.errors import ModelError
from .models import Benchmark, BenchmarkItem, LLMEndpoint, PolicySample, PolicySampleSet

log = logging.getLogger(__name__)

Progress = Callable[..., None]  # progress(done) or progress(done, total)


def samples_enqueue(*, sample_set: PolicySampleSet) -> None:
    """Queue the sample set on a worker (its task is sent when the transaction commits)."""
    job_enqueue(sample_set)


def samples_generate(*, sample_set: PolicySampleSet) -> str:
    """Sample in this process (the command line): queue without a task, then run. Returns the
    final status."""
    job_enqueue(sample_set, send=False)
    return samples_execute(sample_set_id=sample_set.pk)


def samples_execute(*, sample_set_id: int) -> str:
    """The sampling task's body: sample every item that has no samples yet."""
    return job_execute(PolicySampleSet, sample_set_id, _sample, expected=(ModelError,))


def _sample(sample_set: PolicySampleSet) -> dict:
    """Sample every item without samples. Items whose samples stayed degenerate (`bon.is_degenerate`
    after asking one sample per request) are kept and counted in `usage`, unless they are most of
    the items sampled: then the set fails with that reason and keeps none of theirs, so a rerun
    (once the endpoint samples properly) asks for them again."""
    from prblib.downstream.bon import SamplingReport, sample_responses

    sample_set = PolicySampleSet.objects.select_related("benchmark", "endpoint").get(pk=sample_set.pk)
    all_items = list(sample_set.benchmark.items.order_by("position"))
    done = set(sample_set.samples.values_list("item_id", flat=True).distinct())
    items = [item for item in all_items if item.pk not in done]
    job_progress(sample_set, len(done), len(all_items))
    by_id = {item.source_id: item for item in items}
    failed: dict[str, str] = {}
    reasons: dict[str, int] = {}
    report = SamplingReport()
    degenerate: dict[str, list[str]] = {}
    usage = dict(sample_set.usage or {})
    sampled = 0

    def store(source_id: str, texts: list[str]) -> None:
        with job_unit_write(sample_set):
            PolicySample.objects.bulk_create(
                [PolicySample(sample_set=sample_set, item=by_id[source_id], index=i, text=text)
                 for i, text in enumerate(texts)], ignore_conflicts=True)
        done.add(by_id[source_id].pk)
        job_progress(sample_set, len(done))

    if items:
        backend = llm_backend(sample_set.endpoint, sample_set.model)
        requests = [{"id": item.source_id, "question": item.question,
                     "profile_texts": list(item_pair_input(item).profile)} for item in items]
        try:
            for source_id, outcome in sample_responses(backend, requests, n=sample_set.n,
                                                       temperature=sample_set.temperature,
                                                       max_tokens=sample_set.max_tokens, seed=sample_set.seed,
                                                       top_p=sample_set.top_p, report=report):
                if isinstance(outcome, Exception):
                    reason = getattr(outcome, "reason", "") or "error"  # AnswerError: truncated, rate_limited, ...
                    failed[source_id] = f"{reason}: {outcome}"[:500]
                    reasons[reason] = reasons.get(reason, 0) + 1
                    continue
                sampled += 1
                if source_id in report.degenerate:  # decided once every item is sampled
                    degenerate[source_id] = outcome
                    continue
                store(source_id, outcome)
        finally:
            endpoint_remember_capabilities(sample_set.endpoint, backend)
        usage = _sampling_usage(usage, backend, retried=report.retried)
    most = bool(degenerate) and 2 * len(degenerate) > sampled
    if not most:
        for source_id, texts in degenerate.items():
            store(source_id, texts)
        usage["degenerate_items"] = usage.get("degenerate_items", 0) + len(degenerate)
    with job_unit_write(sample_set):
        PolicySampleSet.objects.filter(pk=sample_set.pk).update(failed_items=failed, usage=usage)
    problems = []
    if most:
        problems.append(f"the samples of {len(degenerate)} of {sampled} items are degenerate (at most half of an "
                        f"item's {sample_set.n} samples distinct, also when asked one sample per request): the "
                        "endpoint does not sample each answer on its own (check that it honours temperature and "
                        "seed); none of them was kept")
    if failed:
        problems.append(f"{len(failed)} item(s) failed "
                        f"({', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))})")
    if problems:
        job_fail(sample_set, "; ".join(problems) + "; run again to retry them")
    return {}


def _sampling_usage(previous: dict[str, Any], backend: Any, *, retried: int) -> dict[str, Any]:
    """The sample set's bill so far: this execution's requests, tokens, cost and cache hits
    added to `previous`; degenerate_retried counts items asked again one sample per request.
    A request answered without usage makes the cost unknown (None)."""
    inner = getattr(backend, "inner", backend)
    used = inner.usage() if callable(getattr(inner, "usage", None)) else {}
    used = {**used, "cache_hits": getattr(backend, "hits", 0), "cache_misses": getattr(backend, "misses", 0),
            "degenerate_retried": retried}
    total = dict(previous)
    for key in ("requests", "requests_without_usage", "prompt_tokens", "completion_tokens", "cache_hits",
                "cache_misses", "degenerate_retried"):
        total[key] = int(previous.get(key) or 0) + int(used.get(key) or 0)
    known = [c for c in (previous.get("cost"), used.get("cost")) if c is not None]
    total["cost"] = None if total["requests_without_usage"] or not known else round(sum(known), 6)
    return total


def samples_by_item(*, sample_set: PolicySampleSet) -> dict[int, list[str]]:
    """{item id: its samples in index order}."""
    out: dict[int, list[str]] = {}
    for item_id, text in sample_set.samples.order_by("item_id", "index").values_list("item_id", "text"):
        out.setdefault(item_id, []).append(text)
    return out


# --- Best-of-N ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class BestOfNUnits:
    """The caller's store of one Best-of-N run's units (each is done once).

    stored_scores() -> {item id: the RM's score of each sample, in sample order} so far;
    save_scores({item id: scores}) keeps a chunk; stored_grades() -> {(item id, sample index):
    the judge's grade 0-2 or None (unreadable)} so far; save_grade(item id, index, grade)."""

    stored_scores: Callable[[], dict[int, list[float]]]
    save_scores: Callable[[dict[int, list[float]]], None]
    stored_grades: Callable[[], dict[tuple[int, int], float | None]]
    save_grade: Callable[[int, int, float | None], None]


def _refuse_fixed_scores(spec: ModelSpec, what: str) -> None:
    """ModelError when the RM's kind cannot score answers it has not seen (registry flag
    `scores_new_answers` False: uploaded scores were computed on the benchmark's pairs only)."""
    entry = registry.kind(spec.kind)
    if not entry.scores_new_answers:
        raise ModelError(f"{entry.label.lower()} cannot score new answers: {what} needs a model "
                         "(import outcomes computed elsewhere instead)")


def _chunks(values: list, size: int):
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _released_rm(spec: ModelSpec, what: str) -> ModelSpec:
    """The RM of a Best-of-N or PPO run under protocol "release": a scalar RM read as the release
    reads its discriminative scorer (softmax at the last label, chat template, no profile section:
    the scalar kind's own protocol "release"). Other kinds are refused: the release's generative
    scorer reads a prompt file it does not ship (PPO/reward_server.py --score-template score.txt)."""
    if not registry.kind(spec.kind).scores_groups:
        raise ModelError(f"protocol 'release' for {what} scores with a sequence-classification RM, as the authors' "
                         f"scripts do; a {registry.kind(spec.kind).label.lower()} has no released counterpart "
                         "there (use protocol 'prbench')")
    return dataclasses.replace(spec, options={**dict(spec.options or {}), "protocol": "release"})


def _released_input(item: BenchmarkItem, responses: Any) -> Any:
    """What the release's RM scores for an item's answers: the question and the profile text joined
    without a separator as the only user text (`protocols.release_rm_question`)."""
    from prblib.rewards.base import ScoreInput
    from prblib.rewards.protocols import release_rm_question

    return ScoreInput(id=str(item.pk), question=release_rm_question(item.question, item.profile or ()),
                      responses=tuple(responses))


def best_of_n_execute(*, spec: ModelSpec, sample_set: PolicySampleSet, setting: str, judge: LLMEndpoint,
                      judge_model: str, units: BestOfNUnits, progress: Progress,
                      protocol: str = "prbench") -> dict[str, Any]:
    """Score a sample set's answers with the RM, pick best-of-k for k in `bon.k_grid(N)`, have
    the judge grade the picks (and a random pick's) against each item's rubric aspects.

    Returns {"rm": per k, "random": per k}, each `bon.outcomes` ({k: {mean, ci_low, ci_high, n,
    failures, by_domain}}), computed only once every wanted grade is stored; when some judge
    requests failed, {"missing": _FailedRequests.missing(...)} instead (the failed grades are
    not stored, so the next delivery asks for them alone). Progress counts RM-scored items, then
    grades. ModelError when the sample set has not succeeded, or when the RM's kind cannot score new answers (registry
    `scores_new_answers`).

    protocol "release" (docs/protocols.md): a scalar RM only (`_released_rm`), scoring the question
    and the profile text joined without a separator (`_released_input`, in the no_profile reading);
    the rubric judge under the release's rule (`bon.judge_answers(protocol="release")`: a list in
    32 tokens, an unreadable answer 0 and kept, so n is the same for every k and every RM)."""
    from prblib.downstream import bon

    if sample_set.status != "SUCCEEDED":
        raise ModelError(f"the sample set '{sample_set}' is {sample_set.status}: sample it first")
    _refuse_fixed_scores(spec, "Best-of-N")
    released = protocol == "release"
    if released:
        spec, setting = _released_rm(spec, "Best-of-N"), "no_profile"
    samples = samples_by_item(sample_set=sample_set)
    items = {i.pk: i for i in BenchmarkItem.objects.filter(pk__in=samples)}
    ks = bon.k_grid(sample_set.n)

    # 1. The RM's score of every sample, a chunk of items at a time.
    scored = set(units.stored_scores())
    todo = [pk for pk in samples if pk not in scored]
    progress(len(scored), 2 * len(samples))
    if todo:
        model = reward_model_get(spec)
        # A kind that does not score groups itself (judges, P-GenRM) scores each sample by its
        # margin over the pair's rubric-blind answer.
        references = ({str(pk): items[pk].rejected for pk in todo}
                      if not registry.kind(spec.kind).scores_groups else None)
        for chunk in _chunks(todo, settings.RUN_CHUNK_PAIRS):
            groups = [(_released_input if released else item_score_input)(items[pk], samples[pk]) for pk in chunk]
            chunk_scores = bon.score_samples(model, groups, setting=setting, references=references)
            units.save_scores({int(item): list(values) for item, values in chunk_scores.items()})
            scored.update(chunk)
            progress(len(scored))
    scores = {str(item): values for item, values in sorted(units.stored_scores().items())}

    # 2. The judge's grade of each sample some k (or the random baseline) picked, once.
    picks = bon.select_all(scores, ks=ks)
    # Seeded by each item's identity (its source id), not by where its database id sorts.
    random_picks = bon.random_baseline_by_item({item: items[int(item)].source_id for item in scores}, ks=ks,
                                               seed=sample_set.seed)
    wanted = {(item, idx) for chosen in (picks, random_picks) for item, by_k in chosen.items()
              for idx in by_k.values()}
    judged = {(str(i), x): v for (i, x), v in units.stored_grades().items()}
    missing = sorted(wanted - set(judged))
    failed = _FailedRequests()
    done = len(set(judged) & wanted)
    progress(len(scores) + done, len(scores) + len(wanted))
    if missing:
        backend = llm_backend(judge, judge_model)
        requests = [bon.JudgeRequest(key=f"{item}:{idx}", question=items[int(item)].question,
                                     aspects=tuple(items[int(item)].rubric_aspects),
                                     answer=samples[int(item)][idx]) for item, idx in missing]
        try:
            for key, score, raw in bon.judge_answers(backend, requests, protocol=protocol):
                if failed.took(raw):
                    continue  # not stored: a retry asks for it again
                item, idx = key.rsplit(":", 1)
                units.save_grade(int(item), int(idx), score)
                judged[(item, int(idx))] = score
                done += 1
                progress(len(scores) + done)
        finally:  # what the server refused (a 400 naming a parameter) is remembered for the endpoint
            endpoint_remember_capabilities(judge, backend)
    if failed:
        return {"missing": failed.missing(total=len(wanted))}

    # 3. Outcomes per k, for the RM and for the random baseline, from complete units only.
    domains = {str(pk): items[pk].domain for pk in samples}
    return {name: bon.outcomes({(item, k): judged[(item, idx)] for item, by_k in chosen.items()
                                for k, idx in by_k.items()}, domains, seed=sample_set.seed)
            for name, chosen in (("rm", picks), ("random", random_picks))}


# Answers the judge did give, stored as unreadable grades (None) and counted as failures in the
# outcome: asking again would get the same (the cache keeps them), so they are not missing units.
JUDGE_ANSWER_REASONS = ("truncated", "refused")


class _FailedRequests:
    """Judge requests that got no answer, counted by reason with each reason's first message."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.counts)

    def took(self, raw: Any) -> bool:
        """Whether the request failed for want of an answer (raw is its exception: an HTTP
        error, a timeout, rate limiting, an unreachable endpoint); counted if so. A reply that
        did not parse, was cut at the token limit twice or refused twice is the judge's answer,
        not a failed request."""
        if not isinstance(raw, Exception) or getattr(raw, "reason", "") in JUDGE_ANSWER_REASONS:
            return False
        reason = getattr(raw, "reason", "") or "error"
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.examples.setdefault(reason, str(raw)[:200])
        return True

    def missing(self, *, total: int) -> dict[str, Any]:
        """{"count", "total", "reasons": {reason: count}, "examples": {reason: first message}}."""
        return {"count": sum(self.counts.values()), "total": total, "reasons": dict(self.counts),
                "examples": dict(self.examples)}


# --- PPO ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PPOUnits:
    """The caller's store of one PPO run's per-question units (each done once).

    stored_answers() -> {item id: the trained policy's answer text};
    save_answers({item id: ppo.PolicyAnswer (text, truncated, retried)});
    stored_grades() -> {item id: the judge's grade 0-2 or None (unreadable)}; save_grade(item id, grade)."""

    stored_answers: Callable[[], dict[int, str]]
    save_answers: Callable[[dict[int, Any]], None]
    stored_grades: Callable[[], dict[int, float | None]]
    save_grade: Callable[[int, float | None], None]


def ppo_held_out(source_id: str, fraction: float) -> bool:
    """Whether a question is held out of PPO training (judged instead): the first byte of
    sha256("prbench-ppo-split:" + source id) below 256 * fraction, so the split depends on the
    question alone, not on the order or the other questions."""
    return hashlib.sha256(f"prbench-ppo-split:{source_id}".encode()).digest()[0] < 256 * fraction


def ppo_policy_folder(*, run_key: str) -> Path:
    """Where a PPO run's trained policy is kept: VAR_DIR/ppo/<run_key>-policy (safetensors,
    tokenizer, config, ppo_run.json). A redelivered run finds it there and does not train again."""
    return Path(settings.VAR_DIR) / "ppo" / f"{run_key}-policy"


def ppo_execute(*, spec: ModelSpec, benchmark: Benchmark, setting: str, policy_model: str, options: Any,
                judge: LLMEndpoint, judge_model: str, run_key: str, units: PPOUnits,
                progress: Progress) -> dict[str, Any]:
    """Train the policy (a causal-LM folder under MODELS_ROOT) with PPO against the RM on the
    benchmark's training questions, answer the held-out ones (`ppo_held_out`), and have the
    judge grade the answers against their rubric aspects (questions without aspects are not graded).

    options: a `prblib.rewards.options.PPOOptions`. The training is one unit: a finished one is
    kept in `ppo_policy_folder(run_key)` and reused. Returns {"training": PPOResult as a dict,
    "outcome": `bon.outcomes(...)[0]` (mean, CI, n, by_domain)}, or {"training", "missing"} when some judge
    requests failed (nothing stored for them; see best_of_n_execute). Progress counts training steps,
    then answers, then grades. ModelError for an RM kind that cannot score new answers (registry `scores_new_answers`) or too few
    questions."""
    from prblib.downstream import bon
    from prblib.downstream import ppo

    _refuse_fixed_scores(spec, "PPO")
    protocol = getattr(options, "protocol", "prbench")
    if protocol == "release":  # the scalar RM read as released, on question + profile text (see _train)
        spec, setting = _released_rm(spec, "PPO"), "no_profile"
    items = list(benchmark.items.order_by("position"))
    train = [i for i in items if not ppo_held_out(i.source_id, options.eval_fraction)]
    held = [i for i in items if ppo_held_out(i.source_id, options.eval_fraction)]
    if len(train) < options.batch_size or not held:
        raise ModelError(f"{len(train)} training and {len(held)} held-out questions: too few for batch size "
                         f"{options.batch_size}")
    total = options.steps + 2 * len(held)  # training steps, then an answer and a grade per held-out question

    # 1. Training (one unit: a killed training starts again; a finished one is kept and reused).
    folder = ppo_policy_folder(run_key=run_key)
    training = _finished_training(folder)
    if training is None:
        progress(0, total)
        training = _train(spec=spec, train=train, setting=setting, policy_model=policy_model, options=options,
                          folder=folder, progress=progress)
    else:
        log.info("PPO %s: reusing the policy trained earlier in %s", run_key, folder)

    # 2. The trained policy answers each held-out question not answered yet.
    answers = units.stored_answers()
    progress(options.steps + len(answers), total)
    for chunk in _chunks([i for i in held if i.pk not in answers], 16):
        rows = [{"id": i.source_id, "question": i.question, "profile_texts": list(item_pair_input(i).profile)}
                for i in chunk]
        generated = ppo.generate_answers(training["out_dir"], ppo.policy_prompts(rows).prompts,
                                         max_new_tokens=options.response_length, seed=options.seed,
                                         temperature=options.answer_temperature, top_p=options.answer_top_p)
        units.save_answers(dict(zip((i.pk for i in chunk), generated, strict=True)))
        answers = units.stored_answers()
        progress(options.steps + len(answers))

    # 3. The judge grades each answer not graded yet.
    gradable = [i for i in held if i.rubric_aspects and i.pk in answers]
    grades = units.stored_grades()
    todo = [i for i in gradable if i.pk not in grades]
    done = len(gradable) - len(todo)
    failed = _FailedRequests()
    if todo:
        backend = llm_backend(judge, judge_model)
        requests = [bon.JudgeRequest(key=i.pk, question=i.question, aspects=tuple(i.rubric_aspects),
                                     answer=answers[i.pk]) for i in todo]
        try:
            for key, score, raw in bon.judge_answers(backend, requests, protocol=protocol):
                if failed.took(raw):
                    continue  # not stored: a retry asks for it again
                units.save_grade(key, score)
                grades[key] = score
                done += 1
                progress(options.steps + len(held) + done)
        finally:
            endpoint_remember_capabilities(judge, backend)
    if failed:
        return {"training": training, "missing": failed.missing(total=len(gradable))}
    judged = {(i.source_id, 0): grades[i.pk] for i in gradable if i.pk in grades}
    outcome = bon.outcomes(judged, {i.source_id: i.domain for i in held}, seed=options.seed)[0]
    progress(total)
    return {"training": training, "outcome": outcome}


def _finished_training(folder: Path) -> dict[str, Any] | None:
    """The PPOResult dict of a training finished in `folder` (its ppo_run.json, written last), or None."""
    import json

    from prblib.downstream.ppo import RUN_INFO_FILE

    try:
        result = json.loads((folder / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {**result, "out_dir": str(folder)} if isinstance(result, dict) else None


def _train(*, spec: ModelSpec, train: list[BenchmarkItem], setting: str, policy_model: str, options: Any,
           folder: Path, progress: Progress) -> dict[str, Any]:
    """Train into a scratch folder beside `folder`, then rename it into place (atomic), so a
    killed training never leaves a half-written policy where a redelivery would reuse it."""
    from prblib.downstream import ppo
    from prblib.modelcheck import inspect_model_folder

    rows = [{"id": i.source_id, "question": i.question, "profile_texts": list(item_pair_input(i).profile)}
            for i in train]
    prepared = ppo.policy_prompts(rows, plans={i.source_id: i.plan for i in train})
    rm = reward_model_get(spec)
    scale = options.reward_scale
    if getattr(options, "protocol", "prbench") == "release":
        # The release's reward server: the question and the profile text joined, no separator.
        contexts = {i.source_id: _released_input(i, ()) for i in train}
        scorer = ppo.scalar_scorer(rm, setting=setting, contexts=contexts)
        missing = None
    elif registry.kind(spec.kind).scores_groups:
        scorer = ppo.scalar_scorer(rm, setting=setting, contexts=prepared.contexts)
        missing = None
    else:
        # Judges compare answers: the reward is the margin over the pair's rubric-blind answer;
        # an unparseable judgement counts as no margin (training needs a number; evaluation never
        # defaults, but a missing reward here only slows learning).
        scorer = ppo.pairwise_scorer(rm, setting=setting, contexts=prepared.contexts,
                                     references={i.source_id: i.rejected for i in train})
        missing = 0.0

    def scaled(pairs):
        return [None if s is None else s * scale for s in scorer(pairs)]

    scaled.__wrapped__ = scorer  # type: ignore[attr-defined]

    if getattr(options, "missing_reward", None) is not None:
        missing = options.missing_reward  # the release: 0.5 whenever the RM gives no score
    reward = ppo.TextRewardModule(scaled if scale != 1 else scorer, missing_score=missing)
    models_root = Path(settings.MODELS_ROOT)
    policy = inspect_model_folder(models_root / policy_model, models_root=models_root, task="causal-lm")
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):  # left by a killed training
        shutil.rmtree(stale, ignore_errors=True)
    scratch = folder.parent / f".tmp-{folder.name}-{secrets.token_hex(4)}"
    steps_done = [0]

    def step_done(n: int) -> None:
        steps_done[0] += n
        progress(min(steps_done[0], options.steps))

    o = options
    ppo.train_ppo(policy_path=policy.path, reward=reward, prompts=prepared.prompts,
                  reward_prompts=prepared.reward_prompts, out_dir=scratch, steps=o.steps, batch_size=o.batch_size,
                  seed=o.seed, learning_rate=o.learning_rate, response_length=o.response_length,
                  temperature=o.temperature, kl_coef=o.kl_coef, ppo_epochs=o.ppo_epochs, mini_batches=o.mini_batches,
                  vf_coef=o.vf_coef, cliprange=o.cliprange, cliprange_value=o.cliprange_value, gamma=o.gamma,
                  lam=o.lam, whiten_rewards=o.whiten_rewards, critic_learning_rate=o.critic_learning_rate,
                  weight_decay=o.weight_decay, lr_schedule=o.lr_schedule, device=settings.RM_DEVICE,
                  progress=step_done)
    try:
        os.rename(scratch, folder)
    except OSError:  # another delivery finished first: keep its policy
        shutil.rmtree(scratch, ignore_errors=True)
    training = _finished_training(folder)
    if training is None:
        raise ModelError(f"the trained policy in {folder} is incomplete (no {ppo.RUN_INFO_FILE})")
    return training
