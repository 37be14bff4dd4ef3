"""Pipeline services: benchmark data (import, export, statistics, freezing), reward-model
loading and scoring, and the one door other apps use into the pipeline.

Other apps (leaderboard) import pipeline code only from here, `pipeline.models` and
`pipeline.domains` (the import contract "pipeline-door" in .importlinter): the names in
"the door" below re-export what they need of `prblib`, `endpoints`, `manifest` and
`downstream`, so those stay internal and can change behind this module."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import heapq
import json
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import reset_queries, transaction
from django.db.models import QuerySet
from django.utils import timezone

from . import formats, formats_prb
from .downstream import (BestOfNUnits, PPOUnits, best_of_n_execute, ppo_execute, ppo_held_out, ppo_policy_folder,
                         samples_by_item, samples_enqueue, samples_generate)
from .blindness import metrics_shown, per_pair_access, per_pair_withheld
from .endpoints import (SpendCapReached, endpoint_model_refusal, llm_backend, model_runtime, spend_charge,
                        spend_estimate, spend_of_usage, spend_record, spend_refusal, spend_reserved)
from .inputs import domain_rows, history_text, item_pair_input, item_score_input, json_key, reward_model_get
from .manifest import code_version, downstream_template_versions, manifest, template_versions
from .manifest import configuration, configuration_sha256, evaluation_manifest  # noqa: F401 (results' identity)
from .models import Benchmark, BenchmarkItem, HistoryRow, LLMEndpoint, pair_key
from prblib.rewards.base import ModelSpec
from prblib.rewards.options import OptionsError, run_options_doc
from prblib.rows import load_json

if TYPE_CHECKING:
    from prblib.rewards.base import PairResult, RewardModel

__all__ = [  # the door: what other apps may use besides the services defined here (the model
    # library `prblib` is imported directly by any app: it is plain Python and imports no app)
    "BestOfNUnits", "PPOUnits", "best_of_n_execute", "ppo_execute", "ppo_held_out", "ppo_policy_folder",
    "samples_by_item", "samples_enqueue", "samples_generate", "llm_backend", "model_runtime", "history_text",
    "endpoint_model_refusal", "item_pair_input", "domain_rows", "item_score_input", "json_key", "reward_model_get",
    "manifest", "template_versions", "downstream_template_versions", "per_pair_withheld", "per_pair_access",
    "metrics_shown", "SpendCapReached", "spend_charge", "spend_estimate", "spend_of_usage", "spend_record",
    "spend_refusal", "spend_reserved", "rm_cancel",
]

IMPORT_BATCH = 500


class BenchmarkError(Exception):
    """A benchmark operation refused with a message meant for the user."""


@dataclass(frozen=True)
class ImportResult:
    benchmark: Benchmark
    created: bool
    item_count: int
    # What the import left out, in one line ("" when nothing): another split of the same folder.
    note: str = ""
    # PersonalRewardBench: repeated train rows removed from users' pools before history sampling
    # (formats_prb.test_histories; 0 under history_sampling "release", None for other formats).
    history_duplicates_removed: int | None = None


def _item_from_record(benchmark: Benchmark, record: formats.Record) -> BenchmarkItem:
    return BenchmarkItem(
        benchmark=benchmark, position=record.position, source_id=record.source_id,
        source_id_is_int=record.source_id_is_int, domain=record.domain, category=record.category,
        question=record.question, profile=record.profile, narrative=record.narrative,
        rubric_aspects=record.rubric_aspects, chosen=record.chosen, rejected=record.rejected, extra=record.extra,
        user_id=record.user_id, history=record.history, pair_key=pair_key(record.chosen, record.rejected),
    )


def benchmark_import(*, path: Path, name: str, description: str = "", created_by: AbstractBaseUser | None = None,
                     progress: Callable[[int], None] | None = None, format: str = "auto",
                     history_size: int = formats_prb.DEFAULT_HISTORY_SIZE, seed: int = formats_prb.DEFAULT_SEED,
                     category: str | None = None, split: str | None = None,
                     history_sampling: str = "prbench") -> ImportResult:
    """Import a file or folder in the published schema as benchmark `name`.

    All or nothing: any bad row raises formats.FormatError and nothing is written.
    Importing the same content under the same name again changes nothing; the same
    name with other content, or the same content under another name, is refused.
    `format`, `history_size`, `seed`, `category`: see formats.read_records (PersonalRewardBench files).
    `split`: "test", "train" or "val"; None: the test split when the files name splits
    (formats.import_files); the result's `note` says what another split left out.
    `history_sampling`: "prbench" (repeated train rows kept once before sampling) or "release" (the
    raw pool, as the authors' release); the result counts the rows removed.
    """
    path = Path(path)
    Benchmark._meta.get_field("name").run_validators(name)  # raises ValidationError on a bad name
    metadata = formats.read_metadata(path)
    _, note = formats.import_files(path, import_split=split or "auto", format=format)
    stats: dict[str, int] = {}
    read = dict(format=format, history_size=history_size, seed=seed, category=category, import_split=split or "auto",
                history_sampling=history_sampling, stats=stats)
    existing = Benchmark.objects.filter(name=name).first()
    if existing is not None:
        digest, count = _hash_only(path, progress, read)
        if digest != existing.content_hash:
            raise BenchmarkError(
                f"benchmark '{name}' already exists with different content "
                f"(stored {existing.content_hash[:12]}, file {digest[:12]}); import it under a new name")
        return ImportResult(benchmark=existing, created=False, item_count=count, note=note,
                            history_duplicates_removed=stats.get("history_duplicates_removed"))

    benchmark = benchmark_create(
        name=name, records=formats.read_records(path, **read),
        description=description or str(metadata.get("description", "")), metadata=metadata, created_by=created_by,
        source=Benchmark.Source.IMPORTED, progress=progress, origin=path)
    return ImportResult(benchmark=benchmark, created=True, item_count=benchmark.item_count, note=note,
                        history_duplicates_removed=stats.get("history_duplicates_removed"))


def benchmark_create(*, name: str, records: Iterable[formats.Record], description: str = "", metadata: dict | None = None,
                     created_by: AbstractBaseUser | None = None, source: str = Benchmark.Source.IMPORTED,
                     progress: Callable[[int], None] | None = None, origin: Path | str | None = None,
                     plans: dict[str, list[str]] | None = None) -> Benchmark:
    """Write a new benchmark from validated records in one transaction (all or nothing),
    in batches so memory stays flat. `plans` maps source ids to planner aspects."""
    with transaction.atomic():
        benchmark = Benchmark.objects.create(name=name, description=description, metadata=metadata or {},
                                             created_by=created_by, source=source)
        hasher, batch, count, material, material_count = formats.ContentHasher(), [], 0, [], 0
        for record in records:
            if count + material_count == 0 and record.kind != benchmark.kind:
                benchmark.kind = record.kind
                benchmark.save(update_fields=["kind"])
            if plans and plans.get(record.source_id):
                record = dataclasses.replace(record, plan=list(plans[record.source_id]))
            # Plans are content: a planned version hashes as what it exports.
            hasher.add(formats.record_digest_row(record))
            if record.split in formats_prb.MATERIAL_SPLITS:
                material.append(HistoryRow(benchmark=benchmark, position=record.position, split=record.split,
                                           user_id=record.user_id, row=record.to_row()))
                material_count += 1
                if len(material) >= IMPORT_BATCH:
                    HistoryRow.objects.bulk_create(material)
                    material.clear()
                continue
            item = _item_from_record(benchmark, record)
            item.plan = record.plan
            batch.append(item)
            count += 1
            if len(batch) >= IMPORT_BATCH:
                BenchmarkItem.objects.bulk_create(batch)
                batch.clear()
                # With DEBUG on, Django keeps every query's SQL; each insert carries a whole
                # batch of rows, so the log alone would grow with the file.
                reset_queries()
                if progress:
                    progress(count)
        BenchmarkItem.objects.bulk_create(batch)
        HistoryRow.objects.bulk_create(material)
        if progress:
            progress(count)
        if count == 0:
            raise formats.FormatError("no test-split rows: nothing to evaluate" if material_count else "no rows found",
                                      file=origin)
        digest = hasher.hexdigest()
        twin = Benchmark.objects.filter(content_hash=digest).exclude(pk=benchmark.pk).first()
        if twin is not None:
            raise BenchmarkError(f"the same content is already imported as benchmark '{twin.name}'")
        benchmark.content_hash, benchmark.item_count = digest, count
        benchmark.save(update_fields=["content_hash", "item_count"])
        benchmark_compute_stats(benchmark=benchmark)
    return benchmark


def _hash_only(path: Path, progress: Callable[[int], None] | None, read: dict[str, Any]) -> tuple[str, int]:
    hasher, count = formats.ContentHasher(), 0
    for record in formats.read_records(path, **read):
        hasher.add(formats.record_digest_row(record))
        count += record.split not in formats_prb.MATERIAL_SPLITS
        if progress and count % IMPORT_BATCH == 0:
            progress(count)
    if progress:
        progress(count)
    return hasher.hexdigest(), count


def benchmark_rows(*, benchmark: Benchmark, items: QuerySet[BenchmarkItem] | None = None) -> Iterator[dict[str, Any]]:
    """The benchmark's rows in the published schema, in source order, streamed from the database."""
    items = benchmark.items.all() if items is None else items
    rows = ((item.position, formats.published_row(
        source_id=item.source_id, source_id_is_int=item.source_id_is_int, question=item.question,
        profile=item.profile, rubric_aspects=item.rubric_aspects, narrative=item.narrative,
        category=item.category, chosen=item.chosen, rejected=item.rejected, extra=item.extra,
        user_id=item.user_id, history=item.history, plan=item.plan)) for item in items.order_by("position").iterator(chunk_size=1000))
    # PersonalRewardBench train/val rows go back in their source order among the test rows.
    material = ((row.position, row.row)
                for row in benchmark.history_rows.order_by("position").iterator(chunk_size=1000))
    for _, row in heapq.merge(rows, material, key=lambda pair: pair[0]):
        yield row


def benchmark_records(*, benchmark: Benchmark) -> Iterator[formats.Record]:
    """The benchmark's items as records (what `benchmark_create` takes), in source order:
    the base of a derived version (plans added, profiles re-ranked)."""
    for item in benchmark.items.order_by("position").iterator(chunk_size=1000):
        yield formats.Record(
            position=item.position, source_id=item.source_id, source_id_is_int=item.source_id_is_int,
            domain=item.domain, category=item.category, question=item.question, profile=item.profile,
            rubric_aspects=item.rubric_aspects, narrative=item.narrative, chosen=item.chosen, rejected=item.rejected,
            extra=item.extra, user_id=item.user_id, history=item.history, plan=list(item.plan or []))


def benchmark_export(*, name: str, out: Path, validated_only: bool = False, without_invalid: bool = False) -> int:
    """Write benchmark `name` to `out` (.jsonl, .json or .parquet); returns the row count.
    `validated_only`: only the pairs human validation found valid; `without_invalid`: every
    pair except those it found invalid (the pairs `benchmark_without_invalid` keeps)."""
    benchmark = Benchmark.objects.filter(name=name).first()
    if benchmark is None:
        raise BenchmarkError(f"no benchmark named '{name}'")
    items = None
    if validated_only:
        items = _validated_items(benchmark)
    elif without_invalid:
        _validated_items(benchmark)  # refuses a benchmark without any verdict
        items = benchmark.items.exclude(validation__valid=False)
    return formats.write_rows(benchmark_rows(benchmark=benchmark, items=items), Path(out))


def _validated_items(benchmark: Benchmark) -> QuerySet[BenchmarkItem]:
    if not benchmark.items.filter(validation__isnull=False).exists():
        # An empty file would look like a valid export; say what is missing instead.
        raise BenchmarkError(
            f"benchmark '{benchmark.name}' has no human validation yet: run an annotation campaign "
            "on it and record its validation before exporting with --validated-only")
    return benchmark.items.filter(validation__valid=True)


def items_record_validation(*, benchmark: Benchmark, source: str,
                            verdicts: dict[str, tuple[bool, list[str]]],
                            details: dict[str, dict[str, Any]] | None = None) -> dict[str, int]:
    """Store human-validation verdicts ({source id: (valid, reasons)}) on the items, each with
    `details[source id]` merged in (e.g. {"campaign": id, "n_annotators": n}). A verdict of
    another source already on an item is kept under "earlier" ({source: that verdict}), so a
    verdict never silently erases another campaign's. Not part of the content hash: the items'
    content does not change."""
    items = {item.source_id: item for item in benchmark.items.filter(source_id__in=verdicts)}
    for source_id, (valid, reasons) in verdicts.items():
        previous = items[source_id].validation or {}
        earlier = dict(previous.get("earlier") or {})
        if previous.get("source") and previous.get("source") != source:
            earlier[previous["source"]] = {k: v for k, v in previous.items() if k != "earlier"}
        earlier.pop(source, None)  # this source's verdict is the current one again
        items[source_id].validation = {"valid": bool(valid), "reasons": list(reasons), "source": source,
                                       **((details or {}).get(source_id) or {}),
                                       **({"earlier": earlier} if earlier else {})}
    BenchmarkItem.objects.bulk_update(items.values(), ["validation"], batch_size=500)
    valid = sum(1 for v, _ in verdicts.values() if v)
    return {"valid": valid, "invalid": len(verdicts) - valid}


def benchmark_without_invalid(*, source: str, name: str, created_by: AbstractBaseUser | None = None) -> Benchmark:
    """A new frozen version `name` of benchmark `source` without the pairs whose recorded human
    verdict is invalid (pairs never validated are kept), with its lineage in the metadata:
    derived_from (name), derived_from_hash, dropped_invalid [source ids], validated_by [the
    verdicts' sources]. Kept pairs keep their verdicts. `source` itself is left untouched.
    Errors: BenchmarkError with the reason (no such benchmark, the name taken or not a valid
    name, no verdict recorded, no pair found invalid, every pair invalid)."""
    from django.core.exceptions import ValidationError

    base = Benchmark.objects.filter(name=source).first()
    if base is None:
        raise BenchmarkError(f"no benchmark named '{source}'")
    try:
        Benchmark._meta.get_field("name").run_validators(name)
    except ValidationError as exc:
        raise BenchmarkError(f"name '{name}': {' '.join(exc.messages)}") from None
    if Benchmark.objects.filter(name=name).exists():
        raise BenchmarkError(f"a benchmark named '{name}' already exists")
    if base.kind != formats.PROFILE_RUBRIC:
        raise BenchmarkError(f"benchmark '{source}' has pair histories: cutting versions of those is not supported")
    verdicts = dict(base.items.filter(validation__isnull=False).values_list("source_id", "validation"))
    if not verdicts:
        raise BenchmarkError(f"benchmark '{source}' has no human validation recorded: rate its pairs in a campaign "
                             "and record the verdicts first")
    dropped = list(base.items.filter(validation__valid=False).order_by("position")
                   .values_list("source_id", flat=True))
    if not dropped:
        raise BenchmarkError(f"no pair of '{source}' was found invalid: the new version would be the same")
    if len(dropped) == base.item_count:
        raise BenchmarkError(f"every pair of '{source}' was found invalid: nothing would be left")
    gone = set(dropped)
    records = [r for r in benchmark_records(benchmark=base) if r.source_id not in gone]
    metadata = {**base.metadata, "derived_from": base.name, "derived_from_hash": base.content_hash,
                "dropped_invalid": dropped,
                "validated_by": sorted({str(v.get("source", "")) for v in verdicts.values()} - {""})}
    with transaction.atomic():
        benchmark = benchmark_create(name=name, records=records, metadata=metadata, created_by=created_by,
                                     source=base.source, description=base.description)
        kept = {i: v for i, v in verdicts.items() if i not in gone}
        items = list(benchmark.items.filter(source_id__in=kept))
        for item in items:
            item.validation = kept[item.source_id]
        BenchmarkItem.objects.bulk_update(items, ["validation"], batch_size=500)
        benchmark_freeze(benchmark=benchmark)
    return benchmark


def benchmark_lineage(*, benchmark: Benchmark) -> dict[str, Any]:
    """{derived_from: the version it was cut from (name) or None, dropped_invalid: [source ids]
    dropped then, derived: [names of versions cut from it, oldest first]}."""
    meta = benchmark.metadata or {}
    derived = list(Benchmark.objects.filter(metadata__derived_from=benchmark.name).order_by("created_at")
                   .values_list("name", flat=True))
    return {"derived_from": meta.get("derived_from"), "dropped_invalid": list(meta.get("dropped_invalid") or []),
            "derived": derived}


def benchmark_stats_enqueue(*, benchmark_ids: list[int]) -> None:
    """Recompute the statistics of these benchmarks on a worker, once the transaction commits
    (the task is sent by name: tasks import services, never the other way round)."""
    from celery import current_app

    for pk in benchmark_ids:
        transaction.on_commit(lambda pk=pk: current_app.send_task("pipeline.compute_benchmark_stats", args=[pk]))


def benchmark_compute_stats(*, benchmark: Benchmark) -> dict[str, Any]:
    """Per-domain counts and answer/profile lengths; stored on the benchmark.

    The chosen/rejected length ratio matters: a reward model that prefers longer answers
    would look personalised if chosen answers were systematically longer."""
    per_domain: dict[str, dict[str, list[float]]] = {}
    rows = benchmark.items.values_list("domain", "chosen", "rejected", "profile", "rubric_aspects")
    for domain, chosen, rejected, profile, aspects in rows.iterator(chunk_size=1000):
        bucket = per_domain.setdefault(domain, {"chosen": [], "rejected": [], "ratio": [], "profile": [], "aspects": []})
        chosen_words, rejected_words = len(chosen.split()), len(rejected.split())
        bucket["chosen"].append(chosen_words)
        bucket["rejected"].append(rejected_words)
        bucket["ratio"].append(chosen_words / max(rejected_words, 1))
        bucket["profile"].append(len(profile))
        bucket["aspects"].append(len(aspects))

    def summary(values: dict[str, list[float]]) -> dict[str, Any]:
        return {
            "items": len(values["chosen"]),
            "mean_chosen_words": round(statistics.fmean(values["chosen"]), 1),
            "mean_rejected_words": round(statistics.fmean(values["rejected"]), 1),
            "mean_length_ratio": round(statistics.fmean(values["ratio"]), 3),
            "mean_profile_posts": round(statistics.fmean(values["profile"]), 1),
            "mean_rubric_aspects": round(statistics.fmean(values["aspects"]), 1),
        }

    overall: dict[str, list[float]] = {key: [] for key in ("chosen", "rejected", "ratio", "profile", "aspects")}
    for bucket in per_domain.values():
        for key, values in bucket.items():
            overall[key].extend(values)
    stats = {
        "overall": summary(overall) if overall["chosen"] else {"items": 0},
        "by_domain": {domain: summary(bucket) for domain, bucket in sorted(per_domain.items())},
    }
    benchmark.stats, benchmark.stats_computed_at = stats, timezone.now()
    benchmark.save(update_fields=["stats", "stats_computed_at"])
    return stats


def benchmark_freeze(*, benchmark: Benchmark) -> bool:
    """Freeze the benchmark (idempotent); True if this call froze it."""
    changed = Benchmark.objects.filter(pk=benchmark.pk, frozen_at__isnull=True).update(frozen_at=timezone.now())
    benchmark.refresh_from_db(fields=["frozen_at"])
    return changed == 1


# --- reward-model scoring (shared by the Celery task and `evaluate_rm`) -------------------

SCORING_CHUNK = 64  # pairs scored between two progress/heartbeat/cancel checks

PROGRESS_STEPS = 20


def rm_usage(model: "RewardModel") -> dict | None:
    """Requests, tokens and cost so far of a generative RM's backends (None for other kinds):
    the declared `RewardModel.usage()`."""
    return model.usage()


def rm_cancel(model: "RewardModel") -> None:
    """Stop a generative RM's backends (thread-safe; a no-op for other kinds): waits and retries
    end and nothing more is sent, so a job told to stop is not held by a hung endpoint."""
    for backend in getattr(model, "backends", None) or ():
        cancel = getattr(backend, "cancel", None)
        if cancel is not None:
            cancel()


def progress_chunk_size(*, total: int, batch_size: int, cap: int) -> int:
    """Pairs scored between two progress updates: about 1/20 of the run, so progress moves
    visibly on small benchmarks too, but never less than one batch (batches stay full) and
    never more than `cap` (RUN_CHUNK_PAIRS, the most work a killed worker loses). The worker and
    `evaluate_rm` score in the same chunks, so batches, and hence float scores, are identical."""
    return max(1, min(cap, max(batch_size, -(-total // PROGRESS_STEPS))))


def rm_score_items(*, model: "RewardModel", items: Iterable[BenchmarkItem], setting: str,
                   on_chunk: Callable[[list[tuple[BenchmarkItem, "PairResult"]]], bool | None],
                   chunk_size: int = SCORING_CHUNK) -> bool:
    """Score items chunk by chunk; `on_chunk` persists or writes each chunk's results and
    may return False to stop early (a cancelled run). True when every item was scored.

    Raises ModelError when the model leaves a pair unscored, or when any score of a chunk is
    NaN or infinite, whatever the RM kind ("non-finite scores ... for N of M pair(s) in this
    chunk, first 'ID'"): the chunk is not passed on, so nothing non-finite is ever stored.

    Every pair carries its row within its domain over the WHOLE benchmark (`domain_rows`, one
    query per benchmark), so a judge under protocol "release" orders each pair as a run over the
    full benchmark does, whatever the chunks, --limit or a resumed run left to score."""
    from prblib.rewards.base import check_setting
    from prblib.errors import ModelError

    chunk: list[BenchmarkItem] = []
    rows_of: dict[int, dict[int, int]] = {}  # benchmark id -> domain_rows

    def row_in_domain(item: BenchmarkItem) -> int | None:
        if item.benchmark_id not in rows_of:
            rows_of[item.benchmark_id] = domain_rows(item.benchmark_id)
        return rows_of[item.benchmark_id].get(item.pk)

    def flush() -> bool:
        pairs = [item_pair_input(item, row_in_domain=row_in_domain(item)) for item in chunk]
        for pair in pairs:
            check_setting(setting, pair)
        by_id = {item.source_id: item for item in chunk}
        results = list(model.score_pairs(pairs, setting=setting))
        missing = set(by_id) - {r.id for r in results}
        if missing:
            raise ModelError(f"the model returned no score for {len(missing)} pair(s), e.g. {sorted(missing)[0]!r}")
        bad = {r.id for r in results if not _finite_scores(r)}
        non_finite = [item.source_id for item in chunk if item.source_id in bad]  # in benchmark order
        if non_finite:
            # e.g. an fp16 overflow in a scalar head: such a run must fail, never rank at accuracy 0.
            raise ModelError(f"the model gave non-finite scores (NaN or infinity) for {len(non_finite)} of "
                             f"{len(results)} pair(s) in this chunk, first {non_finite[0]!r}; nothing of them "
                             "was stored")
        keep_going = on_chunk([(by_id[r.id], r) for r in results])
        chunk.clear()
        return keep_going is not False

    iterator = iter(items)
    try:
        for item in iterator:
            chunk.append(item)
            if len(chunk) >= chunk_size and not flush():
                return False
        return flush() if chunk else True
    finally:
        # A queryset's .iterator() holds a server-side cursor on PostgreSQL: close it now, even when
        # scoring failed mid-way, rather than when the generator is collected, by then inside some
        # other transaction whose CLOSE of the vanished cursor would abort it.
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _finite_scores(result: "PairResult") -> bool:
    """False when a score is NaN or infinite (None, a judge's parse failure, is finite here)."""
    import math

    return all(v is None or math.isfinite(v) for v in (result.chosen_score, result.rejected_score))


def rm_summarize(rows: Iterable[tuple[str, bool, bool, dict, float | None, float | None]], *, kind: str,
                 options: Mapping[str, Any] | None = None, usage: Mapping[str, Any] | None = None,
                 setting: str | None = None) -> dict[str, Any]:
    """The one summary of an RM's per-pair results, used by the Celery task (`run_finalize`)
    and by `evaluate_rm`, so both report the same figures for the same run.

    rows: (domain, correct, tie, details, chosen_score, rejected_score) per pair.
    Returns metrics.summarize's accuracy with ties wrong (the paper's rule), tie rate,
    ties-as-half and bootstrap CIs, overall and per domain, plus:
      truncated_pairs; judge: pairwise order statistics (metrics.judge_order_stats), or for
        pointwise judges and P-GenRM {judgments, parse_failures, parse_failure_rate}, where a
        judgment is one rating (two per pair, pointwise) or one evaluation chain (P-GenRM: m
        per pair plus its neighbours' chains);
      scaling (P-GenRM): [{m, n, accuracy}] for every m' <= m, n' <= n of the stored chains, and
        authors_accounting: strict accuracy beside the P-GenRM authors' two counting rules;
      calibration: `correlation.calibration` of the score differences (scalar, scores and
        pointwise kinds) or `correlation.verdict_calibration` of the verdict shares (pairwise
        judges over both orders, P-GenRM over its chains);
      usage: what a generative RM's backend was asked for (requests, tokens, cost), when given;
      protocol: `protocols.protocol_summary`: {name, label, definition} of the rules the figures
        follow (options.protocol), for a pairwise release run the strict accuracy and the parse
        failures beside the release-comparable accuracy, and a `note` where (by `setting`) the
        result has no published counterpart.
    """
    from prblib.rewards.protocols import protocol_summary

    from prblib.stats import metrics
    from prblib import registry
    from prblib.stats.correlation import calibration, verdict_calibration

    rows = list(rows)
    options = options or {}
    summary = metrics.summarize([(domain, correct, tie) for domain, correct, tie, *_ in rows])
    details = [row[3] for row in rows]
    summary["truncated_pairs"] = sum(1 for d in details if d.get("truncated_posts"))
    if any("orders" in d for d in details):
        summary["judge"] = metrics.judge_order_stats(details)
    elif any("parse_failures" in d for d in details):
        judgments = sum(len(d.get("chains") or []) + len(d.get("neighbours") or []) if "chains" in d else 2
                        for d in details)
        failures = sum(d.get("parse_failures", 0) for d in details)
        summary["judge"] = {"judgments": judgments, "parse_failures": failures,
                            "parse_failure_rate": failures / judgments if judgments else None}
    by_reason: dict[str, int] = {}
    for d in details:  # verdicts truncated or refused twice (judges' details["failures"])
        for reason, count in (d.get("failures") or {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + int(count)
    if "judge" in summary:
        summary["judge"]["failures_by_reason"] = by_reason
    entry = registry.kind(kind)
    if entry.chain_scaling and rows:
        from prblib.rewards.pgenrm.model import authors_accuracy, scaling_grid

        # Accuracy for every (m', n') up to each result's own (m, n), from the stored chains.
        summary["scaling"] = scaling_grid(details)
        summary["authors_accounting"] = authors_accuracy(details)  # the authors' counting beside ours
    if entry.calibration == "verdict_share":
        summary["calibration"] = verdict_calibration([verdict_share(d) for d in details])
    else:
        summary["calibration"] = calibration([c - r for *_, c, r in rows if c is not None and r is not None])
    if usage:
        summary["usage"] = dict(usage)
    summary["protocol"] = protocol_summary(kind, options, details, setting=setting)
    return summary


def verdict_share(details: Mapping[str, Any]) -> float | None:
    """A generative judge's own probability that the chosen answer is better: the share of
    its verdicts that prefer it (pairwise: over the orders judged; P-GenRM: over its chains and
    neighbours' chains, a tie of totals counting half). None when no verdict could be parsed."""
    if "orders" in details:
        verdicts = [o["verdict"] == o["chosen_position"] for o in details["orders"] if o.get("verdict") is not None]
        return sum(verdicts) / len(verdicts) if verdicts else None
    votes = [1.0 if c["chosen_total"] > c["rejected_total"] else 0.5 if c["chosen_total"] == c["rejected_total"]
             else 0.0 for c in (details.get("chains") or []) + (details.get("neighbours") or [])
             if c.get("chosen_total") is not None and c.get("rejected_total") is not None]
    return sum(votes) / len(votes) if votes else None


# --- the door: services other apps use -----------------------------------------------------------

def model_spec(*, kind: str, path: str, device: str, dtype: str, max_length: int, batch_size: int, profile_k: int,
               options: dict, endpoint: LLMEndpoint | None = None, cache_key: str = "",
               benchmark_ids: list[str] | None = None) -> ModelSpec:
    """How a worker loads a reward model: the caller's model fields and options, and a runtime
    decided by the platform alone (`endpoints.model_runtime`: endpoint connection, cache, roots)."""
    runtime = model_runtime(kind=kind, path=path, endpoint=endpoint, cache_key=cache_key, benchmark_ids=benchmark_ids)
    return ModelSpec(kind=kind, path=path, device=device, dtype=dtype, max_length=max_length, batch_size=batch_size,
                     profile_k=profile_k, options=dict(options), runtime=runtime)


def correlation_defaults() -> dict[str, Any]:
    """{"metrics": the metric names `correlate` reports, "rbo_p": the default RBO persistence}."""
    from prblib.stats.correlation import METRICS, RBO_P

    return {"metrics": METRICS, "rbo_p": RBO_P}


CORRELATION_CACHE_SECONDS = 7 * 24 * 3600


def correlate(benchmark_scores: Mapping[str, float], outcomes: Mapping[str, float], **options: Any) -> dict[str, Any]:
    """`prblib.stats.correlation.correlate`: benchmark accuracy of RMs against their downstream
    outcomes (rank and linear correlations with CIs); options: resamples, seed, confidence, ndcg_k, rbo_p.

    The result is a pure function of its arguments (the bootstrap is seeded), so it is kept in
    Django's cache under a key made of every input and the code version: a page that shows the
    same figures again does not pay the bootstrap again (about a second of CPU for 1,000
    resamples, sklearn's NDCG on each), and any change of an accuracy, an outcome or an option
    is a different key, so a cached figure always equals a fresh computation. ValueError for
    bad options, as the function itself."""
    from prblib.stats.correlation import correlate as _correlate

    inputs = json.dumps([code_version(), sorted((str(k), v) for k, v in benchmark_scores.items()),
                         sorted((str(k), v) for k, v in outcomes.items()), sorted(options.items())], default=repr)
    key = "correlate:" + hashlib.sha256(inputs.encode()).hexdigest()
    cached = cache.get(key)
    if cached is None:
        cached = _correlate(benchmark_scores, outcomes, **options)
        cache.set(key, cached, CORRELATION_CACHE_SECONDS)
    return copy.deepcopy(cached)










def option_pairs(pairs: list[str]) -> dict[str, Any]:
    """Command-line `--option KEY=VALUE` arguments as a dict: VALUE read as JSON when it parses,
    else as a string. OptionsError (naming the argument) for one without '=' or a key."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise OptionsError(f"{pair!r}: expected KEY=VALUE", key=key)
        try:
            options[key] = load_json(raw, constants=True)
        except ValueError:  # not JSON (or past load_json's limits): the plain string
            options[key] = raw
    return options


def run_options_help(run_kind: str) -> str:
    """The knobs of a downstream run ("best_of_n", "ppo") for a command's --help: "key (default) description; ..."."""
    return "; ".join(f"{o['name']} ({o['default']}) {o['description']}" for o in run_options_doc(run_kind))

