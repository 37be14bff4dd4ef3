"""Annotation campaigns: assignment with leases, blind payloads, ratings, validation.

Concurrency: a pair's `taken` (live leases + submitted ratings) only changes through
conditional UPDATEs (`taken < overlap`), so however many annotators ask at once no pair is
ever held or finished by more than `overlap` people. On PostgreSQL candidate pairs are
also picked with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent requests spread over
pairs instead of queueing on the same row.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from pipeline.ml.rows import Number, RowError, parse
from pipeline.models import Benchmark
from pipeline.services import benchmark_freeze, items_record_validation
from prbench.roles import ANNOTATOR, has_role

from .models import Assignment, Campaign, CampaignPair, Rating, default_dimensions

RESPONSE_KEYS = ("1", "2")


class AnnotationError(Exception):
    """A refused annotation action: `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


# --- campaigns ------------------------------------------------------------------------------

def campaign_create(*, user: AbstractBaseUser, benchmark: str, guidelines: str, name: str = "", overlap: int = 3,
                    dimensions: list[dict] | None = None, target_per_annotator: int | None = None,
                    lease_minutes: int = 30, rubric_min_diff: float = 2.0, other_max_diff: float = 1.0,
                    gold: list[dict] | None = None) -> Campaign:
    """Staff create a campaign over every pair of a benchmark (which is then frozen).
    `gold`: [{"id": source id, "chosen": {dimension: 1-5}, "rejected": {...}}]."""
    if not user.is_staff:
        raise AnnotationError("Only staff create campaigns.", status=403)
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
        items = list(bench.items.values_list("pk", "source_id"))
        unknown = set(gold_by_id) - {source_id for _, source_id in items}
        if unknown:
            raise AnnotationError(f"Gold ids not in {bench.name}: {', '.join(sorted(unknown)[:5])}.", field="gold")
        CampaignPair.objects.bulk_create([
            CampaignPair(campaign=campaign, item_id=pk, is_gold=source_id in gold_by_id,
                         gold_expected=gold_by_id.get(source_id)) for pk, source_id in items])
        benchmark_freeze(benchmark=bench)
    return campaign


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


# --- assignment -------------------------------------------------------------------------------

def chosen_first(*, campaign_id: int, annotator_id: int, item_id: int) -> bool:
    """Stable per (campaign, annotator, pair): a reload shows the same order, different
    people see different orders. sha256, not hash(), which changes per process."""
    digest = hashlib.sha256(f"prbench-order:{campaign_id}:{annotator_id}:{item_id}".encode()).digest()
    return digest[0] % 2 == 0


def leases_reclaim(*, campaign: Campaign | None = None) -> int:
    """Expire leases past their time and give their slot back."""
    expired = Assignment.objects.filter(status=Assignment.Status.LEASED, expires_at__lt=timezone.now())
    if campaign is not None:
        expired = expired.filter(pair__campaign=campaign)
    count = 0
    for pk, pair_id in expired.values_list("pk", "pair_id"):
        with transaction.atomic():
            if Assignment.objects.filter(pk=pk, status=Assignment.Status.LEASED).update(status=Assignment.Status.EXPIRED):
                CampaignPair.objects.filter(pk=pair_id, taken__gt=0).update(taken=F("taken") - 1)
                count += 1
    return count


def _require_annotator(user: AbstractBaseUser, campaign: Campaign) -> None:
    if not has_role(user, ANNOTATOR):
        raise AnnotationError("Annotating needs the annotator role.", status=403)
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)


def _take_slot(pair_id: int, overlap: int) -> bool:
    return bool(CampaignPair.objects.filter(pk=pair_id, taken__lt=overlap).update(taken=F("taken") + 1))


def assignment_next(*, user: AbstractBaseUser, campaign: Campaign) -> Assignment | None:
    """The pair this annotator should rate now, or None when no work is left for them.

    A live lease is returned again (a reload shows the same pair); an expired lease of
    theirs is renewed if the pair still has room (their draft is keyed by its token);
    otherwise the open pair closest to completion they have not seen is leased."""
    _require_annotator(user, campaign)
    leases_reclaim(campaign=campaign)
    now = timezone.now()
    lease_until = now + timedelta(minutes=campaign.lease_minutes)
    mine = Assignment.objects.filter(pair__campaign=campaign, annotator=user)
    live = mine.filter(status=Assignment.Status.LEASED).select_related("pair__item").first()
    if live is not None:
        return live
    if campaign.target_per_annotator and mine.filter(status=Assignment.Status.SUBMITTED).count() \
            >= campaign.target_per_annotator:
        return None
    for expired in mine.filter(status=Assignment.Status.EXPIRED).select_related("pair__item"):
        with transaction.atomic():
            if _take_slot(expired.pair_id, campaign.overlap):
                Assignment.objects.filter(pk=expired.pk).update(status=Assignment.Status.LEASED, expires_at=lease_until)
                expired.refresh_from_db()
                return expired

    candidates = (CampaignPair.objects.filter(campaign=campaign, taken__lt=campaign.overlap)
                  .exclude(assignments__annotator=user).order_by("-completed", "-taken", "item__position"))
    for _ in range(50):  # each round either leases a pair or sees it fill up under us
        with transaction.atomic():
            query = candidates
            if connection.features.has_select_for_update_skip_locked:
                query = query.select_for_update(skip_locked=True, of=("self",))
            pair = query.first()
            if pair is None:
                return None
            if not _take_slot(pair.pk, campaign.overlap):
                continue
            try:
                with transaction.atomic():
                    assignment = Assignment.objects.create(
                        token=secrets.token_urlsafe(16), pair=pair, annotator=user, expires_at=lease_until,
                        chosen_first=chosen_first(campaign_id=campaign.pk, annotator_id=user.pk, item_id=pair.item_id))
            except IntegrityError:
                # The same person asked twice at once (two tabs): keep one lease.
                CampaignPair.objects.filter(pk=pair.pk).update(taken=F("taken") - 1)
                return mine.filter(status=Assignment.Status.LEASED).select_related("pair__item").first()
            return Assignment.objects.select_related("pair__item").get(pk=assignment.pk)
    return None


def _own_assignment(user: AbstractBaseUser, token: str) -> Assignment:
    assignment = (Assignment.objects.select_related("pair__campaign", "pair__item")
                  .filter(token=str(token), annotator=user).first())
    if assignment is None:  # someone else's token looks exactly like a missing one
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    return assignment


def progress_for(*, user: AbstractBaseUser, campaign: Campaign) -> dict[str, int]:
    done = Assignment.objects.filter(pair__campaign=campaign, annotator=user,
                                     status=Assignment.Status.SUBMITTED).count()
    total = campaign.pairs.count()
    return {"done": done, "target": min(campaign.target_per_annotator or total, total)}


def assignment_payload(*, assignment: Assignment, user: AbstractBaseUser) -> dict[str, Any]:
    """Everything the rating screen needs, and nothing that tells which answer is chosen:
    no roles, no item or source ids, no scores; responses only as "1" and "2"."""
    item, campaign = assignment.pair.item, assignment.pair.campaign
    first, second = (item.chosen, item.rejected) if assignment.chosen_first else (item.rejected, item.chosen)
    return {
        "assignment": assignment.token,
        "campaign": {"id": campaign.pk, "name": campaign.name},
        "question": item.question,
        "profile": [{"text": str(post.get("text", ""))} for post in item.profile if isinstance(post, dict)],
        "rubric": [{"aspect": str(a.get("aspect", ""))} for a in item.rubric_aspects if isinstance(a, dict)],
        "responses": [{"key": "1", "text": first}, {"key": "2", "text": second}],
        "dimensions": campaign.dimensions,
        "expires_at": assignment.expires_at.isoformat(),
        "progress": progress_for(user=user, campaign=campaign),
    }


# --- ratings ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitResult:
    rating: Rating
    created: bool


def _check_ratings(ratings: Any, keys: list[str]) -> dict[str, dict[str, int]]:
    if not isinstance(ratings, dict):
        raise AnnotationError("ratings must be an object keyed by response \"1\" and \"2\".", field="ratings")
    clean = {}
    for response in RESPONSE_KEYS:
        given = ratings.get(response)
        if not isinstance(given, dict):
            raise AnnotationError(f"ratings.{response}: rate response {response}.", field=f"ratings.{response}")
        clean[response] = {}
        for key in keys:
            value = given.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
                raise AnnotationError(f"ratings.{response}.{key}: must be a whole number from 1 to 5.",
                                      field=f"ratings.{response}.{key}")
            clean[response][key] = value
        extra = set(given) - set(keys)
        if extra:
            raise AnnotationError(f"ratings.{response}: unknown dimension(s) {', '.join(sorted(extra))}.",
                                  field=f"ratings.{response}")
    extra = set(ratings) - set(RESPONSE_KEYS)
    if extra:
        raise AnnotationError(f"ratings: unknown response key(s) {', '.join(sorted(extra))}.", field="ratings")
    return clean


def rating_submit(*, user: AbstractBaseUser, token: str, ratings: Any, seconds: Any = None, comment: str = "",
                  flag_reason: str = "") -> SubmitResult:
    """Store one annotator's ratings of one pair, by role. Idempotent: a repeated submit
    returns the first rating. A late submit after the lease expired is accepted while the
    pair has room, else refused with 409 (the client keeps the draft)."""
    assignment = _own_assignment(user, token)
    campaign = assignment.pair.campaign
    existing = Rating.objects.filter(assignment=assignment).first()
    if existing is not None:
        return SubmitResult(existing, False)
    if not has_role(user, ANNOTATOR):
        raise AnnotationError("Annotating needs the annotator role.", status=403)
    clean = _check_ratings(ratings, campaign.dimension_keys)
    try:
        seconds = parse(Number(low=0, optional=True), seconds, field="seconds")
    except RowError as exc:
        raise AnnotationError(f"seconds must be a non-negative number: {exc.reason}.", field="seconds") from None
    if assignment.status == Assignment.Status.SKIPPED:
        raise AnnotationError("You skipped this pair.", status=409)
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)
    first, second = clean["1"], clean["2"]
    chosen, rejected = (first, second) if assignment.chosen_first else (second, first)
    try:
        with transaction.atomic():
            locked = Assignment.objects.select_for_update().get(pk=assignment.pk)
            # A lease past its time that no sweep has expired yet still holds its slot; an
            # expired one must win a slot back.
            if locked.status == Assignment.Status.EXPIRED:
                if not _take_slot(locked.pair_id, campaign.overlap):
                    raise AnnotationError("Your time on this pair ran out and enough people have rated it since; "
                                          "your draft is kept.", status=409)
            rating = Rating.objects.create(
                assignment=locked, campaign=campaign, item_id=locked.pair.item_id, annotator=user,
                chosen=chosen, rejected=rejected, comment=comment[:5000], flag_reason=flag_reason[:2000],
                seconds=seconds)
            Assignment.objects.filter(pk=locked.pk).update(status=Assignment.Status.SUBMITTED,
                                                           flagged=bool(flag_reason))
            CampaignPair.objects.filter(pk=locked.pair_id).update(completed=F("completed") + 1)
    except IntegrityError:
        return SubmitResult(Rating.objects.get(assignment=assignment), False)
    return SubmitResult(rating, True)


def assignment_skip(*, user: AbstractBaseUser, token: str, reason: str, flag: bool = False) -> Assignment:
    """Skip (or flag) a pair: it is never offered to this annotator again and its slot is freed."""
    assignment = _own_assignment(user, token)
    if not reason.strip():
        raise AnnotationError("Say why you skip this pair.", field="reason")
    if assignment.status == Assignment.Status.SUBMITTED:
        raise AnnotationError("This pair is already rated.", status=409)
    with transaction.atomic():
        was_leased = Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED).update(
            status=Assignment.Status.SKIPPED, skip_reason=reason[:2000], flagged=flag)
        if was_leased:
            CampaignPair.objects.filter(pk=assignment.pair_id, taken__gt=0).update(taken=F("taken") - 1)
        else:
            Assignment.objects.filter(pk=assignment.pk).update(status=Assignment.Status.SKIPPED,
                                                               skip_reason=reason[:2000], flagged=flag)
    assignment.refresh_from_db()
    return assignment


# --- report and validation -----------------------------------------------------------------------

def rating_rows(*, campaign: Campaign):
    """Ratings in long format: one row per (annotator, pair, role, dimension)."""
    keys = campaign.dimension_keys
    for r in (Rating.objects.filter(campaign=campaign).select_related("item", "annotator").order_by("pk")
              .iterator(chunk_size=2000)):
        for role, values in (("chosen", r.chosen), ("rejected", r.rejected)):
            for key in keys:
                yield {"annotator": r.annotator.get_username(), "pair": r.item.source_id, "domain": r.item.domain,
                       "role": role, "dimension": key, "value": values[key], "seconds": r.seconds,
                       "comment": r.comment, "flag_reason": r.flag_reason, "created_at": r.created_at.isoformat()}


def campaign_report(*, campaign: Campaign) -> dict[str, Any]:
    from . import stats

    rows = list(rating_rows(campaign=campaign))
    gold = {source_id: expected for source_id, expected in
            campaign.pairs.filter(is_gold=True).values_list("item__source_id", "gold_expected")}
    report = stats.build_report(
        rows, dimensions=campaign.dimension_keys, gold=gold or None, rubric_dimension="personal_rubrics"
        if "personal_rubrics" in campaign.dimension_keys else campaign.dimension_keys[-1],
        rubric_min_diff=campaign.rubric_min_diff, other_max_diff=campaign.other_max_diff)
    report["campaign"] = {"id": campaign.pk, "name": campaign.name, "benchmark": campaign.benchmark.name,
                          "overlap": campaign.overlap, "pairs": campaign.pairs.count(), "is_open": campaign.is_open,
                          "ratings": Rating.objects.filter(campaign=campaign).count(),
                          "flagged": Assignment.objects.filter(pair__campaign=campaign, flagged=True).count(),
                          "skipped": Assignment.objects.filter(pair__campaign=campaign,
                                                               status=Assignment.Status.SKIPPED).count()}
    return report


def campaign_record_validation(*, campaign: Campaign) -> dict[str, int]:
    """Write the report's per-pair verdicts onto the benchmark items (used by
    `export_benchmark --validated-only`). Pairs nobody rated get no verdict."""
    report = campaign_report(campaign=campaign)
    verdicts = {p["pair"]: p for p in report["validation"]["pairs"]}
    return items_record_validation(benchmark=campaign.benchmark, source=f"campaign {campaign.pk}",
                                   verdicts={pid: (v["valid"], v["reasons"]) for pid, v in verdicts.items()})
