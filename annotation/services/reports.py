"""The campaign report and what it records: the statistics of the ratings
(prblib.stats.agreement), cached per campaign in CampaignReportCache, the report as text lines
(the management command), and the per-pair verdicts written onto the benchmark."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Q

from pipeline.services import items_record_validation

from ..models import Assignment, Campaign, CampaignReportCache, Rating
from ..selectors import gold_pairs as campaign_gold_pairs, rating_rows, rubric_dimension, validation_sentences
from .errors import AnnotationError


def campaign_statistics(*, campaign: Campaign, gold_pairs: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """The statistics of the campaign's ratings, computed in full from every rating:
    agreement.build_report plus agreement.position_bias under "position_bias". See campaign_report
    for the cached form. `gold_pairs`: `selectors.gold_pairs(campaign)` when the caller has it."""
    from prblib.stats import agreement

    rows = list(rating_rows(campaign=campaign))
    gold = dict(campaign_gold_pairs(campaign) if gold_pairs is None else gold_pairs)
    report = agreement.build_report(
        rows, dimensions=campaign.dimension_keys, gold=gold or None, rubric_dimension=rubric_dimension(campaign),
        rubric_min_diff=campaign.rubric_min_diff, other_max_diff=campaign.other_max_diff)
    report["position_bias"] = agreement.position_bias(rows, campaign.dimension_keys)
    report["method"]["position_bias"] = agreement.POSITION_BIAS_METHOD
    return report


def _statistics_key(campaign: Campaign, ratings: dict[str, Any], gold_pairs: list, annotators: list) -> str:
    """Everything the statistics depend on:
    - the ratings: how many, the newest id, how many revisions and the newest revision's id.
      Counts, not the newest time: two revisions can commit in the other order than their
      timestamps, and a deleted rating lowers the count;
    - the gold pairs and their expected ratings (editable in the admin);
    - the raters' usernames (the per-annotator table names them; a user can be renamed);
    - the campaign's dimensions and thresholds, and the statistics code's version."""
    basis = [ratings["n"], ratings["last"], ratings["n_revisions"], ratings["last_revision"], gold_pairs, annotators,
             campaign.dimension_keys, campaign.rubric_min_diff, campaign.other_max_diff, STATISTICS_VERSION]
    return hashlib.sha256(json.dumps(basis, default=str).encode()).hexdigest()


STATISTICS_VERSION = 3  # bump when the statistics' code changes what they return (3: cached as JSON text)


def campaign_report(*, campaign: Campaign) -> dict[str, Any]:
    """The campaign's report: `campaign_statistics` (cached in the campaign's
    CampaignReportCache row, recomputed when anything `_statistics_key` names changes; the
    cached numbers, and the order of every mapping in them, are those of a full
    recomputation) plus live counts under "campaign":
    {id, name, benchmark, overlap, pairs, is_open, ratings, rated_pairs, flagged, skipped}."""
    ratings = Rating.objects.filter(campaign=campaign).aggregate(
        n=Count("pk", distinct=True), last=Max("pk"), n_revisions=Count("revisions"), last_revision=Max("revisions__pk"))
    gold_pairs = campaign_gold_pairs(campaign)
    annotators = list(Rating.objects.filter(campaign=campaign).order_by("annotator_id")
                      .values_list("annotator_id", "annotator__username").distinct())
    key = _statistics_key(campaign, ratings, gold_pairs, annotators)
    cached = (CampaignReportCache.objects.filter(campaign=campaign, key=key)
              .values_list("statistics", flat=True).first())
    if cached is not None:
        report = json.loads(cached)
    else:
        report = campaign_statistics(campaign=campaign, gold_pairs=gold_pairs)
        with transaction.atomic():
            # The campaign's row stays locked until the cache row is written, so a campaign
            # deleted meanwhile (e.g. in the admin) is cached nothing rather than failing the page.
            # FOR NO KEY UPDATE (PostgreSQL) blocks a DELETE but not the rating and lease inserts,
            # whose foreign-key checks take FOR KEY SHARE on the same row.
            no_key = connection.features.has_select_for_no_key_update
            if Campaign.objects.select_for_update(no_key=no_key).filter(pk=campaign.pk).exists():
                CampaignReportCache.objects.update_or_create(
                    campaign=campaign, defaults={"key": key, "statistics": json.dumps(report)})
    counts = Assignment.objects.filter(campaign=campaign).aggregate(
        flagged=Count("pk", filter=Q(flagged=True)), skipped=Count("pk", filter=Q(status=Assignment.Status.SKIPPED)))
    report["campaign"] = {"id": campaign.pk, "name": campaign.name, "benchmark": campaign.benchmark.name,
                          "overlap": campaign.overlap, "pairs": campaign.pairs.count(), "is_open": campaign.is_open,
                          "ratings": ratings["n"], "rated_pairs": report["n_pairs"], **counts}
    return report


def report_text_lines(*, report: dict[str, Any]) -> list[str]:
    """The report as plain text lines (the management command's default output)."""
    c = report["campaign"]
    lines = [f"{c['name']} ({c['benchmark']}): {c['ratings']} ratings of {report['n_pairs']} distinct pairs "
             f"(of {c['pairs']}) by {report['n_annotators']} annotators; {c['skipped']} skipped, {c['flagged']} flagged"]
    for dim, summary in report["dimensions"].items():
        o = summary["overall"]
        alpha = report["agreement"].get(dim, {}).get("alpha")
        lines.append(f"  {dim:<17} chosen {_fmt(o['chosen_mean'])}  rejected {_fmt(o['rejected_mean'])}  "
                     f"diff {_fmt(o['mean_diff'])}  Wilcoxon p={_fmt(o['wilcoxon']['p_value'], 4)}  "
                     f"alpha={_fmt(alpha)}  (n={o['n_pairs']} pairs)")
    v = report["validation"]
    lines.append(f"  valid pairs: {v['valid']}, invalid: {v['invalid']}")
    for name, bias in report.get("position_bias", {}).get("by_annotator", {}).items():
        lines.append(f"  position bias {name}: {_fmt(bias['overall']['bias'])} points toward Response 1 "
                     f"({bias['overall']['n_chosen_first']} pairs chosen shown first, "
                     f"{bias['overall']['n_chosen_second']} second)")
    if "recorded" in report:
        lines.append(f"  recorded on the benchmark: {report['recorded']['valid']} valid, "
                     f"{report['recorded']['invalid']} invalid")
    return lines


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class WeakerVerdicts(AnnotationError):
    """Recording would replace verdicts of another campaign resting on more ratings per pair (or
    on an unknown number): `pairs` counts them, `stronger` {source: its ratings per pair, None
    when not recorded}. Nothing is written until the caller confirms (confirm=True)."""

    def __init__(self, message: str, *, pairs: int, stronger: dict[str, int | None]):
        super().__init__(message, status=409)
        self.pairs, self.stronger = pairs, stronger


def campaign_record_validation(*, campaign: Campaign, confirm: bool = False) -> dict[str, int]:
    """Write the report's per-pair verdicts, with their reasons as sentences, onto the
    benchmark items (shown in the benchmark browser, used by `export_benchmark
    --validated-only`). Pairs nobody rated get no verdict. Each verdict keeps its campaign (id)
    and its strength (n_annotators: the annotators who rated that pair); another campaign's
    verdict it replaces stays on the item under "earlier". Replacing verdicts that rest on more
    ratings per pair than this campaign's (or whose number was not recorded) raises
    WeakerVerdicts, writing nothing, unless confirm=True."""
    report = campaign_report(campaign=campaign)
    pairs = report["validation"]["pairs"]
    source = f"campaign {campaign.pk} ({campaign.name})"
    current = dict(campaign.benchmark.items.filter(source_id__in=[p["pair"] for p in pairs])
                   .exclude(validation__isnull=True).values_list("source_id", "validation"))
    stronger: dict[str, int | None] = {}
    weaker_pairs = 0
    for p in pairs:
        old = current.get(p["pair"]) or {}
        if not old.get("source") or old.get("source") == source or old.get("campaign") == campaign.pk:
            continue
        strength = old.get("n_annotators")
        if strength is None or int(strength) > int(p["n_annotators"]):
            weaker_pairs += 1
            stronger[old["source"]] = strength
    if weaker_pairs and not confirm:
        named = ", ".join(f"{name} ({'an unrecorded number of' if n is None else n} rating{'' if n == 1 else 's'} "
                          "per pair)" for name, n in sorted(stronger.items()))
        fewest = min(p["n_annotators"] for p in pairs)
        raise WeakerVerdicts(f"{weaker_pairs} pair(s) hold verdicts from {named}; this campaign's rest on as few as "
                             f"{fewest} rating(s) per pair. Confirm to record them anyway (the earlier verdicts stay "
                             "on each pair under 'earlier').", pairs=weaker_pairs, stronger=stronger)
    verdicts = {p["pair"]: (p["valid"], validation_sentences(pair=p, campaign=campaign)) for p in pairs}
    details = {p["pair"]: {"campaign": campaign.pk, "n_annotators": int(p["n_annotators"])} for p in pairs}
    return items_record_validation(benchmark=campaign.benchmark, source=source, verdicts=verdicts, details=details)
