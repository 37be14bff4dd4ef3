"""Benchmark health from the stored per-pair results (leaderboard.health has the figures and
their definitions), cached by what it reads; re-annotation campaigns opened from it.

What the report reads, and so its cache key (`_health_key`):
- the benchmark's content hash (its pairs, answers and domains; frozen once evaluated);
- its published succeeded runs: id, setting, when they finished, the name shown (a run that is
  retried, unpublished or renamed is another key);
- the human verdicts recorded on its items (a digest of every recorded verdict);
- the ratings of its campaigns (count, newest id, revisions' count and newest id), for the
  rating gap;
- HEALTH_VERSION, bumped when the computation changes what it returns.
So a cached report always equals a fresh computation; it is kept in Django's cache (Redis in
deployments) for HEALTH_CACHE_SECONDS, and the last MEMO_REPORTS a process used also in memory.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict, defaultdict
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Count, Max
from django.utils import timezone

from annotation.models import Campaign, Rating
from annotation.services.campaigns import campaign_create
from annotation.services.errors import AnnotationError
from pipeline.models import Benchmark, BuildItem
from pipeline.services import benchmark_lineage

from .. import health
from ..models import EvaluationRun, PairScore, RunStatus

HEALTH_VERSION = 1
HEALTH_CACHE_SECONDS = 7 * 24 * 3600
# The last reports this process used, by key: a visit whose key is one of them skips unpickling
# the cached report (most of a cached visit's time). Keys name everything a report reads, so an
# entry is never stale. The reports are shared: callers must not change them.
MEMO_REPORTS = 4
_MEMO: OrderedDict[str, dict[str, Any]] = OrderedDict()
VARIANT_KEYS = ("avoid_variant", "rejected_variant")  # a source row's field naming the rejected answer's variant
LINEAGE_DEPTH = 10  # versions followed back to their build for the rejected variants


def _published_runs(benchmark: Benchmark) -> list[tuple]:
    """(run id, setting, finished_at, display name) of the benchmark's published succeeded runs,
    in setting then id order."""
    return list(EvaluationRun.objects.filter(status=RunStatus.SUCCEEDED, submission__benchmark=benchmark,
                                             submission__published=True)
                .order_by("setting", "pk").values_list("pk", "setting", "finished_at", "submission__display_name"))


def _health_key(benchmark: Benchmark, runs: list[tuple]) -> str:
    verdicts = hashlib.sha256()
    for pk, validation in (benchmark.items.filter(validation__isnull=False).order_by("pk")
                           .values_list("pk", "validation").iterator(chunk_size=5000)):
        verdicts.update(json.dumps([pk, validation], sort_keys=True).encode())
    ratings = Rating.objects.filter(campaign__benchmark=benchmark).aggregate(
        n=Count("pk", distinct=True), last=Max("pk"), n_revisions=Count("revisions"), last_revision=Max("revisions__pk"))
    basis = [HEALTH_VERSION, benchmark.pk, benchmark.content_hash, runs, verdicts.hexdigest(),
             sorted(ratings.items())]
    return hashlib.sha256(json.dumps(basis, default=str).encode()).hexdigest()


def _variants(benchmark: Benchmark) -> dict[str, str]:
    """{source id: the rubric-avoid template's name} from the build that made the benchmark, or
    the build of the version it was derived from (metadata derived_from), up to LINEAGE_DEPTH."""
    chain, current = [], benchmark
    while current is not None and len(chain) < LINEAGE_DEPTH:
        chain.append(current.pk)
        parent = (current.metadata or {}).get("derived_from")
        current = Benchmark.objects.filter(name=parent).first() if isinstance(parent, str) else None
    out: dict[str, str] = {}
    for pk in reversed(chain):  # the nearest build wins
        out.update(BuildItem.objects.filter(build__benchmark_id=pk, avoid_template__isnull=False)
                   .values_list("source_id", "avoid_template__name"))
    return out


def _rubric_key(dimensions: list[dict]) -> str:
    keys = [d["key"] for d in dimensions]
    return "personal_rubrics" if "personal_rubrics" in keys else keys[-1]


def _gaps(benchmark: Benchmark) -> dict[int, float]:
    """{item pk: chosen minus rejected on the rubric dimension, mean over the annotators of the
    latest campaign (highest id) that rated the pair}."""
    rubric = {pk: _rubric_key(dims) for pk, dims in Campaign.objects.filter(benchmark=benchmark)
              .values_list("pk", "dimensions")}
    diffs: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for item_id, campaign_id, chosen, rejected in (Rating.objects.filter(campaign__benchmark=benchmark)
                                                   .values_list("item_id", "campaign_id", "chosen", "rejected")
                                                   .iterator(chunk_size=5000)):
        key = rubric[campaign_id]
        if key in chosen and key in rejected:
            diffs[item_id][campaign_id].append(float(chosen[key]) - float(rejected[key]))
    gaps = {}
    for item_id, by_campaign in diffs.items():
        latest = by_campaign[max(by_campaign)]
        gaps[item_id] = sum(latest) / len(latest)
    return gaps


def _compute(benchmark: Benchmark, runs: list[tuple]) -> dict[str, Any]:
    variants = _variants(benchmark)
    gaps = _gaps(benchmark)
    pairs = []
    for pk, source_id, domain, chosen, rejected, validation, extra in (
            benchmark.items.order_by("position").values_list("pk", "source_id", "domain", "chosen", "rejected",
                                                              "validation", "extra").iterator(chunk_size=2000)):
        named = next((str(extra[k]) for k in VARIANT_KEYS if isinstance(extra, dict) and extra.get(k)), None)
        pairs.append(health.Pair(
            key=pk, source_id=source_id, domain=domain, chosen_words=len(chosen.split()),
            rejected_words=len(rejected.split()), variant=variants.get(source_id) or named or health.NOT_RECORDED,
            verdict=validation.get("valid") if isinstance(validation, dict) else None, gap=gaps.get(pk)))
    correct: dict[int, dict[int, bool]] = defaultdict(dict)
    for run_id, item_id, right in (PairScore.objects.filter(run_id__in=[r[0] for r in runs])
                                   .values_list("run_id", "item_id", "correct").iterator(chunk_size=10000)):
        correct[run_id][item_id] = right
    results = [health.Result(key=pk, name=name, setting=setting, correct=correct[pk])
               for pk, setting, _, name in runs]
    return health.health_report(pairs, results)


def benchmark_health(*, benchmark: Benchmark) -> dict[str, Any]:
    """The health report of `benchmark` (`leaderboard.health.health_report` over its pairs and
    published results) plus {benchmark, key, computed_at (ISO time), cached (bool), lineage
    (`pipeline.services.benchmark_lineage`)}. Cached under `_health_key`: a later call with
    nothing changed reads the cache (a few small queries) instead of every per-pair result.
    The report's nested rows are shared with later calls: read them, do not change them."""
    runs = _published_runs(benchmark)
    key = _health_key(benchmark, runs)
    report = _MEMO.get(key)
    if report is None:
        report = cache.get(f"health:{key}")
    cached = report is not None
    if report is None:
        report = _compute(benchmark, runs)
        report["computed_at"] = timezone.now().isoformat()
        cache.set(f"health:{key}", report, HEALTH_CACHE_SECONDS)
    _MEMO[key] = report
    _MEMO.move_to_end(key)
    while len(_MEMO) > MEMO_REPORTS:
        _MEMO.popitem(last=False)
    return {**report, "benchmark": benchmark.name, "key": key, "cached": cached,
            "lineage": benchmark_lineage(benchmark=benchmark)}


FLAG_CHOICES = (*health.FLAGS, "any")


def health_pairs(report: dict[str, Any], *, flag: str | None = None, domain: str | None = None) -> list[dict[str, Any]]:
    """The report's pairs carrying `flag` (a FLAGS name, or "any" for at least one) and in
    `domain`, in benchmark order; None: no filter."""
    rows = report["pairs"]
    if flag == "any":
        rows = [r for r in rows if r["flags"]]
    elif flag:
        rows = [r for r in rows if flag in r["flags"]]
    if domain:
        rows = [r for r in rows if r["domain"] == domain]
    return rows


CSV_FIGURES = ("right", "n", "share", "weighted_share", "discrimination")


def health_csv(report: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """(fields, rows) of the CSV export, one row per pair in benchmark order: id, domain,
    length ratio and word counts, rejected variant, verdict (valid/invalid/empty), rating gap,
    flags (space-separated), then per setting S the columns S_right, S_n, S_share,
    S_weighted_share, S_discrimination."""
    settings = report["settings"]
    fields = ["id", "domain", "length_ratio", "chosen_words", "rejected_words", "rejected_variant", "verdict",
              "rating_gap", "flags", *[f"{s}_{name}" for s in settings for name in CSV_FIGURES]]
    rows = []
    for row in report["pairs"]:
        out = {"id": row["id"], "domain": row["domain"], "length_ratio": row["length_ratio"],
               "chosen_words": row["chosen_words"], "rejected_words": row["rejected_words"],
               "rejected_variant": row["variant"], "verdict": {True: "valid", False: "invalid"}.get(row["verdict"], ""),
               "rating_gap": row["gap"], "flags": " ".join(row["flags"])}
        for s in settings:
            figures = row["settings"].get(s) or {}
            out.update({f"{s}_{name}": figures.get(name) for name in CSV_FIGURES})
        rows.append(out)
    return fields, rows


class HealthRefused(Exception):
    """A re-annotation or version request refused: `field` names what to fix, `status` the HTTP status."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field, self.status = field, status


def health_campaign_create(*, user: AbstractBaseUser, benchmark: Benchmark, guidelines: str,
                           pairs: list[str] | None = None, flag: str | None = None, name: str = "",
                           overlap: int = 3, **options: Any) -> Campaign:
    """Staff open a re-annotation campaign on exactly the selected pairs of `benchmark`: the
    source ids `pairs`, or every pair carrying `flag` (a FLAGS name or "any") when `pairs` is
    empty. The campaign records its origin ({from: "benchmark health", benchmark, flag, pairs,
    selected_by, health_key}); overlap, guidelines and `options` (target_per_annotator,
    lease_minutes, rubric_min_diff, other_max_diff, dimensions, gold) as for any campaign.
    Errors: HealthRefused (403 not staff; 400 naming pairs/flag or a campaign field)."""
    if not user.is_staff:
        raise HealthRefused("Only staff open re-annotation campaigns.", status=403)
    if flag is not None and flag not in FLAG_CHOICES:
        raise HealthRefused(f"flag must be one of: {', '.join(FLAG_CHOICES)}.", field="flag")
    report = benchmark_health(benchmark=benchmark)
    chosen = list(dict.fromkeys(str(p) for p in pairs or []))  # each pair once, in the order first given
    if not chosen and flag:
        chosen = [r["id"] for r in health_pairs(report, flag=flag)]
    if not chosen:
        raise HealthRefused("Select pairs, or a flag that some pairs carry.", field="pairs")
    origin = {"from": "benchmark health", "benchmark": benchmark.name, "flag": flag if not pairs else None,
              "pairs": chosen, "selected_by": user.get_username(), "health_key": report["key"][:16]}
    try:
        return campaign_create(user=user, benchmark=benchmark.name, guidelines=guidelines,
                               name=name or f"{benchmark.name} re-annotation ({len(chosen)} pairs)", overlap=overlap,
                               pairs=chosen, origin=origin, **options)
    except AnnotationError as exc:
        raise HealthRefused(str(exc), field=exc.field, status=exc.status) from None
