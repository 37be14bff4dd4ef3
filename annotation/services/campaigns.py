"""Campaigns: creating one over a benchmark (or chosen pairs of it), its bounds and guidelines,
who may rate it (assignees), closing and reopening it."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, Group, User
from django.db import transaction
from django.db.models import Q

from core.roles import ANNOTATOR
from pipeline.models import Benchmark
from pipeline.services import benchmark_freeze
from prblib.rows import MAX_INT

from ..models import Assignment, Campaign, CampaignPair, default_dimensions
from ..ordering import stratify
from .errors import AnnotationError
from .leases import expire


# The bounds of a campaign's numbers: one definition for the staff page's form and the API's
# serializer (campaign_bounds), within the columns (target_per_annotator: a 32-bit integer).
CAMPAIGN_BOUNDS = {"overlap": (1, 20), "target_per_annotator": (1, MAX_INT), "lease_minutes": (1, 24 * 60),
                   "rubric_min_diff": (0, 4), "other_max_diff": (0, 4)}


def campaign_bounds(name: str) -> dict[str, int]:
    """{"min_value", "max_value"} of a campaign field, for a form or serializer field."""
    low, high = CAMPAIGN_BOUNDS[name]
    return {"min_value": low, "max_value": high}


def campaign_create(*, user: AbstractBaseUser, benchmark: str, guidelines: str, name: str = "", overlap: int = 3,
                    dimensions: list[dict] | None = None, target_per_annotator: int | None = None,
                    lease_minutes: int = 30, rubric_min_diff: float = 2.0, other_max_diff: float = 1.0,
                    gold: list[dict] | None = None, annotators: list | None = None,
                    groups: list | None = None, pairs: list[str] | None = None,
                    origin: dict | None = None) -> Campaign:
    """Staff create a campaign over every pair of a benchmark (which is then frozen), or over
    exactly the pairs whose source ids `pairs` lists (e.g. the flagged pairs of its health page),
    with `origin` recorded on the campaign: where its pairs came from (`Campaign.origin`).
    `gold`: [{"id": source id, "chosen": {dimension: 1-5}, "rejected": {...}}].
    `annotators` (users or usernames, each in the annotator role) and `groups` (groups or
    group names): who may see and rate it; both empty or None: every annotator.
    Errors: AnnotationError 400 naming the field, 403 (not staff)."""
    if not user.is_staff:
        raise AnnotationError("Only staff create campaigns.", status=403)
    people, teams = _resolve_assignees(annotators or [], groups or [])
    bench = Benchmark.objects.filter(name=benchmark).first()
    if bench is None:
        raise AnnotationError(f"No benchmark named '{benchmark}'.", field="benchmark")
    if not 1 <= int(overlap) <= 20:
        raise AnnotationError("overlap must be between 1 and 20.", field="overlap")
    if not guidelines.strip():
        raise AnnotationError("Write guidelines for the annotators.", field="guidelines")
    dimensions = dimensions or default_dimensions()
    _check_dimensions(dimensions)
    keys = [d["key"] for d in dimensions]
    gold_by_id = _check_gold(gold or [], keys)
    with transaction.atomic():
        campaign = Campaign.objects.create(
            name=name.strip() or f"{bench.name} validation", benchmark=bench, guidelines=guidelines,
            overlap=overlap, dimensions=dimensions, target_per_annotator=target_per_annotator,
            lease_minutes=lease_minutes, rubric_min_diff=rubric_min_diff, other_max_diff=other_max_diff,
            created_by=user)
        items = list(bench.items.values_list("pk", "source_id", "domain"))
        if pairs is not None:
            items = _only_pairs(items, pairs, bench.name)
            Campaign.objects.filter(pk=campaign.pk).update(origin=origin or {})
            campaign.origin = origin or {}
        unknown = set(gold_by_id) - {source_id for _, source_id, _ in items}
        if unknown:
            raise AnnotationError(f"Gold ids not in {bench.name}: {', '.join(sorted(unknown)[:5])}.", field="gold")
        strata, places = stratify([(pk, domain) for pk, _, domain in items], campaign_id=campaign.pk)
        Campaign.objects.filter(pk=campaign.pk).update(strata=strata)
        campaign.strata = strata
        CampaignPair.objects.bulk_create([
            CampaignPair(campaign=campaign, item_id=pk, is_gold=source_id in gold_by_id,
                         gold_expected=gold_by_id.get(source_id), domain_index=places[pk][0],
                         stratum_round=places[pk][1]) for pk, source_id, _ in items], batch_size=1000)
        if people:
            campaign.assignees.set(people)
        if teams:
            campaign.assignee_groups.set(teams)
        benchmark_freeze(benchmark=bench)
    return campaign


def _resolve_assignees(annotators: list, groups: list) -> tuple[list, list]:
    """(users, groups) from users or usernames and groups or group names. Every user must hold
    the annotator role (or be staff). Errors: AnnotationError 400 naming "annotators" or "groups"."""
    names = [a.get_username() if hasattr(a, "get_username") else str(a) for a in annotators]
    users = {u.get_username(): u for u in User.objects.filter(username__in=names).prefetch_related("groups")}
    missing = [n for n in names if n not in users]
    if missing:
        raise AnnotationError(f"annotators: no user named {', '.join(repr(n) for n in missing[:5])}.",
                              field="annotators")
    not_annotators = [n for n in names if not (users[n].is_staff or any(g.name == ANNOTATOR
                                                                          for g in users[n].groups.all()))]
    if not_annotators:
        raise AnnotationError(f"annotators: {', '.join(repr(n) for n in not_annotators[:5])} "
                              f"{'does' if len(not_annotators) == 1 else 'do'} not have the annotator role.",
                              field="annotators")
    group_names = [g.name if hasattr(g, "name") else str(g) for g in groups]
    found = {g.name: g for g in Group.objects.filter(name__in=group_names)}
    missing = [n for n in group_names if n not in found]
    if missing:
        raise AnnotationError(f"groups: no group named {', '.join(repr(n) for n in missing[:5])}.", field="groups")
    return [users[n] for n in dict.fromkeys(names)], [found[n] for n in dict.fromkeys(group_names)]


def campaign_set_assignees(*, campaign: Campaign, annotators: list, groups: list) -> dict[str, int]:
    """Name who may rate the campaign (both empty: every annotator). Live leases of people no
    longer named end (their slots are freed); their ratings stay. Returns
    {"annotators", "groups", "leases_ended"}. Errors: AnnotationError 400 naming the field."""
    people, teams = _resolve_assignees(annotators, groups)
    with transaction.atomic():
        campaign.assignees.set(people)
        campaign.assignee_groups.set(teams)
    ended = 0
    if people or teams:
        allowed = Q(annotator__in=[u.pk for u in people]) | Q(annotator__groups__in=[g.pk for g in teams]) \
            | Q(annotator__is_staff=True)
        gone = Assignment.objects.filter(campaign=campaign, status=Assignment.Status.LEASED).exclude(
            pk__in=Assignment.objects.filter(allowed, campaign=campaign).values("pk"))
        ended = expire(gone)
    return {"annotators": len(people), "groups": len(teams), "leases_ended": ended}


# The guidelines a new campaign's form starts from (staff edit them; Markdown).
GUIDELINES_TEMPLATE = """\
# How to rate

You see a question someone asked, what matters to them (their **personal rubric**) and a few of
their past posts, then two answers. Rate **each answer on its own**, on every scale, from 1 to 5.

- **Factuality**: is it accurate? Check claims you can check; do not reward confidence.
- **Relevance**: does it address the question that was asked?
- **Helpfulness**: would it help someone asking this?
- **Personal Rubrics**: does it meet the rubric aspects of *this* person? Read the rubric first.

The two answers are shown in an order that tells you nothing about them. Skip a pair (with a
reason) when you cannot judge it, and flag it when something is broken (an answer cut off, an
unreadable question).

Keys: `1`-`5` rate the highlighted scale, `Enter` submits, `S` skips, `?` shows these guidelines,
`Esc` leaves a text box.
"""


def _only_pairs(items: list[tuple[int, str, str]], pairs: list[str], benchmark: str) -> list[tuple[int, str, str]]:
    """The (pk, source id, domain) rows of `items` whose source ids `pairs` names. Errors:
    AnnotationError 400 on "pairs" when it is empty or names ids the benchmark lacks."""
    wanted = {str(p) for p in pairs}
    if not wanted:
        raise AnnotationError("Select at least one pair.", field="pairs")
    kept = [row for row in items if row[1] in wanted]
    unknown = wanted - {row[1] for row in kept}
    if unknown:
        raise AnnotationError(f"Pairs not in {benchmark}: {', '.join(sorted(unknown)[:5])}.", field="pairs")
    return kept


def _check_dimensions(dimensions: list[dict]) -> None:
    if not isinstance(dimensions, list) or not dimensions:
        raise AnnotationError("dimensions must be a non-empty list.", field="dimensions")
    seen = set()
    for i, dim in enumerate(dimensions):
        if not isinstance(dim, dict) or not str(dim.get("key", "")).isidentifier():
            raise AnnotationError(f"dimensions[{i}] needs a key (letters, digits, _).", field="dimensions")
        if dim["key"] in seen:
            raise AnnotationError(f"dimensions[{i}]: duplicate key {dim['key']!r}.", field="dimensions")
        seen.add(dim["key"])
        anchors = dim.get("anchors", {})
        if set(anchors) != {"1", "2", "3", "4", "5"}:
            raise AnnotationError(f"dimensions[{i}] needs labelled anchors for 1..5.", field="dimensions")


def _check_gold(gold: list[dict], keys: list[str]) -> dict[str, dict]:
    out = {}
    for i, entry in enumerate(gold):
        try:
            source_id = str(entry["id"])
            expected = {role: {k: int(entry[role][k]) for k in keys} for role in ("chosen", "rejected")}
        except (KeyError, TypeError, ValueError):
            raise AnnotationError(f"gold[{i}] needs id and chosen/rejected ratings for {', '.join(keys)}.",
                                  field="gold") from None
        if any(not 1 <= v <= 5 for role in expected.values() for v in role.values()):
            raise AnnotationError(f"gold[{i}]: ratings must be 1-5.", field="gold")
        out[source_id] = expected
    return out


def campaign_set_open(*, campaign: Campaign, is_open: bool) -> bool:
    """Close or reopen a campaign; returns whether its state changed. Idempotent: closing a
    closed campaign (or reopening an open one) changes nothing, so concurrent presses agree.
    Closing ends every live lease (their slots are freed). `campaign.is_open` is set in place."""
    changed = bool(Campaign.objects.filter(pk=campaign.pk, is_open=not is_open).update(is_open=is_open))
    if not is_open:
        expire(Assignment.objects.filter(campaign=campaign, status=Assignment.Status.LEASED))
    campaign.is_open = is_open
    return changed


def campaign_update_guidelines(*, campaign: Campaign, guidelines: str) -> Campaign:
    """Replace the campaign's guidelines (annotators see them on their next pair). Errors:
    AnnotationError 400 on "guidelines" when they are blank."""
    if not guidelines.strip():
        raise AnnotationError("Write guidelines for the annotators.", field="guidelines")
    Campaign.objects.filter(pk=campaign.pk).update(guidelines=guidelines)
    campaign.guidelines = guidelines
    return campaign
