"""Annotation campaigns: assignment with leases, blind payloads, ratings, validation.

Concurrency: a pair's `taken` (live leases + submitted ratings) only changes through
conditional UPDATEs (`taken < overlap`), so however many annotators ask at once no pair is
ever held or finished by more than `overlap` people. On PostgreSQL candidate pairs are
also picked with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent requests spread over
pairs instead of queueing on the same row.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.contrib.auth.models import User
from django.db.models import (BigIntegerField, BooleanField, Count, Exists, Expression, ExpressionWrapper, F,
                              FilteredRelation, IntegerField, Max, OuterRef, Q, Subquery, Sum)
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.crypto import salted_hmac

from prblib.rows import MAX_INT, Number, RowError, parse
from pipeline.blindness import (pair_keys_read, pair_read_exists, pair_read_refusal, per_pair_read_exists,
                                per_pair_read_refusal)
from pipeline.models import Benchmark, BenchmarkItem
from pipeline.services import benchmark_freeze, items_record_validation
from core.roles import ANNOTATOR

from .models import (Assignment, Campaign, CampaignPair, CampaignReportCache, Rating, RatingRevision,
                     default_dimensions)
from .ordering import PRIME, AnnotatorOrder, annotator_order, stratify

RESPONSE_KEYS = ("1", "2")

# Columns an annotator's requests (and the staff dashboard's campaign rows) never read, left out
# of their queries (defer_unread): a campaign's guidelines (up to 100,000 characters; the rating
# page renders them once), a pair's gold ratings, and of a pair's item the answer key (narrative)
# and what only exports, models and validation use (extra, history, validation, plan), which can
# run to tens of kB a pair and would otherwise be read and parsed on every `next`, submit, skip
# and revision.
UNREAD = {"campaign": ("guidelines",), "pair": ("gold_expected",),
          "item": ("narrative", "extra", "history", "validation", "plan")}


def defer_unread(queryset, **paths: str):
    """`queryset` with the UNREAD columns of the rows it loads deferred; `paths` maps a kind
    of row (campaign, pair, item) to its lookup path from the queryset's model ("" for the
    model itself), e.g. `defer_unread(assignments, campaign="campaign", item="pair__item")`."""
    return queryset.defer(*(f"{path}__{name}" if path else name
                            for kind, path in paths.items() for name in UNREAD[kind]))


class AnnotationError(Exception):
    """A refused annotation action: `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, *, status: int = 400, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


# --- campaigns ------------------------------------------------------------------------------

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
    from django.contrib.auth.models import Group

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


def _open_to(user: AbstractBaseUser, campaign_ref: str = "pk") -> Q:
    """Whether the campaign at `campaign_ref` (an OuterRef path from the queried model) is open
    to `user`: it names no annotators and no groups, or names them or one of their groups. As
    EXISTS subqueries, so the check rides on a query a request makes anyway."""
    people, teams = Campaign.assignees.through.objects, Campaign.assignee_groups.through.objects
    ref = OuterRef(campaign_ref)
    return ((~Exists(people.filter(campaign_id=ref)) & ~Exists(teams.filter(campaign_id=ref)))
            | Exists(people.filter(campaign_id=ref, user_id=user.pk))
            | Exists(teams.filter(campaign_id=ref, group__user=user.pk)))


def campaigns_open_to(*, user: AbstractBaseUser, queryset=None):
    """The open campaigns `user` may rate: those naming nobody, or naming them or a group of
    theirs (staff: every open campaign)."""
    queryset = Campaign.objects.all() if queryset is None else queryset
    queryset = queryset.filter(is_open=True)
    return queryset if user.is_staff else queryset.filter(_open_to(user))


def campaign_open_to(*, user: AbstractBaseUser, campaign: Campaign) -> bool:
    """Whether `user` may see and rate `campaign` (its assignees; staff always)."""
    return user.is_staff or Campaign.objects.filter(pk=campaign.pk).filter(_open_to(user)).exists()


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
        ended = _expire(gone)
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


# --- assignment -------------------------------------------------------------------------------

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
    return _expire(expired)


def _expire(leases) -> int:
    """Move these leases to EXPIRED, each by a conditional UPDATE that frees its slot only if
    it was still leased (a concurrent submit or sweep wins cleanly). Returns how many."""
    count = 0
    for pk, pair_id in leases.values_list("pk", "pair_id"):
        with transaction.atomic():
            if Assignment.objects.filter(pk=pk, status=Assignment.Status.LEASED).update(status=Assignment.Status.EXPIRED):
                _free_slot(pair_id)
                count += 1
    return count


NOT_ASSIGNED = "This campaign is assigned to other annotators."


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


def _refuse_if_read(user: AbstractBaseUser, assignment: Assignment) -> None:
    """AnnotationError 403 with `_read_refusal`'s reason when `user` was shown the answer key of
    `assignment`'s pair; a live lease on it is released first (its slot freed)."""
    reason = _read_refusal(user, assignment.campaign.benchmark_id, assignment.pair.item_id)
    if reason:
        _expire(Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED))
        raise AnnotationError(reason, status=403)


def _require_still_assigned(user: AbstractBaseUser, campaign: Campaign) -> None:
    """AnnotationError 403 when `campaign` no longer names `user` (or a group of theirs)."""
    if not campaign_open_to(user=user, campaign=campaign):
        raise AnnotationError(NOT_ASSIGNED, status=403)


def _annotator_role(user: AbstractBaseUser) -> Exists:
    """Whether `user` is in the annotator group, as an annotation, so the role check rides on
    a query the request makes anyway."""
    return Exists(User.groups.through.objects.filter(user_id=user.pk, group__name=ANNOTATOR))


def _take_slot(pair_id: int, overlap: int) -> bool:
    return bool(CampaignPair.objects.filter(pk=pair_id, taken__lt=overlap).update(taken=F("taken") + 1))


def _free_slot(pair_id: int) -> None:
    CampaignPair.objects.filter(pk=pair_id, taken__gt=0).update(taken=F("taken") - 1)


def _count(queryset) -> Subquery:
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
                          annotator_role=_annotator_role(user),
                          open_to_me=ExpressionWrapper(_open_to(user), output_field=BooleanField())).first())
    if campaign is None:
        raise AnnotationError("No such campaign.", status=404, field="campaign")
    return campaign


def _progress(campaign: Campaign, done: int) -> dict[str, int]:
    total = sum(campaign.strata)
    return {"done": done, "target": min(campaign.target_per_annotator or total, total)}


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
        _expire(Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.LEASED))
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
            if not _take_slot(expired.pair_id, campaign.overlap):
                continue
            renewed = Assignment.objects.filter(pk=expired.pk, status=Assignment.Status.EXPIRED)
            changed = []
            if _refused_by_constraint(lambda: changed.append(
                    renewed.update(status=Assignment.Status.LEASED, expires_at=lease_until))):
                _free_slot(expired.pair_id)  # a concurrent request of theirs leased first
                return _live_lease(user, campaign)
            if not changed[0]:
                # No longer expired: renewed by a concurrent request of theirs, submitted late
                # or skipped since it was read. Either way it holds its own slot, or needs none.
                _free_slot(expired.pair_id)
                lease = _live_lease(user, campaign)
                if lease is not None:
                    return lease
                continue
            expired.status, expired.expires_at, expired.campaign = Assignment.Status.LEASED, lease_until, campaign
            return Lease(expired, _progress(campaign, campaign.done))

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
        if not _take_slot(pair.pk, campaign.overlap):
            continue
        assignment = Assignment(token=secrets.token_urlsafe(16), campaign=campaign, pair=pair, annotator=user,
                                expires_at=lease_until,
                                chosen_first=chosen_first(campaign_id=campaign.pk, annotator_id=user.pk,
                                                          item_id=pair.item_id))
        if _refused_by_constraint(lambda: assignment.save(force_insert=True)):
            _free_slot(pair.pk)  # the same person asked twice at once (two tabs)
            lease = _live_lease(user, campaign)
            if lease is not None:
                return lease
            continue
        return Lease(assignment, _progress(campaign, campaign.done))
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
        _expire(Assignment.objects.filter(pk=live.pk, status=Assignment.Status.LEASED))
        return None
    live.campaign = campaign
    return Lease(live, _progress(campaign, campaign.done))


def _own_assignment(user: AbstractBaseUser, token: str, campaign_id: int | None = None) -> Assignment:
    """The user's assignment with this token (in campaign `campaign_id` when given), or
    AnnotationError 404."""
    mine = Assignment.objects.select_related("campaign", "pair__item").filter(token=str(token), annotator=user)
    if campaign_id is not None:
        mine = mine.filter(campaign_id=campaign_id)
    assignment = defer_unread(mine, campaign="campaign", pair="pair", item="pair__item").first()
    if assignment is None:  # someone else's token looks exactly like a missing one
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    return assignment


def progress_for(*, user: AbstractBaseUser, campaign: Campaign) -> dict[str, int]:
    """{done: pairs this annotator submitted, target: pairs they are asked for}."""
    done = Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.SUBMITTED).count()
    return _progress(campaign, done)


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


# --- ratings ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitResult:
    rating: Rating
    created: bool
    progress: dict[str, int]


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


# The most active seconds one rating may record: 4 hours (the page's clock counts only time with
# the tab visible and touched in the last minute, and stops here; static/js/annotate.js).
# More is refused (400), not capped, so the time reports sum stays what annotators really spent.
MAX_ACTIVE_SECONDS = 4 * 3600


def _check_seconds(seconds: Any) -> float | None:
    """Active seconds a rating took: a finite number from 0 to MAX_ACTIVE_SECONDS, or None."""
    try:
        return parse(Number(low=0, high=MAX_ACTIVE_SECONDS, optional=True), seconds, field="seconds")
    except RowError as exc:
        raise AnnotationError(f"seconds must be a number from 0 to {MAX_ACTIVE_SECONDS} (4 hours of active time): "
                              f"{exc.reason}.", field="seconds") from None


def _by_role(assignment: Assignment, clean: dict[str, dict[str, int]]) -> tuple[dict, dict]:
    """(chosen, rejected) from ratings keyed by shown position."""
    first, second = clean["1"], clean["2"]
    return (first, second) if assignment.chosen_first else (second, first)


def _by_position(assignment: Assignment, rating: Rating) -> dict[str, dict]:
    """A rating keyed by shown position ("1", "2"), as its annotator saw the answers."""
    first, second = (rating.chosen, rating.rejected) if assignment.chosen_first else (rating.rejected, rating.chosen)
    return {"1": first, "2": second}


def rating_submit(*, user: AbstractBaseUser, token: str, ratings: Any, seconds: Any = None, comment: str = "",
                  flag_reason: str = "") -> SubmitResult:
    """Store one annotator's ratings of one pair, by role. Idempotent: a repeated submit
    returns the first rating (revisions go through `rating_revise`). A late submit after
    the lease expired is accepted while the pair has room, else refused with 409 (the
    client keeps the draft). The lease moves to SUBMITTED by a conditional UPDATE, so a
    concurrent sweep either expires it first (then a slot must be won back) or not at all.

    Statements: 5 (assignment with its rating, progress and role; BEGIN; status update;
    insert; COMMIT); a pair's `taken` already counts submitted ratings, so nothing else
    changes. With token auth a request makes 6.
    A lease on a pair whose answer key the annotator was shown since it was leased (the
    rules of `assignment_next`: `_read_refusal`) is refused with 403 and released.
    Errors: AnnotationError 400 (field named), 403 (role, assignees, answer key shown), 404
    (not yours), 409 (skipped, closed, lease ran out and the pair is full)."""
    done_sq = _count(Assignment.objects.filter(campaign=OuterRef("campaign"), annotator=user,
                                               status=Assignment.Status.SUBMITTED))
    assignment = defer_unread(Assignment.objects.select_related("campaign", "pair", "rating")
                              .annotate(done=Coalesce(done_sq, 0), annotator_role=_annotator_role(user),
                                        open_to_me=ExpressionWrapper(_open_to(user, "campaign_id"),
                                                                     output_field=BooleanField()),
                                        read_its_pairs=per_pair_read_exists(user, "campaign__benchmark_id"),
                                        pair_read=pair_read_exists(user))
                              .filter(token=str(token), annotator=user), campaign="campaign", pair="pair").first()
    if assignment is None:
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    campaign = assignment.campaign
    existing = getattr(assignment, "rating", None)
    if existing is not None:
        return SubmitResult(existing, False, _progress(campaign, assignment.done))
    if not (user.is_staff or assignment.annotator_role):
        raise AnnotationError("Annotating needs the annotator role.", status=403)
    if not (user.is_staff or assignment.open_to_me):
        raise AnnotationError(NOT_ASSIGNED, status=403)
    if assignment.read_its_pairs or assignment.pair_read:  # shown its answer key after it was leased
        _refuse_if_read(user, assignment)
    clean = _check_ratings(ratings, campaign.dimension_keys)
    seconds = _check_seconds(seconds)
    if assignment.status == Assignment.Status.SKIPPED:
        raise AnnotationError("You skipped this pair.", status=409)
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)
    chosen, rejected = _by_role(assignment, clean)
    # The draft goes in the same UPDATE: a submitted pair keeps none.
    mark = {"status": Assignment.Status.SUBMITTED, "flagged": bool(flag_reason), "draft": None,
            "draft_saved_at": None}
    try:
        with transaction.atomic():
            mine = Assignment.objects.filter(pk=assignment.pk)
            if not mine.filter(status=Assignment.Status.LEASED).update(**mark):
                # Expired by the sweep, submitted by a concurrent repeat of this request, or
                # skipped meanwhile. The assignment's row is locked before the pair's (as skip
                # and the sweep lock them), so no two requests wait on each other.
                state = mine.select_for_update().values_list("status", flat=True).first()
                if state == Assignment.Status.SUBMITTED:
                    raise _StoredMeanwhile
                if state != Assignment.Status.EXPIRED:
                    raise AnnotationError("This pair is no longer leased to you.", status=409)
                # An expired lease must win a slot back. The row stays locked (on SQLite the
                # UPDATE above already holds the write lock), so it is still EXPIRED below.
                if not _take_slot(assignment.pair_id, campaign.overlap):
                    raise AnnotationError("Your time on this pair ran out and enough people have rated it since; "
                                          "your draft is kept.", status=409)
                mine.update(**mark)
            rating = Rating.objects.create(
                assignment=assignment, campaign=campaign, item_id=assignment.pair.item_id, annotator=user,
                chosen=chosen, rejected=rejected, comment=comment[:5000], flag_reason=flag_reason[:2000],
                seconds=seconds)
    except (IntegrityError, _StoredMeanwhile):  # a concurrent repeat of the same submit stored it first
        return SubmitResult(Rating.objects.get(assignment=assignment), False, progress_for(user=user, campaign=campaign))
    return SubmitResult(rating, True, _progress(campaign, assignment.done + 1))


class _StoredMeanwhile(Exception):
    """Inside rating_submit: a concurrent repeat of the same submit stored the rating first."""


def rating_revise(*, user: AbstractBaseUser, token: str, ratings: Any, comment: str | None = None,
                  campaign_id: int | None = None) -> Rating:
    """An annotator changes their own rating while the campaign is open, still names them and
    they have not been shown the pair's answer key since (`_read_refusal`). The earlier version
    is kept as a RatingRevision; the Rating holds the latest, which reports use.
    `ratings` is keyed by the shown position ("1", "2") like a submit; `campaign_id`: the
    campaign the token must belong to (a page's URL), checked before anything changes.
    Errors: AnnotationError 404 (not yours / not in that campaign / not rated yet), 400 (field
    named), 403 (no longer assigned, or shown the answer key), 409 (closed)."""
    assignment = _own_assignment(user, token, campaign_id)
    rating = Rating.objects.filter(assignment=assignment).first()
    if rating is None:
        raise AnnotationError("You have not rated this pair yet.", status=404, field="assignment")
    if not assignment.campaign.is_open:
        raise AnnotationError("This campaign is closed; ratings can no longer be revised.", status=409)
    _require_still_assigned(user, assignment.campaign)
    _refuse_if_read(user, assignment)
    chosen, rejected = _by_role(assignment, _check_ratings(ratings, assignment.campaign.dimension_keys))
    comment = rating.comment if comment is None else comment[:5000]
    if chosen == rating.chosen and rejected == rating.rejected and comment == rating.comment:
        return rating
    with transaction.atomic():
        RatingRevision.objects.create(rating=rating, chosen=rating.chosen, rejected=rating.rejected,
                                      comment=rating.comment, flag_reason=rating.flag_reason, seconds=rating.seconds,
                                      rated_at=rating.revised_at or rating.created_at)
        rating.chosen, rating.rejected, rating.comment, rating.revised_at = chosen, rejected, comment, timezone.now()
        rating.save(update_fields=["chosen", "rejected", "comment", "revised_at"])
    return rating


def rating_history(*, user: AbstractBaseUser, campaign: Campaign) -> list[dict[str, Any]]:
    """This annotator's own ratings in a campaign, newest first, by shown position only:
    [{token, question, rated_at, revised_at, revisions, ratings: {"1": {dim: v}, "2": {...}}}]."""
    out = []
    for r in (Rating.objects.filter(campaign=campaign, annotator=user).select_related("assignment", "item")
              .only("chosen", "rejected", "created_at", "revised_at", "assignment__token", "assignment__chosen_first",
                    "item__question")
              .annotate(n_revisions=Count("revisions")).order_by("-created_at", "-pk")):
        out.append({"token": r.assignment.token, "question": r.item.question, "rated_at": r.created_at,
                    "revised_at": r.revised_at, "revisions": r.n_revisions, "ratings": _by_position(r.assignment, r)})
    return out


def rating_for_revision(*, user: AbstractBaseUser, token: str, campaign_id: int | None = None) -> dict[str, Any]:
    """The blind pair as this annotator saw it, with their current ratings by shown position.
    Errors: AnnotationError 404 (not yours / not in campaign `campaign_id` / not rated), 403
    (no longer assigned, or shown the pair's answer key since: `rating_revise` would refuse)."""
    assignment = _own_assignment(user, token, campaign_id)
    rating = Rating.objects.filter(assignment=assignment).first()
    if rating is None:
        raise AnnotationError("You have not rated this pair yet.", status=404, field="assignment")
    _require_still_assigned(user, assignment.campaign)
    _refuse_if_read(user, assignment)
    payload = assignment_payload(lease=Lease(assignment, {}))
    payload.update(current=_by_position(assignment, rating), comment=rating.comment,
                   is_open=assignment.campaign.is_open)
    return payload


def assignment_skip(*, user: AbstractBaseUser, token: str, reason: str, flag: bool = False) -> Assignment:
    """Skip (or flag) a pair: it is never offered to this annotator again and its slot is freed."""
    assignment = _own_assignment(user, token)
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
            _free_slot(assignment.pair_id)
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
    assignment = _own_assignment(user, token, campaign_id)
    campaign = assignment.campaign
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed; skips can no longer be undone.", status=409)
    _require_still_assigned(user, campaign)
    _refuse_if_read(user, assignment)
    mine = Assignment.objects.filter(pk=assignment.pk)
    with transaction.atomic():
        # Locked, as skip and submit lock it, so a concurrent undo or submit waits for this one.
        if mine.select_for_update().values_list("status", flat=True).first() != Assignment.Status.SKIPPED:
            raise AnnotationError("This pair is not skipped.", status=409)
        _expire(Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.LEASED))
        if not _take_slot(assignment.pair_id, campaign.overlap):
            raise AnnotationError("Enough people have rated this pair since you skipped it.", status=409)
        mine.update(status=Assignment.Status.LEASED, skip_reason="", flagged=False, skipped_at=None,
                    expires_at=timezone.now() + timedelta(minutes=campaign.lease_minutes))
    assignment.refresh_from_db()
    return assignment


def skipped_pairs(*, user: AbstractBaseUser, campaign: Campaign) -> list[dict[str, Any]]:
    """This annotator's skipped pairs in a campaign, newest first, blind:
    [{token, question, reason, flagged, skipped_at}]."""
    rows = (Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.SKIPPED)
            .select_related("pair__item").only("token", "skip_reason", "flagged", "skipped_at", "leased_at",
                                               "pair__item__question")
            .order_by(F("skipped_at").desc(nulls_last=True), "-pk"))
    return [{"token": a.token, "question": a.pair.item.question, "reason": a.skip_reason, "flagged": a.flagged,
             "skipped_at": a.skipped_at} for a in rows]


SKIP_FIELDS = ("annotator", "pair", "domain", "reason", "flagged", "leased_at", "skipped_at")


def skip_rows(*, campaign: Campaign):
    """The campaign's skipped pairs for staff, one row per (annotator, pair): who, which pair,
    the reason, whether it was flagged as a problem, when (ISO 8601)."""
    for a in (Assignment.objects.filter(campaign=campaign, status=Assignment.Status.SKIPPED)
              .select_related("annotator", "pair__item")
              .only("skip_reason", "flagged", "leased_at", "skipped_at", "annotator__username",
                    "pair__item__source_id", "pair__item__domain").order_by("pk").iterator(chunk_size=2000)):
        yield {"annotator": a.annotator.get_username(), "pair": a.pair.item.source_id, "domain": a.pair.item.domain,
               "reason": a.skip_reason, "flagged": a.flagged, "leased_at": a.leased_at.isoformat(),
               "skipped_at": a.skipped_at.isoformat() if a.skipped_at else None}


# --- drafts ----------------------------------------------------------------------------------------

DRAFT_COMMENT_MAX, DRAFT_FLAG_MAX = 5000, 2000


def _check_draft(draft: Any, keys: list[str]) -> dict[str, Any]:
    """A draft as the rating screen sends it, checked: {"ratings": {"1": {dim: 1-5}, "2": {...}}
    (any subset), "comment": str, "flag": bool, "flag_reason": str, "seconds": number}."""
    if not isinstance(draft, dict):
        raise AnnotationError("draft must be an object.", field="draft")
    unknown = set(draft) - {"ratings", "comment", "flag", "flag_reason", "seconds"}
    if unknown:
        raise AnnotationError(f"draft: unknown key(s) {', '.join(sorted(unknown))}.", field="draft")
    ratings = draft.get("ratings") or {}
    if not isinstance(ratings, dict) or set(ratings) - set(RESPONSE_KEYS):
        raise AnnotationError('draft.ratings must be an object keyed by response "1" and "2".',
                              field="draft.ratings")
    clean_ratings = {}
    for response in RESPONSE_KEYS:
        given = ratings.get(response) or {}
        if not isinstance(given, dict):
            raise AnnotationError(f"draft.ratings.{response} must be an object.", field=f"draft.ratings.{response}")
        clean_ratings[response] = {}
        for key, value in given.items():
            if key not in keys:
                raise AnnotationError(f"draft.ratings.{response}: unknown dimension {key!r}.",
                                      field=f"draft.ratings.{response}")
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
                raise AnnotationError(f"draft.ratings.{response}.{key}: must be a whole number from 1 to 5.",
                                      field=f"draft.ratings.{response}.{key}")
            clean_ratings[response][key] = value
    comment, flag_reason = draft.get("comment", ""), draft.get("flag_reason", "")
    if not isinstance(comment, str) or len(comment) > DRAFT_COMMENT_MAX:
        raise AnnotationError(f"draft.comment must be text of at most {DRAFT_COMMENT_MAX} characters.",
                              field="draft.comment")
    if not isinstance(flag_reason, str) or len(flag_reason) > DRAFT_FLAG_MAX:
        raise AnnotationError(f"draft.flag_reason must be text of at most {DRAFT_FLAG_MAX} characters.",
                              field="draft.flag_reason")
    if not isinstance(draft.get("flag", False), bool):
        raise AnnotationError("draft.flag must be true or false.", field="draft.flag")
    try:
        seconds = _check_seconds(draft.get("seconds"))
    except AnnotationError as exc:
        raise AnnotationError(f"draft.{exc}", field="draft.seconds") from None
    return {"ratings": clean_ratings, "comment": comment, "flag": draft.get("flag", False),
            "flag_reason": flag_reason, "seconds": seconds}


def draft_save(*, user: AbstractBaseUser, token: str, draft: Any) -> dict[str, Any]:
    """Store the annotator's unsent work on a pair they hold (a live or expired lease), by
    shown position; returns it with `saved_at` (ISO 8601). Nothing in it says which answer is
    which: it is what the annotator typed. Errors: AnnotationError 400 (field named), 404 (not
    yours), 403 (no longer assigned, or shown the pair's answer key since: a submit would be
    refused), 409 (rated, skipped or closed)."""
    assignment = _own_assignment(user, token)
    clean = _check_draft(draft, assignment.campaign.dimension_keys)
    if not assignment.campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)
    _require_still_assigned(user, assignment.campaign)
    _refuse_if_read(user, assignment)
    now = timezone.now()
    held = (Assignment.Status.LEASED, Assignment.Status.EXPIRED)
    if not Assignment.objects.filter(pk=assignment.pk, status__in=held).update(draft=clean, draft_saved_at=now):
        raise AnnotationError("This pair is already rated or skipped; there is no draft to keep.", status=409)
    return {**clean, "saved_at": now.isoformat()}


def draft_get(*, user: AbstractBaseUser, token: str) -> dict[str, Any] | None:
    """The stored draft of one of the annotator's pairs ({ratings, comment, flag, flag_reason,
    seconds, saved_at}), or None. Errors: AnnotationError 404 (not yours)."""
    row = (Assignment.objects.filter(token=str(token), annotator=user)
           .values("draft", "draft_saved_at").first())
    if row is None:
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    if not row["draft"]:
        return None
    return {**row["draft"], "saved_at": row["draft_saved_at"].isoformat() if row["draft_saved_at"] else None}


def draft_delete(*, user: AbstractBaseUser, token: str) -> None:
    """Forget the stored draft of one of the annotator's pairs. Errors: AnnotationError 404."""
    if not Assignment.objects.filter(token=str(token), annotator=user).update(draft=None, draft_saved_at=None):
        raise AnnotationError("No such assignment.", status=404, field="assignment")


# --- report and validation -----------------------------------------------------------------------

ROW_COLUMNS = ("chosen", "rejected", "seconds", "comment", "flag_reason", "created_at", "revised_at",
               "item__source_id", "item__domain", "annotator__username", "assignment__chosen_first")


def rating_rows(*, campaign: Campaign):
    """Ratings in long format: one row per (annotator, pair, role, dimension). `position` is
    where that role's answer was shown to the annotator (1 = Response 1, 2 = Response 2);
    `revised_at` is set when the annotator revised the rating (the row holds the latest)."""
    keys = campaign.dimension_keys
    # Only the columns a row holds: an item's texts and profile (kBs a pair) stay in the database.
    for r in (Rating.objects.filter(campaign=campaign).select_related("item", "annotator", "assignment")
              .only(*ROW_COLUMNS).order_by("pk").iterator(chunk_size=2000)):
        first = "chosen" if r.assignment.chosen_first else "rejected"
        for role, values in (("chosen", r.chosen), ("rejected", r.rejected)):
            for key in keys:
                yield {"annotator": r.annotator.get_username(), "pair": r.item.source_id, "domain": r.item.domain,
                       "role": role, "dimension": key, "value": values[key], "position": 1 if role == first else 2,
                       "seconds": r.seconds, "comment": r.comment, "flag_reason": r.flag_reason,
                       "created_at": r.created_at.isoformat(),
                       "revised_at": r.revised_at.isoformat() if r.revised_at else None}


def _rubric_dimension(campaign: Campaign) -> str:
    keys = campaign.dimension_keys
    return "personal_rubrics" if "personal_rubrics" in keys else keys[-1]


def _gold_pairs(campaign: Campaign) -> list[tuple[str, Any]]:
    """[(source id, expected ratings)] of the campaign's gold pairs, in pair order."""
    return list(campaign.pairs.filter(is_gold=True).order_by("pk").values_list("item__source_id", "gold_expected"))


def campaign_statistics(*, campaign: Campaign, gold_pairs: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """The statistics of the campaign's ratings, computed in full from every rating:
    stats.build_report plus stats.position_bias under "position_bias". See campaign_report
    for the cached form. `gold_pairs`: `_gold_pairs(campaign)` when the caller has it."""
    from prblib.stats import agreement as stats

    rows = list(rating_rows(campaign=campaign))
    gold = dict(_gold_pairs(campaign) if gold_pairs is None else gold_pairs)
    report = stats.build_report(
        rows, dimensions=campaign.dimension_keys, gold=gold or None, rubric_dimension=_rubric_dimension(campaign),
        rubric_min_diff=campaign.rubric_min_diff, other_max_diff=campaign.other_max_diff)
    report["position_bias"] = stats.position_bias(rows, campaign.dimension_keys)
    report["method"]["position_bias"] = stats.POSITION_BIAS_METHOD
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
    gold_pairs = _gold_pairs(campaign)
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


def validation_sentences(*, pair: dict[str, Any], campaign: Campaign) -> list[str]:
    """Why a pair fails, as sentences a person reads (from stats.validate_pairs' `diffs`):
    e.g. "Personal Rubrics: the chosen answer is rated 1.50 points above the rejected one;
    a valid pair needs at least 2.0."."""
    labels = {d["key"]: d.get("label", d["key"]) for d in campaign.dimensions}
    rubric = _rubric_dimension(campaign)
    out = []
    for dim, diff in pair["diffs"].items():
        label = labels.get(dim, dim)
        if diff is None:
            out.append(f"{label}: not yet rated on both answers.")
        elif dim == rubric and not diff >= campaign.rubric_min_diff:
            where = "above" if diff >= 0 else "below"
            out.append(f"{label}: the chosen answer is rated {abs(diff):.2f} points {where} the rejected one; "
                       f"a valid pair needs at least {campaign.rubric_min_diff:g}.")
        elif dim != rubric and not abs(diff) < campaign.other_max_diff:
            better = "chosen" if diff > 0 else "rejected"
            out.append(f"{label}: the answers differ by {abs(diff):.2f} points (the {better} one rated higher); "
                       f"a valid pair differs by less than {campaign.other_max_diff:g} here.")
    return out


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


def campaign_set_open(*, campaign: Campaign, is_open: bool) -> bool:
    """Close or reopen a campaign; returns whether its state changed. Idempotent: closing a
    closed campaign (or reopening an open one) changes nothing, so concurrent presses agree.
    Closing ends every live lease (their slots are freed). `campaign.is_open` is set in place."""
    changed = bool(Campaign.objects.filter(pk=campaign.pk, is_open=not is_open).update(is_open=is_open))
    if not is_open:
        _expire(Assignment.objects.filter(campaign=campaign, status=Assignment.Status.LEASED))
    campaign.is_open = is_open
    return changed


def campaign_update_guidelines(*, campaign: Campaign, guidelines: str) -> Campaign:
    if not guidelines.strip():
        raise AnnotationError("Write guidelines for the annotators.", field="guidelines")
    Campaign.objects.filter(pk=campaign.pk).update(guidelines=guidelines)
    campaign.guidelines = guidelines
    return campaign


def campaign_pair_detail(*, campaign: Campaign, pair_id: str) -> dict[str, Any]:
    """One pair of a campaign for staff: the item, every annotator's ratings side by side
    (latest version, by role, with the position each answer was shown in), the spread per
    (role, dimension) and the verdict. `disagree` marks cells whose spread (max - min over
    annotators) is at least 2 points. Also the person's rubric aspects ({aspect, evidence,
    reason}) and past posts, and the source ids of the previous and next pairs in benchmark
    order (None at either end) with this pair's place `index` (1-based) of `total`.
    Errors: AnnotationError 404."""
    pair = (CampaignPair.objects.filter(campaign=campaign, item__source_id=str(pair_id)).select_related("item")
            .first())
    if pair is None:
        raise AnnotationError("No such pair in this campaign.", status=404)
    ratings = list(Rating.objects.filter(campaign=campaign, item=pair.item).select_related("annotator", "assignment")
                   .annotate(n_revisions=Count("revisions")).order_by("annotator__username"))
    keys = campaign.dimension_keys
    spread = {}
    for role in ("chosen", "rejected"):
        for key in keys:
            values = [getattr(r, role)[key] for r in ratings]
            spread[f"{role}.{key}"] = (max(values) - min(values)) if values else None
    from prblib.stats import agreement as stats

    rows = [row for row in rating_rows(campaign=campaign) if row["pair"] == pair.item.source_id]
    verdict = next(iter(stats.validate_pairs(rows, keys, rubric_dimension=_rubric_dimension(campaign),
                                             rubric_min_diff=campaign.rubric_min_diff,
                                             other_max_diff=campaign.other_max_diff)), None)
    position = pair.item.position
    siblings = CampaignPair.objects.filter(campaign=campaign).values_list("item__source_id", flat=True)
    previous = siblings.filter(item__position__lt=position).order_by("-item__position").first()
    following = siblings.filter(item__position__gt=position).order_by("item__position").first()
    index = siblings.filter(item__position__lt=position).count()
    return {
        "pair": pair, "item": pair.item,
        "rubric": [{"aspect": str(a.get("aspect", "")), "evidence": str(a.get("evidence", "") or ""),
                    "reason": str(a.get("reason", "") or "")}
                   for a in pair.item.rubric_aspects if isinstance(a, dict)],
        "profile": [str(p.get("text", "")) for p in pair.item.profile if isinstance(p, dict)],
        "previous": previous, "next": following, "index": index + 1, "total": campaign.pairs.count(),
        "annotators": [{"name": r.annotator.get_username(), "chosen_shown": 1 if r.assignment.chosen_first else 2,
                        "chosen": r.chosen, "rejected": r.rejected, "seconds": r.seconds, "comment": r.comment,
                        "flag_reason": r.flag_reason, "revisions": r.n_revisions} for r in ratings],
        "spread": spread, "disagree": {k for k, v in spread.items() if v is not None and v >= 2},
        "verdict": verdict, "reasons": validation_sentences(pair=verdict, campaign=campaign) if verdict else [],
    }


def campaign_dashboard() -> list[dict[str, Any]]:
    """Every campaign for the staff dashboard, newest first: [{campaign, pairs, slots,
    ratings, complete_pairs, percent, annotators: [{name, ratings, active_seconds}],
    leases: [{annotator, expires_at}]}]. `slots` = pairs x overlap; `percent` = ratings /
    slots x 100; active time is the sum of the annotator's per-pair active seconds."""
    campaigns = list(defer_unread(Campaign.objects.select_related("benchmark"), campaign="").annotate(
        n_pairs=Count("pairs", distinct=True)).prefetch_related("assignees", "assignee_groups"))
    overlap = {c.pk: c.overlap for c in campaigns}
    complete: dict[int, int] = {}
    for campaign_id, n in Rating.objects.values("campaign", "item").annotate(n=Count("pk")).values_list("campaign",
                                                                                                        "n"):
        if n >= overlap.get(campaign_id, n + 1):
            complete[campaign_id] = complete.get(campaign_id, 0) + 1
    per_annotator: dict[int, list[dict]] = {}
    for row in (Rating.objects.values("campaign", "annotator__username")
                .annotate(n=Count("pk"), seconds=Sum("seconds")).order_by("campaign", "annotator__username")):
        per_annotator.setdefault(row["campaign"], []).append(
            {"name": row["annotator__username"], "ratings": row["n"], "active_seconds": row["seconds"] or 0.0})
    leases: dict[int, list[dict]] = {}
    for campaign_id, name, expires in (Assignment.objects.filter(status=Assignment.Status.LEASED,
                                                                 expires_at__gte=timezone.now())
                                       .values_list("campaign", "annotator__username", "expires_at")
                                       .order_by("expires_at")):
        leases.setdefault(campaign_id, []).append({"annotator": name, "expires_at": expires})
    out = []
    for c in campaigns:
        annotators = per_annotator.get(c.pk, [])
        ratings = sum(a["ratings"] for a in annotators)
        slots = c.n_pairs * c.overlap
        out.append({"campaign": c, "pairs": c.n_pairs, "slots": slots, "ratings": ratings,
                    "complete_pairs": complete.get(c.pk, 0),
                    "percent": round(100 * ratings / slots, 1) if slots else 0.0,
                    "annotators": annotators, "leases": leases.get(c.pk, [])})
    return out


DEMO_ANNOTATORS = ("demo-annotator-1", "demo-annotator-2")


def campaign_seed_demo_ratings(*, campaign: Campaign, pairs: int | None = None) -> int:
    """Ratings from two demo annotator accounts (no usable password) on the first `pairs`
    pairs each gets (None: every pair it is offered), so the demo report has something to show:
    with every pair rated by both, each pair has the ratings validation needs, on any database. Values are synthetic and
    seeded: chosen answers score high on the rubric dimension and rejected ones low, other
    dimensions alike with a little noise, so most pairs pass validation and some fail.
    Idempotent: an annotator who already rated is left alone. Returns ratings added."""
    import random

    from django.contrib.auth.models import Group, User

    group, _ = Group.objects.get_or_create(name=ANNOTATOR)
    rubric = _rubric_dimension(campaign)
    added = 0
    for i, username in enumerate(DEMO_ANNOTATORS):
        user, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        user.groups.add(group)
        if Rating.objects.filter(campaign=campaign, annotator=user).exists():
            continue
        rng = random.Random(f"prbench-demo:{campaign.pk}:{i}")
        for _ in range(pairs if pairs is not None else campaign.pairs.count()):
            lease = assignment_next(user=user, campaign_id=campaign.pk)
            if lease is None:
                break
            chosen, rejected = {}, {}
            for key in campaign.dimension_keys:
                if key == rubric:
                    chosen[key], rejected[key] = rng.choice((5, 5, 4, 3)), rng.choice((1, 1, 2, 3))
                else:
                    chosen[key] = rng.choice((4, 4, 5))
                    rejected[key] = max(1, min(5, chosen[key] + rng.choice((0, 0, 0, -1, 1, -2))))
            shown = {"1": chosen, "2": rejected} if lease.assignment.chosen_first else {"1": rejected, "2": chosen}
            rating_submit(user=user, token=lease.assignment.token, ratings=shown,
                          seconds=round(rng.uniform(40, 180), 1))
            added += 1
    return added
