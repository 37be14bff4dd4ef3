"""Who holds which pair: the next pair for an annotator (leased), the order pairs come in,
lease expiry and reclaim, the blind payload of the rating screen, skips and their undo.

A lease is an Assignment in status LEASED; it holds one of the pair's `overlap` slots
(`CampaignPair.taken`), taken and freed only by conditional UPDATEs (`take_slot`, `free_slot`,
`expire`). Blindness (pipeline/blindness.py): someone shown a pair's answer key is never leased it,
and a lease they held from before is released (`refuse_if_read`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, User
from django.db import IntegrityError, connection, transaction
from django.db.models import (BigIntegerField, BooleanField, Count, Exists, Expression, ExpressionWrapper, F,
                              FilteredRelation, IntegerField, Max, Q, Subquery)
from django.utils import timezone
from django.utils.crypto import salted_hmac

from core.roles import ANNOTATOR
from pipeline.blindness import (pair_keys_read, pair_read_exists, pair_read_refusal, per_pair_read_exists,
                                per_pair_read_refusal)
from pipeline.models import BenchmarkItem

from ..models import Assignment, Campaign, CampaignPair
from ..ordering import PRIME, AnnotatorOrder, annotator_order
from ..selectors import campaign_open_to, defer_unread, open_to, progress_of
from .errors import NOT_ASSIGNED, AnnotationError


def chosen_first(*, campaign_id: int, annotator_id: int, item_id: int) -> bool:
    """Whether Response 1 is the chosen answer for this (campaign, annotator, pair): stable (a
    reload shows the same order; it is stored on the assignment when leased) and different
    between people. An HMAC-SHA256 under the server's SECRET_KEY (Django's salted_hmac), so
    knowing the ids and the order of some pairs tells nothing about any other pair's order,
    this annotator's or anyone else's; a bare hash of the ids could be recomputed by anyone."""
    digest = salted_hmac("prbench.annotation.display-order", f"{campaign_id}:{annotator_id}:{item_id}",
                         algorithm="sha256").digest()
    return digest[0] % 2 == 0


def leases_reclaim(*, campaign: Campaign | None = None) -> int:
    """Expire leases past their time and give their slot back."""
    expired = Assignment.objects.filter(status=Assignment.Status.LEASED, expires_at__lt=timezone.now())
    if campaign is not None:
        expired = expired.filter(campaign=campaign)
    return expire(expired)


def expire(leases) -> int:
    """Move these leases to EXPIRED, each by a conditional UPDATE that frees its slot only if
    it was still leased (a concurrent submit or sweep wins cleanly). Returns how many."""
    count = 0
    for pk, pair_id in leases.values_list("pk", "pair_id"):
        with transaction.atomic():
            if Assignment.objects.filter(pk=pk, status=Assignment.Status.LEASED).update(status=Assignment.Status.EXPIRED):
                free_slot(pair_id)
                count += 1
    return count


def _require_annotator(user: AbstractBaseUser, campaign: Campaign) -> None:
    if not (user.is_staff or campaign.annotator_role):
        raise AnnotationError("Annotating needs the annotator role.", status=403)
    if not (user.is_staff or getattr(campaign, "open_to_me", True)):
        raise AnnotationError(NOT_ASSIGNED, status=403)
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)


def _read_refusal(user: AbstractBaseUser, benchmark_id: int, item_id: int) -> str | None:
    """Why `user` may no longer rate, revise or hold a pair (item `item_id`) of a campaign on
    benchmark `benchmark_id` blind: they were shown per-pair data of that benchmark or of one
    holding its pairs (per_pair_read_refusal), or this pair on a one-pair page
    (pair_read_refusal), after it was leased to them. None when they were shown neither. The
    same rules `assignment_next` applies to new pairs, for what was leased before the read."""
    whole = per_pair_read_refusal(user, benchmark_id)
    if whole:
        return whole
    key = BenchmarkItem.objects.filter(pk=item_id).values_list("pair_key", flat=True).first()
    return pair_read_refusal(user, key or "")


def refuse_if_read(user: AbstractBaseUser, assignment: Assignment) -> None:
    """AnnotationError 403 with `_read_refusal`'s reason when `user` was shown the answer key of
    `assignment`'s pair; a live lease on it is released first (its slot freed)."""
    reason = _read_refusal(user, assignment.campaign.benchmark_id, assignment.pair.item_id)
    if reason:
        expire(Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED))
        raise AnnotationError(reason, status=403)


def require_still_assigned(user: AbstractBaseUser, campaign: Campaign) -> None:
    """AnnotationError 403 when `campaign` no longer names `user` (or a group of theirs)."""
    if not campaign_open_to(user=user, campaign=campaign):
        raise AnnotationError(NOT_ASSIGNED, status=403)


def annotator_role(user: AbstractBaseUser) -> Exists:
    """Whether `user` is in the annotator group, as an annotation, so the role check rides on
    a query the request makes anyway."""
    return Exists(User.groups.through.objects.filter(user_id=user.pk, group__name=ANNOTATOR))


def take_slot(pair_id: int, overlap: int) -> bool:
    """Take one of the pair's slots if it has one left (a conditional UPDATE); whether it did."""
    return bool(CampaignPair.objects.filter(pk=pair_id, taken__lt=overlap).update(taken=F("taken") + 1))


def free_slot(pair_id: int) -> None:
    """Give one of the pair's slots back (never below zero)."""
    CampaignPair.objects.filter(pk=pair_id, taken__gt=0).update(taken=F("taken") - 1)


def count_of(queryset) -> Subquery:
    """How many rows `queryset` (correlated on its campaign) holds, as a subquery annotation."""
    return Subquery(queryset.order_by().values("campaign").annotate(n=Count("pk")).values("n")[:1],
                    output_field=IntegerField())


def _campaign_with_state(*, user: AbstractBaseUser, campaign_id: Any) -> Campaign:
    """The campaign plus this annotator's state in it, in one query: `done` (submitted),
    `live_id` (their live lease, if any: at most one exists), `n_expired` (their expired
    leases) and `annotator_role`. Their assignments are joined (the join's condition keeps
    only theirs) and counted by status; one join compiles in about half the CPU time of a
    correlated subquery per figure."""
    try:
        campaign_id = int(campaign_id)
    except (TypeError, ValueError):
        raise AnnotationError("campaign must be a campaign id (a whole number).", field="campaign") from None
    status = Assignment.Status
    campaign = (defer_unread(Campaign.objects.filter(pk=campaign_id), campaign="")
                .annotate(read_its_pairs=per_pair_read_exists(user))  # blindness: shown its answer key
                .annotate(mine=FilteredRelation("assignments", condition=Q(assignments__annotator=user)))
                .annotate(done=Count("mine", filter=Q(mine__status=status.SUBMITTED)),
                          n_expired=Count("mine", filter=Q(mine__status=status.EXPIRED)),
                          live_id=Max("mine__pk", filter=Q(mine__status=status.LEASED)),
                          annotator_role=annotator_role(user),
                          open_to_me=ExpressionWrapper(open_to(user), output_field=BooleanField())).first())
    if campaign is None:
        raise AnnotationError("No such campaign.", status=404, field="campaign")
    return campaign


@dataclass(frozen=True)
class Lease:
    """What `assignment_next` hands out: the assignment (pair and item loaded) and the
    annotator's progress {done, target} in the campaign."""

    assignment: Assignment
    progress: dict[str, int]


class _AnnotatorPlace(Expression):
    """One annotator's place for a pair (annotation/ordering.py): the key
    (a * ((stratum_round + s_d) mod n_d) + b) mod P of the pair's domain d, times D, plus the
    rotated domain (d + c) mod D. Ordering by it is ordering by (key, rotated domain), as
    `AnnotatorOrder.key` does in Python, since the rotated domain is below D.

    One SQL expression over the two columns, every constant a bound parameter. Written out
    rather than built from Case/When/Mod/Cast nodes: Django resolves and compiles such a tree on
    every call, ~1.3 of the ~8 CPU ms of a `next` (benchmarks/README.md). `%` is integer
    modulo on PostgreSQL and SQLite alike; every operand is >= 0 and the largest intermediate
    value, below P * P (about 1e12), fits a BIGINT."""

    output_field = BigIntegerField()

    def __init__(self, order: AnnotatorOrder, strata: list[int]) -> None:
        super().__init__()
        self.order, self.strata = order, strata
        self.domain, self.round = F("domain_index"), F("stratum_round")

    def get_source_expressions(self) -> list:
        return [self.domain, self.round]

    def set_source_expressions(self, exprs: list) -> None:
        self.domain, self.round = exprs

    def as_sql(self, compiler, connection) -> tuple[str, list]:
        domain, domain_params = compiler.compile(self.domain)
        rnd, round_params = compiler.compile(self.round)
        whens, params = [], [*domain_params]
        for d, (shift, n) in enumerate(zip(self.order.shifts, self.strata)):
            whens.append(f"WHEN %s THEN ({rnd} + %s) %% %s")
            params += [d, *round_params, shift, max(n, 1)]
        rotated = f"CASE {domain} {' '.join(whens)} ELSE {rnd} END"
        params += [*round_params, self.order.a, self.order.b, PRIME, len(self.strata),
                   *domain_params, self.order.domain_shift, len(self.strata)]
        return f"((CAST({rotated} AS BIGINT) * %s + %s) %% %s * %s + ({domain} + %s) %% %s)", params


def _order_for(campaign: Campaign, annotator_id: int) -> list:
    """ORDER BY terms: pairs closest to completion (most slots taken) first, then this
    annotator's random, reproducible, domain-stratified order (annotation/ordering.py)."""
    strata = list(campaign.strata)
    terms = [F("taken").desc()]
    if strata:
        terms.append(_AnnotatorPlace(annotator_order(campaign_id=campaign.pk, annotator_id=annotator_id,
                                                     strata=strata), strata))
    return terms + ["pk"]


def _refused_by_constraint(write) -> bool:
    """Run one write; True when a database constraint refused it. Inside an enclosing
    transaction a savepoint keeps that transaction usable; outside one the statement is its
    own transaction and needs none."""
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                write()
        else:
            write()
    except IntegrityError:
        return True
    return False


def assignment_next(*, user: AbstractBaseUser, campaign_id: Any) -> Lease | None:
    """The pair this annotator should rate now, or None when no work is left for them.

    A live lease is returned again (a reload shows the same pair); an expired lease of
    theirs is renewed if the pair still has room (their draft is keyed by its token);
    otherwise the open pair closest to completion they have not seen is leased, ties
    broken by their own order (random but reproducible per campaign and annotator,
    stratified across domains: annotation/ordering.py). Expired leases of others are
    reclaimed when nothing else is left.

    Claiming: a conditional UPDATE takes a slot (`taken < overlap`, so no pair is ever held
    by more than `overlap` people), then the lease row is inserted. The database allows one
    live lease per annotator and campaign (a partial unique index); when a concurrent
    request of the same annotator inserted first, the slot is given back and that lease is
    returned. The two statements are not wrapped in a transaction (it would add BEGIN and
    COMMIT to every request): a process killed between them leaves a slot taken by nobody,
    i.e. a pair one rating short of its overlap, never over it.

    Statements: 2 to show a live lease again; 4 to lease a new pair (campaign with state
    and role, candidate with its item, slot, insert); token auth adds one per request.

    Blindness (pipeline/blindness.py): someone shown per-pair data of the campaign's benchmark
    is refused (403, per_pair_read_refusal) and their live lease released; a pair they were
    shown on a one-pair page is never leased, renewed or returned to them (a live lease on it
    is released), whenever the read happened.
    Errors: AnnotationError 400 (campaign not a number), 404 (no campaign), 403 (no annotator
    role, not assigned, shown the answer key), 409 (closed).
    """
    campaign = _campaign_with_state(user=user, campaign_id=campaign_id)
    _require_annotator(user, campaign)
    if campaign.read_its_pairs:  # they were served per-pair data of these pairs (pipeline/blindness.py)
        # A lease held from before the read is released: it is refused as a new one would be.
        expire(Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.LEASED))
        raise AnnotationError(per_pair_read_refusal(user, campaign.benchmark_id), status=403)
    lease_until = timezone.now() + timedelta(minutes=campaign.lease_minutes)
    mine = _shown_assignments(user, campaign)
    if campaign.live_id is not None:
        lease = _live_lease(user, campaign)
        if lease is not None:
            return lease
    if campaign.target_per_annotator and campaign.done >= campaign.target_per_annotator:
        return None
    if campaign.n_expired:
        # Never a pair they were shown on a one-pair page since (as for new pairs, below).
        for expired in mine.filter(status=Assignment.Status.EXPIRED).exclude(
                pair__item__pair_key__in=pair_keys_read(user)):
            if not take_slot(expired.pair_id, campaign.overlap):
                continue
            renewed = Assignment.objects.filter(pk=expired.pk, status=Assignment.Status.EXPIRED)
            changed = []
            if _refused_by_constraint(lambda: changed.append(
                    renewed.update(status=Assignment.Status.LEASED, expires_at=lease_until))):
                free_slot(expired.pair_id)  # a concurrent request of theirs leased first
                return _live_lease(user, campaign)
            if not changed[0]:
                # No longer expired: renewed by a concurrent request of theirs, submitted late
                # or skipped since it was read. Either way it holds its own slot, or needs none.
                free_slot(expired.pair_id)
                lease = _live_lease(user, campaign)
                if lease is not None:
                    return lease
                continue
            expired.status, expired.expires_at, expired.campaign = Assignment.Status.LEASED, lease_until, campaign
            return Lease(expired, progress_of(campaign, campaign.done))

    best = (CampaignPair.objects.filter(campaign=campaign, taken__lt=campaign.overlap)
            .exclude(pk__in=Assignment.objects.filter(campaign=campaign, annotator=user).values("pair_id"))
            .exclude(item__pair_key__in=pair_keys_read(user))  # single pairs they were shown (an item page)
            .order_by(*_order_for(campaign, user.pk)).values("pk")[:1])
    # Sort the narrow pair rows, then join the one item (sorting joined items spills to disk).
    candidate = defer_unread(CampaignPair.objects.filter(pk=Subquery(best)).select_related("item"),
                             pair="", item="item")
    swept = False
    for _ in range(50):  # each round either leases a pair or sees it fill up under us
        pair = candidate.first()
        if pair is None:
            if swept or not leases_reclaim(campaign=campaign):
                return None
            swept = True
            continue
        if not take_slot(pair.pk, campaign.overlap):
            continue
        assignment = Assignment(token=secrets.token_urlsafe(16), campaign=campaign, pair=pair, annotator=user,
                                expires_at=lease_until,
                                chosen_first=chosen_first(campaign_id=campaign.pk, annotator_id=user.pk,
                                                          item_id=pair.item_id))
        if _refused_by_constraint(lambda: assignment.save(force_insert=True)):
            free_slot(pair.pk)  # the same person asked twice at once (two tabs)
            lease = _live_lease(user, campaign)
            if lease is not None:
                return lease
            continue
        return Lease(assignment, progress_of(campaign, campaign.done))
    return None


def _shown_assignments(user: AbstractBaseUser, campaign: Campaign):
    """This annotator's assignments in the campaign, each with the pair and item the rating
    screen shows (without the UNREAD columns)."""
    mine = Assignment.objects.filter(campaign=campaign, annotator=user).select_related("pair__item")
    return defer_unread(mine, pair="pair", item="pair__item")


def _live_lease(user: AbstractBaseUser, campaign: Campaign) -> Lease | None:
    """Their live lease in the campaign, or None. A lease on a pair they were shown on a
    one-pair page since it was leased is released (its slot freed) and None returned."""
    live = (_shown_assignments(user, campaign).filter(status=Assignment.Status.LEASED)
            .annotate(pair_read=pair_read_exists(user)).first())
    if live is None:
        return None
    if live.pair_read:
        expire(Assignment.objects.filter(pk=live.pk, status=Assignment.Status.LEASED))
        return None
    live.campaign = campaign
    return Lease(live, progress_of(campaign, campaign.done))


def own_assignment(user: AbstractBaseUser, token: str, campaign_id: int | None = None) -> Assignment:
    """The user's assignment with this token (in campaign `campaign_id` when given), or
    AnnotationError 404."""
    mine = Assignment.objects.select_related("campaign", "pair__item").filter(token=str(token), annotator=user)
    if campaign_id is not None:
        mine = mine.filter(campaign_id=campaign_id)
    assignment = defer_unread(mine, campaign="campaign", pair="pair", item="pair__item").first()
    if assignment is None:  # someone else's token looks exactly like a missing one
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    return assignment


def assignment_payload(*, lease: Lease) -> dict[str, Any]:
    """Everything the rating screen needs, and nothing that tells which answer is chosen:
    no roles, no item or source ids, no scores; responses only as "1" and "2"."""
    assignment = lease.assignment
    item, campaign = assignment.pair.item, assignment.campaign
    first, second = _shown(assignment, item)
    return {
        "assignment": assignment.token,
        "campaign": {"id": campaign.pk, "name": campaign.name},
        "question": item.question,
        "profile": [{"text": str(post.get("text", ""))} for post in item.profile if isinstance(post, dict)],
        "rubric": [{"aspect": str(a.get("aspect", ""))} for a in item.rubric_aspects if isinstance(a, dict)],
        "responses": [{"key": "1", "text": first}, {"key": "2", "text": second}],
        "dimensions": campaign.dimensions,
        "expires_at": assignment.expires_at.isoformat(),
        "progress": lease.progress,
    }


def _shown(assignment: Assignment, item) -> tuple[str, str]:
    """The texts of Response 1 and Response 2, in the order this annotator sees them."""
    return (item.chosen, item.rejected) if assignment.chosen_first else (item.rejected, item.chosen)


# --- skips -----------------------------------------------------------------------------------

def assignment_skip(*, user: AbstractBaseUser, token: str, reason: str, flag: bool = False) -> Assignment:
    """Skip (or flag) a pair: it is never offered to this annotator again and its slot is freed."""
    assignment = own_assignment(user, token)
    if not reason.strip():
        raise AnnotationError("Say why you skip this pair.", field="reason")
    mine = Assignment.objects.filter(pk=assignment.pk)
    with transaction.atomic():
        # The status as it is now, the row locked (before the pair's, as everywhere): a submit,
        # renewal or sweep that landed since the read above is seen, none can land until commit.
        state = mine.select_for_update().values_list("status", flat=True).first()
        if state == Assignment.Status.SUBMITTED:
            raise AnnotationError("This pair is already rated.", status=409)
        mine.update(status=Assignment.Status.SKIPPED, skip_reason=reason[:2000], flagged=flag,
                    skipped_at=timezone.now(), draft=None, draft_saved_at=None)
        if state == Assignment.Status.LEASED:  # only a live lease holds a slot
            free_slot(assignment.pair_id)
    assignment.refresh_from_db()
    return assignment


def assignment_unskip(*, user: AbstractBaseUser, token: str, campaign_id: int | None = None) -> Assignment:
    """Undo a skip while the campaign is open: the pair is leased to this annotator again and
    is the next one their rating screen shows. A pair they held meanwhile goes back to expired
    (its draft is kept on it, and it is renewed for them later while it has room), since one
    annotator holds one live lease per campaign. The skip's reason and flag are withdrawn.
    `campaign_id`: the campaign the token must belong to (a page's URL), checked first.
    Errors: AnnotationError 403 (no longer assigned, or shown the pair's answer key since it
    was leased: `_read_refusal`), 404 (not yours, or not in that campaign), 409 (not skipped,
    campaign closed, or enough people have rated the pair since)."""
    assignment = own_assignment(user, token, campaign_id)
    campaign = assignment.campaign
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed; skips can no longer be undone.", status=409)
    require_still_assigned(user, campaign)
    refuse_if_read(user, assignment)
    mine = Assignment.objects.filter(pk=assignment.pk)
    with transaction.atomic():
        # Locked, as skip and submit lock it, so a concurrent undo or submit waits for this one.
        if mine.select_for_update().values_list("status", flat=True).first() != Assignment.Status.SKIPPED:
            raise AnnotationError("This pair is not skipped.", status=409)
        expire(Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.LEASED))
        if not take_slot(assignment.pair_id, campaign.overlap):
            raise AnnotationError("Enough people have rated this pair since you skipped it.", status=409)
        mine.update(status=Assignment.Status.LEASED, skip_reason="", flagged=False, skipped_at=None,
                    expires_at=timezone.now() + timedelta(minutes=campaign.lease_minutes))
    assignment.refresh_from_db()
    return assignment
