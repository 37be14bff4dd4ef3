"""Services for building a benchmark from LaMP-QA: import, retrieve, generate, plan, finish.

Each stage only touches the items it has not done yet, and LLM answers are cached by a
hash of their inputs, so a rerun after a crash or a failure resumes where it stopped and
pays for nothing twice. One failing item is recorded with its message and a reason code
(`BuildItem.error_reason`: truncated, refused, unparseable, rate_limited, timed_out,
cancelled, or error for anything else); the others go on. `counts["failed_by_reason"]`
counts failed items per reason, and each role's `tokens` entry counts the answers that were
retried ("events": truncated_retried, refused_retried, ...) and the retry waits.

While the endpoint directs a wait (429 with Retry-After), `progress_text` says so. At the
Celery soft time limit the build stops within seconds: requests in flight are abandoned (their
answers still reach the cache), the finished items are kept, and the reason is recorded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q

from jobs.services import job_enqueue, job_execute, job_fail, job_progress, job_unit_write

from . import formats
from .endpoints import endpoint_remember_capabilities, llm_backend
from .manifest import manifest
from .models import Benchmark, BuildItem, BuildRun, BuildStatus, LLMEndpoint, PromptTemplate
from .services import BenchmarkError, benchmark_create, benchmark_freeze, benchmark_records

log = logging.getLogger(__name__)

STAGES = ("retrieved", "generated", "planned")
ProgressFn = Callable[[str, int], None]  # (stage, items finished since the last call)


class BuildError(Exception):
    """A build refused or stopped, with a message for staff."""


# --- templates -----------------------------------------------------------------------------

def templates_ensure_defaults() -> None:
    """Store the built-in prompt templates as version 1 (once); staff edit them into new versions."""
    from prblib.construction.generation import DEFAULT_TEMPLATES

    for t in DEFAULT_TEMPLATES.values():
        PromptTemplate.objects.get_or_create(name=t.name, version=t.version, defaults={
            "purpose": t.purpose, "system": t.system, "user": t.user})


def template_latest(name: str) -> PromptTemplate:
    template = PromptTemplate.objects.filter(name=name).order_by("-version").first()
    if template is None:
        raise BuildError(f"no prompt template named '{name}'")
    return template


def template_save_version(*, name: str, purpose: str, system: str, user: str,
                          created_by: AbstractBaseUser | None = None) -> PromptTemplate:
    """Store a template as the next version of `name` (version 1 for a new name). Edits never
    overwrite: items keep pointing at the version that produced them."""
    _as_ml_template(PromptTemplate(name=name, purpose=purpose, version=1, system=system, user=user))
    latest = PromptTemplate.objects.filter(name=name).order_by("-version").first()
    return PromptTemplate.objects.create(name=name, purpose=purpose, version=latest.version + 1 if latest else 1,
                                         system=system, user=user, created_by=created_by)


def _as_ml_template(t: PromptTemplate):
    from prblib.errors import ModelError
    from prblib.construction.generation import PromptTemplate as MLTemplate

    try:
        return MLTemplate(name=t.name, purpose=t.purpose, version=t.version, system=t.system, user=t.user)
    except ModelError as exc:
        raise BuildError(f"template {t.name}: {exc}") from None


# --- creating a build --------------------------------------------------------------------------

def build_create(*, user: AbstractBaseUser | None, name: str, source_path: str, generator_model: str,
                 generator: str = "", planner: str = "", planner_model: str = "", domains: list[str] | None = None,
                 split: str = "", limit: int | None = None, profile_k: int = 10, retriever: str = "",
                 avoid_templates: list[str] | None = None, temperature: float = 0.7, seed: int = 0) -> BuildRun:
    if user is not None and not user.is_staff:  # None: the command line, run by an operator
        raise BuildError("Only staff build benchmarks.")
    Benchmark._meta.get_field("name").run_validators(name)
    if Benchmark.objects.filter(name=name).exists() or BuildRun.objects.filter(name=name).exists():
        raise BuildError(f"a benchmark or build named '{name}' already exists")
    source = resolve_source(source_path)
    templates_ensure_defaults()
    endpoints = {}
    for field, endpoint in (("generator", generator), ("planner", planner)):
        if endpoint:
            endpoints[field] = LLMEndpoint.objects.filter(name=endpoint, enabled=True).first()
            if endpoints[field] is None:
                raise BuildError(f"no enabled LLM endpoint named '{endpoint}'")
    with transaction.atomic():
        build = BuildRun.objects.create(
            name=name, source_path=str(source), domains=domains or [], split=split, limit=limit, profile_k=profile_k,
            retriever=retriever, generator=endpoints.get("generator"), generator_model=generator_model,
            planner=endpoints.get("planner"), planner_model=planner_model,
            chosen_template=template_latest("chosen"),
            planner_template=template_latest("planner") if planner_model else None,
            temperature=temperature, seed=seed, created_by=user)
        build.avoid_templates.set([template_latest(n) for n in (avoid_templates or _default_avoid_names())])
    return build


def _default_avoid_names() -> list[str]:
    from prblib.construction.generation import DEFAULT_TEMPLATES

    return [t.name for t in DEFAULT_TEMPLATES.values() if t.purpose == "avoid"]


def resolve_source(source_path: str) -> Path:
    """LaMP-QA files must lie under DATA_ROOT (symlinks resolved)."""
    root = Path(settings.DATA_ROOT).resolve()
    candidate = Path(source_path)
    candidate = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not candidate.is_relative_to(root):
        raise BuildError(f"{source_path} is outside the data folder {root}")
    if not candidate.exists():
        raise BuildError(f"{source_path}: no such file or folder under {root}")
    return candidate


def build_resume(*, build: BuildRun, skip_failed: bool = False, enqueue: bool = True) -> None:
    """Run the build again: failed items get another try (answers already paid for come
    from the cache) and finished stages are skipped; with `skip_failed` the failed items are
    left out and the benchmark is made from the rest. With enqueue=False the caller runs it
    in this process (build_execute)."""
    if build.status in (BuildStatus.RUNNING, BuildStatus.QUEUED):
        raise BuildError("the build is already queued or running")
    refusal = build.job_retry_refusal()
    if refusal:
        raise BuildError(refusal)
    if skip_failed:
        BuildRun.objects.filter(pk=build.pk).update(skip_failed=True)
    else:
        build.job_reset_for_retry()
    BuildRun.objects.filter(pk=build.pk).update(attempts=0)
    build_enqueue(build=build, send=enqueue)


def build_enqueue(*, build: BuildRun, send: bool = True) -> None:
    """Queue the build; its task is sent when the transaction commits (send=False: the caller
    runs build_execute in this process)."""
    job_enqueue(build, send=send)


# --- running --------------------------------------------------------------------------------------

def build_execute(*, build_id: int, progress: ProgressFn | None = None) -> str:
    """Claim the build and run every stage that still has work (see jobs.services.job_execute);
    returns the final status."""
    def work(build: BuildRun) -> dict:
        build = BuildRun.objects.select_related("generator", "planner", "chosen_template", "planner_template") \
            .get(pk=build.pk)
        if build.benchmark_id:  # finished before its worker was lost
            return {}
        try:
            if not build.items.exists():
                _stage_import(build)
            _stage_retrieve(build, progress)
            _stage_generate(build, progress)
            if build.planner_model:
                _stage_plan(build, progress)
            _refresh_counts(build)
            _finish(build)
        except SoftTimeLimitExceeded:
            _refresh_counts(build)
            done = build.items.filter(error="").exclude(chosen="").count()
            BuildRun.objects.filter(pk=build.pk).update(progress_text="")
            job_fail(build, f"Stopped by the time limit ({settings.CELERY_TASK_SOFT_TIME_LIMIT} s); the {done} "
                            "item(s) generated so far are kept. Resume to continue from there.")
        except (BuildError, BenchmarkError, formats.FormatError):
            _refresh_counts(build)
            BuildRun.objects.filter(pk=build.pk).update(progress_text="")  # no wait is under way any more
            raise
        return {"error": "", "progress_text": ""}

    return job_execute(BuildRun, build_id, work, expected=(BuildError, BenchmarkError, formats.FormatError))


def _stage_import(build: BuildRun) -> None:
    """All or nothing: a bad LaMP-QA row names its file, line and field, and no item is kept."""
    records = []
    for record in formats.read_records(Path(build.source_path), require_pair=False, split=build.split):
        if build.domains and record.domain not in build.domains:
            continue
        records.append(record)
        if build.limit and len(records) >= build.limit:
            break
    if not records:
        raise BuildError("no LaMP-QA rows matched the source, domains and limit")
    with job_unit_write(build):
        BuildItem.objects.bulk_create([
            BuildItem(build=build, position=i, source_id=r.source_id, source_id_is_int=r.source_id_is_int,
                      domain=r.domain, category=r.category, question=r.question, narrative=r.narrative,
                      rubric_aspects=r.rubric_aspects, profile=r.profile) for i, r in enumerate(records)])
    _tick(build, None, "imported", 0)


def _pending(build: BuildRun, stage: str):
    items = build.items.filter(error="")
    if stage == "retrieved":
        return items.filter(ranked_profile__isnull=True)
    if stage == "generated":
        return items.filter(ranked_profile__isnull=False).filter(Q(chosen="") | Q(rejected=""))
    return items.exclude(chosen="").filter(plan__isnull=True)


def _stage_retrieve(build: BuildRun, progress: ProgressFn | None) -> None:
    """Rank each item's posts (repeats removed first: `retrieval.dedupe_posts`); an item records how
    many repeats it had (outputs["duplicate_posts_removed"]), the build's counts the total."""
    from prblib.construction.retrieval import DenseRetriever, dedupe_posts

    pending = list(_pending(build, "retrieved"))
    if not pending:
        return
    cache = Path(settings.VAR_DIR) / "embedding-cache"
    retriever = (DenseRetriever.from_name(build.retriever, cache_dir=cache) if build.retriever
                 else DenseRetriever.default(cache_dir=cache))
    try:
        for start in range(0, len(pending), 64):
            chunk = pending[start:start + 64]
            ranked = retriever.rank_many([(item.question, item.profile) for item in chunk], k=build.profile_k)
            for item, scored in zip(chunk, ranked):
                item.ranked_profile = [dict(post, score=round(float(score), 6)) for post, score in scored]
                item.outputs = {**item.outputs, "duplicate_posts_removed": dedupe_posts(item.profile)[1]}
                build.counts["duplicate_posts_removed"] = (build.counts.get("duplicate_posts_removed", 0)
                                                           + item.outputs["duplicate_posts_removed"])
            with job_unit_write(build):
                BuildItem.objects.bulk_update(chunk, ["ranked_profile", "outputs"])
            _tick(build, progress, "retrieved", len(chunk))
    finally:
        retriever.close()


LENGTH_SEED_STRIDE = 1000  # a regeneration round r samples with seed + r * stride, so the cache cannot repeat it


def _stage_generate(build: BuildRun, progress: ProgressFn | None) -> None:
    """Generate the pairs still missing. A pair whose length ratio stays outside the build's
    band after generation's regeneration attempts is not kept: the item fails at stage
    "length" naming its ratio; resuming regenerates it with fresh seeds (round r uses seed +
    r * LENGTH_SEED_STRIDE), resuming with skip_failed drops it. A finished benchmark holds
    only pairs inside the band."""
    from prblib.construction import generation

    pending = list(_pending(build, "generated"))
    if not pending:
        return
    backend = llm_backend(build.generator, build.generator_model)
    flush = _show_waits(build, backend, "generator")
    avoid = {_as_ml_template(t).key: t for t in build.avoid_templates.all()}
    bounds = (build.length_ratio_min, build.length_ratio_max)
    rounds: dict[int, list[BuildItem]] = {}
    for item in pending:
        rounds.setdefault(int(item.outputs.get("length_rounds", 0)), []).append(item)
    try:
        for length_round, items in sorted(rounds.items()):
            by_id = {item.source_id: item for item in items}
            # Only what generation may see: no narrative key is passed at all.
            requests = [{"id": item.source_id, "question": item.question,
                         "profile_texts": [p.get("text", "") for p in item.ranked_profile],
                         "rubric_aspects": item.rubric_aspects} for item in items]
            outcomes = generation.generate_many(
                backend, requests, chosen_template=_as_ml_template(build.chosen_template),
                avoid_templates=[_as_ml_template(t) for t in avoid.values()], temperature=build.temperature,
                seed=build.seed + length_round * LENGTH_SEED_STRIDE, bounds=bounds, idle=flush)
            for source_id, outcome in outcomes:
                item = by_id[source_id]
                if not isinstance(outcome, Exception) and outcome.chosen.strip() == outcome.rejected.strip():
                    outcome = BuildError("the generator wrote the same answer with and without the rubric")
                if isinstance(outcome, Exception):
                    _record_failure(build, item, "generate", outcome)
                elif outcome.within_bounds is False:
                    item.outputs = {**item.outputs, "generation": outcome.to_dict(), "length_rounds": length_round + 1}
                    item.error_stage, item.error_reason = "length", "length_ratio"
                    item.error = (f"length ratio {outcome.length_ratio:.3f} (chosen/rejected words) is outside "
                                  f"[{bounds[0]}, {bounds[1]}] after {len(outcome.attempts)} generation calls: "
                                  "resume to regenerate it with new seeds, or resume with 'skip failed items' to "
                                  "drop it")
                    with job_unit_write(build):
                        item.save(update_fields=["outputs", "error_stage", "error", "error_reason"])
                else:
                    item.chosen, item.rejected = outcome.chosen, outcome.rejected
                    item.avoid_template = avoid[outcome.avoid_template]
                    item.outputs = {**item.outputs, "generation": outcome.to_dict(),
                                    "generator": f"{build.generator or 'local'}:{build.generator_model}"}
                    with job_unit_write(build):
                        item.save(update_fields=["chosen", "rejected", "avoid_template", "outputs"])
                _tick(build, progress, "generated", 1)
    finally:  # what the server refused (a 400 naming a parameter) is remembered for the endpoint
        endpoint_remember_capabilities(build.generator, backend)
    _record_tokens(build, "generator", backend)


def _stage_plan(build: BuildRun, progress: ProgressFn | None) -> None:
    from prblib.construction import generation

    pending = list(_pending(build, "planned"))
    if not pending:
        return
    backend = llm_backend(build.planner, build.planner_model)
    flush = _show_waits(build, backend, "planner")
    template = _as_ml_template(build.planner_template)
    by_id = {item.source_id: item for item in pending}
    requests = [{"id": item.source_id, "question": item.question,
                 "profile_texts": [p.get("text", "") for p in item.ranked_profile]} for item in pending]
    try:
        for source_id, outcome in generation.plan_many(backend, requests, template=template, seed=build.seed,
                                                       idle=flush):
            item = by_id[source_id]
            if isinstance(outcome, Exception):
                _record_failure(build, item, "plan", outcome)
            else:
                item.plan = list(outcome)
                item.outputs = {**item.outputs, "planner": f"{build.planner or 'local'}:{build.planner_model}",
                                "planner_template": str(build.planner_template)}
                with job_unit_write(build):
                    item.save(update_fields=["plan", "outputs"])
            _tick(build, progress, "planned", 1)
    finally:  # a refused response_format (or other parameter) is remembered even when the stage stops early
        endpoint_remember_capabilities(build.planner, backend)
    _record_tokens(build, "planner", backend)


def _record_failure(build: BuildRun, item: BuildItem, stage: str, exc: Exception) -> None:
    """A failed item keeps its stage, its message and the reason code of an unusable answer."""
    from prblib.llm.answers import AnswerError

    item.error_stage, item.error = stage, str(exc)[:2000]
    item.error_reason = exc.reason if isinstance(exc, AnswerError) and exc.reason else "error"
    with job_unit_write(build):
        item.save(update_fields=["error_stage", "error", "error_reason"])


def _show_waits(build: BuildRun, backend: Any, role: str) -> Callable[[], None]:
    """Every retry wait shows in the build's progress_text, with the waits so far. Waits happen in
    request threads, which must not use this thread's database connection: they leave the text,
    and the returned flush (called in this thread: run_unordered's `idle`) writes it."""
    import threading

    lock = threading.Lock()
    state = {"n": 0, "seconds": 0.0, "text": None}

    def flush() -> None:
        with lock:
            text, state["text"] = state["text"], None
        if text is not None:
            BuildRun.objects.filter(pk=build.pk).update(progress_text=text[:300])

    def on_wait(seconds: float, why: str) -> None:
        with lock:
            state["n"] += 1
            state["seconds"] += seconds
            state["text"] = (f"{role}: waiting {seconds:.0f} s ({why}); {state['n']} wait(s), "
                             f"{state['seconds']:.0f} s so far")
        if threading.current_thread() is threading.main_thread():
            flush()

    backend.on_wait = on_wait
    return flush


def _record_tokens(build: BuildRun, role: str, backend: Any) -> None:
    """Requests, tokens and cost the stage spent, with cache hits (what a rerun did not pay),
    retry waits, and the answers retried or failed by reason ("events"). Requests answered
    without token usage are counted (requests_without_usage) and make the cost unknown (None)."""
    usage = _usage_of(backend)
    previous = build.tokens.get(role, {})
    for key in ("requests", "requests_without_usage", "prompt_tokens", "completion_tokens", "cache_hits",
                "cache_misses", "waits", "server_waits"):
        usage[key] = (usage.get(key) or 0) + (previous.get(key) or 0)
    usage["waited_seconds"] = round((usage.get("waited_seconds") or 0) + (previous.get("waited_seconds") or 0), 3)
    events = dict(previous.get("events") or {})
    for name, count in (usage.get("events") or {}).items():
        events[name] = events.get(name, 0) + count
    usage["events"] = events
    if usage["requests_without_usage"]:
        usage["cost"] = None
    elif usage.get("cost") is not None or previous.get("cost") is not None:
        usage["cost"] = (usage.get("cost") or 0) + (previous.get("cost") or 0)
    build.tokens = {**build.tokens, role: usage}
    BuildRun.objects.filter(pk=build.pk).update(tokens=build.tokens)


def _tick(build: BuildRun, progress: ProgressFn | None, stage: str, n: int) -> None:
    """Refresh the counts and the job's progress (item-stages done of all item-stages); stops
    the build (JobStopped) once it was cancelled."""
    counts = _refresh_counts(build)
    stages = STAGES if build.planner_model else STAGES[:2]
    job_progress(build, sum(counts[s] for s in stages), counts["total"] * len(stages))
    if progress:
        progress(stage, n)


def _refresh_counts(build: BuildRun) -> dict[str, int]:
    items = build.items
    counts = {
        "total": items.count(),
        "retrieved": items.filter(ranked_profile__isnull=False).count(),
        "generated": items.exclude(chosen="").exclude(rejected="").count(),
        "planned": items.filter(plan__isnull=False).count(),
        "failed": items.exclude(error="").count(),
        "duplicate_posts_removed": build.counts.get("duplicate_posts_removed", 0),  # kept by _stage_retrieve
        "failed_by_reason": dict(items.exclude(error="").values_list("error_reason").annotate(n=Count("id"))
                                 .values_list("error_reason", "n")),
    }
    BuildRun.objects.filter(pk=build.pk).update(counts=counts)
    build.counts = counts
    return counts


def _finish(build: BuildRun) -> None:
    """The items that went through every stage become a new benchmark version. With failed
    items the build stops for a resume, unless it was told to skip them."""
    failed = build.counts.get("failed", 0)
    if failed and not build.skip_failed:
        raise BuildError(f"{failed} item(s) failed (see below); resume to retry them, or resume with "
                         "'skip failed items' to finish without them")
    done = build.items.filter(error="").exclude(chosen="").exclude(rejected="").order_by("position")
    if build.planner_model:
        done = done.filter(plan__isnull=False)
    if not done.exists():
        raise BuildError(f"no item finished every stage ({build.counts.get('failed', 0)} failed); see the items' errors")
    records = (formats.Record(
        position=i, source_id=item.source_id, source_id_is_int=item.source_id_is_int, domain=item.domain,
        category=item.category, question=item.question,
        profile=[{k: v for k, v in post.items() if k != "score"} for post in item.ranked_profile],
        rubric_aspects=item.rubric_aspects, narrative=item.narrative, chosen=item.chosen, rejected=item.rejected)
        for i, item in enumerate(done.iterator(chunk_size=500)))
    plans = dict(done.values_list("source_id", "plan")) if build.planner_model else None
    metadata = {"built_from": build.source_path, "build": build.pk, "generator": build.generator_model,
                "chosen_template": str(build.chosen_template),
                "avoid_templates": [str(t) for t in build.avoid_templates.all()],
                "planner": build.planner_model or None, "retriever": build.retriever or "all-MiniLM-L6-v2",
                "profile_k": build.profile_k, "failed_items": build.counts.get("failed", 0),
                "failed_by_reason": build.counts.get("failed_by_reason", {}),
                "duplicate_posts_removed": build.counts.get("duplicate_posts_removed", 0),
                "manifest": manifest(build=build.pk, source=build.source_path, split=build.split,
                                     domains=build.domains, limit=build.limit, seed=build.seed,
                                     temperature=build.temperature,
                                     length_band=[build.length_ratio_min, build.length_ratio_max],
                                     generator=f"{build.generator or 'local'}:{build.generator_model}",
                                     planner=f"{build.planner or 'local'}:{build.planner_model}"
                                     if build.planner_model else None,
                                     templates=[str(t) for t in [build.chosen_template, build.planner_template,
                                                                 *build.avoid_templates.all()] if t],
                                     retriever=build.retriever or "all-MiniLM-L6-v2", profile_k=build.profile_k,
                                     device=settings.RM_DEVICE)}
    with job_unit_write(build):  # the benchmark and the build's link to it, together (this execution's only)
        benchmark = benchmark_create(name=build.name, records=records, metadata=metadata,
                                     created_by=build.created_by, source=Benchmark.Source.BUILT, plans=plans)
        BuildRun.objects.filter(pk=build.pk).update(benchmark=benchmark)


# --- derived versions of any benchmark: plans, re-ranked profiles ----------------------------------

def benchmark_plan(*, source: str, name: str, planner: str, planner_model: str, seed: int = 0,
                   created_by: AbstractBaseUser | None = None) -> tuple[Benchmark, dict[str, Any]]:
    """A new frozen version of benchmark `source` named `name`, each item with planner aspects
    for the `plan` setting (the latest "planner" template; the planner sees the question and
    the profile only). Resumable and costed like builds: answers are cached by a hash of the
    call, so a rerun after a failure pays only for the items that failed. Returns (benchmark,
    usage {requests, prompt_tokens, completion_tokens, cost, cache_hits, cache_misses}).
    BuildError names the items that failed (nothing is written then) or a bad argument."""
    from prblib.construction import generation

    base = _derivable(source, name)
    if base.kind != formats.PROFILE_RUBRIC:
        raise BuildError(f"benchmark '{source}' has pair histories, not profiles: the planner has nothing to read")
    endpoint = None
    if planner:
        endpoint = LLMEndpoint.objects.filter(name=planner, enabled=True).first()
        if endpoint is None:
            raise BuildError(f"no enabled LLM endpoint named '{planner}'")
    templates_ensure_defaults()
    template = template_latest("planner")
    backend = llm_backend(endpoint, planner_model)
    records = list(benchmark_records(benchmark=base))
    requests = [{"id": r.source_id, "question": r.question, "profile_texts": [p.get("text", "") for p in r.profile]}
                for r in records]
    plans, failed = {}, {}
    try:
        for source_id, outcome in generation.plan_many(backend, requests, template=_as_ml_template(template),
                                                       seed=seed):
            if isinstance(outcome, Exception):
                failed[source_id] = str(outcome)
            else:
                plans[source_id] = list(outcome)
    finally:
        endpoint_remember_capabilities(endpoint, backend)
    usage = _usage_of(backend)
    if failed:
        first = sorted(failed)[0]
        raise BuildError(f"the planner failed on {len(failed)} item(s), e.g. {first}: {failed[first][:300]} "
                         "(run the command again: finished items come from the cache)")
    metadata = {**base.metadata, "derived_from": base.name, "derived_from_hash": base.content_hash,
                "planner": f"{planner or 'local'}:{planner_model}", "planner_template": str(template),
                "planner_seed": seed, "manifest": manifest(derived_from_hash=base.content_hash,
                                                           planner=f"{planner or 'local'}:{planner_model}",
                                                           templates=[str(template)], seed=seed)}
    benchmark = benchmark_create(name=name, records=records, metadata=metadata, created_by=created_by,
                                 source=base.source, plans=plans, description=base.description)
    benchmark_freeze(benchmark=benchmark)
    return benchmark, usage


def benchmark_rank_profiles(*, source: str, name: str, retriever: str, k: int = 10,
                            created_by: AbstractBaseUser | None = None) -> Benchmark:
    """A new frozen version of benchmark `source` named `name` whose profiles are each item's
    top-k posts for its question, ranked by the dense `retriever` (a model folder, or a Hub id
    already in the local cache; DenseRetriever, mean pooling as the paper's Contriever). For a
    source whose profiles are unranked (LaMP-QA order). BuildError on a bad argument."""
    from prblib.errors import ModelError
    from prblib.construction.retrieval import DenseRetriever

    if k < 1:
        raise BuildError("k must be at least 1")
    base = _derivable(source, name)
    if base.kind != formats.PROFILE_RUBRIC:
        raise BuildError(f"benchmark '{source}' has pair histories, not profiles to rank")
    records = list(benchmark_records(benchmark=base))
    try:
        model = DenseRetriever.from_name(retriever, cache_dir=Path(settings.VAR_DIR) / "embedding-cache")
    except (ModelError, OSError) as exc:
        raise BuildError(f"retriever {retriever}: {exc}") from None
    try:
        ranked = model.rank_many([(r.question, r.profile) for r in records], k=k)
    finally:
        model.close()
    records = [dataclasses.replace(r, profile=[dict(post) for post, _score in scored])
               for r, scored in zip(records, ranked)]
    metadata = {**base.metadata, "derived_from": base.name, "derived_from_hash": base.content_hash,
                "retriever": retriever, "profile_k": k,
                "manifest": manifest(derived_from_hash=base.content_hash, retriever=retriever, profile_k=k,
                                     device=settings.RM_DEVICE)}
    benchmark = benchmark_create(name=name, records=records, metadata=metadata, created_by=created_by,
                                 source=base.source, description=base.description)
    benchmark_freeze(benchmark=benchmark)
    return benchmark


def _derivable(source: str, name: str) -> Benchmark:
    base = Benchmark.objects.filter(name=source).first()
    if base is None:
        raise BuildError(f"no benchmark named '{source}'")
    if Benchmark.objects.filter(name=name).exists():
        raise BuildError(f"a benchmark named '{name}' already exists")
    try:
        Benchmark._meta.get_field("name").run_validators(name)
    except ValidationError as exc:
        raise BuildError(f"name '{name}': {' '.join(exc.messages)}") from None
    return base


def _usage_of(backend: Any) -> dict[str, Any]:
    inner = getattr(backend, "inner", backend)
    usage = inner.usage() if callable(getattr(inner, "usage", None)) else {}
    return {**usage, "cache_hits": getattr(backend, "hits", 0), "cache_misses": getattr(backend, "misses", 0)}
