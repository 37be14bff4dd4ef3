"""Annotation reads: querysets and dicts for pages, the API and exports; nothing here writes.

- who may rate what: `open_to` (the EXISTS check every annotator request rides on),
  `campaigns_open_to`, `campaign_open_to`, `annotator_queue` (the annotator's campaign list);
- an annotator's own work, blind (by shown position only): `progress_for`, `rating_history`,
  `skipped_pairs`;
- staff views: `campaign_dashboard`, `campaign_pair_detail`, `validation_sentences`;
- export rows: `rating_rows` (also the statistics' input), `skip_rows`;
- `defer_unread`: the columns annotator requests never read, left out of their queries.

The services (annotation/services/) import these; these import no service.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Exists, F, OuterRef, Q, Sum
from django.utils import timezone

from .models import Assignment, Campaign, CampaignPair, Rating

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


# --- who may rate what -------------------------------------------------------------------------

def open_to(user: AbstractBaseUser, campaign_ref: str = "pk") -> Q:
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
    return queryset if user.is_staff else queryset.filter(open_to(user))


def campaign_open_to(*, user: AbstractBaseUser, campaign: Campaign) -> bool:
    """Whether `user` may see and rate `campaign` (its assignees; staff always)."""
    return user.is_staff or Campaign.objects.filter(pk=campaign.pk).filter(open_to(user)).exists()


def campaigns_listed_for(*, user: AbstractBaseUser):
    """The campaigns the API lists to `user`, with benchmark and assignees loaded: every one for
    staff, the open ones they may rate for everyone else."""
    campaigns = Campaign.objects.select_related("benchmark").prefetch_related("assignees", "assignee_groups")
    return campaigns if user.is_staff else campaigns_open_to(user=user, queryset=campaigns)


def annotator_queue(*, user: AbstractBaseUser) -> list[dict[str, Any]]:
    """The annotator's campaign list: [{campaign, progress, skipped}] for each open campaign
    they may rate (`skipped`: pairs they skipped there)."""
    campaigns = defer_unread(campaigns_open_to(user=user, queryset=Campaign.objects.select_related("benchmark")),
                             campaign="")
    return [{"campaign": c, "progress": progress_for(user=user, campaign=c),
             "skipped": c.assignments.filter(annotator=user, status=Assignment.Status.SKIPPED).count()}
            for c in campaigns]


# --- an annotator's own work -----------------------------------------------------------------

def progress_of(campaign: Campaign, done: int) -> dict[str, int]:
    """{done, target}: `done` pairs submitted of the pairs the annotator is asked for."""
    total = sum(campaign.strata)
    return {"done": done, "target": min(campaign.target_per_annotator or total, total)}


def progress_for(*, user: AbstractBaseUser, campaign: Campaign) -> dict[str, int]:
    """{done: pairs this annotator submitted, target: pairs they are asked for}."""
    done = Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.SUBMITTED).count()
    return progress_of(campaign, done)


def by_position(assignment: Assignment, rating) -> dict[str, dict]:
    """A rating (or revision) keyed by shown position ("1", "2"), as its annotator saw the answers."""
    first, second = (rating.chosen, rating.rejected) if assignment.chosen_first else (rating.rejected, rating.chosen)
    return {"1": first, "2": second}


def rating_history(*, user: AbstractBaseUser, campaign: Campaign) -> list[dict[str, Any]]:
    """This annotator's own ratings in a campaign, newest first, by shown position only:
    [{token, question, rated_at, revised_at, revisions, ratings: {"1": {dim: v}, "2": {...}}}]."""
    out = []
    for r in (Rating.objects.filter(campaign=campaign, annotator=user).select_related("assignment", "item")
              .only("chosen", "rejected", "created_at", "revised_at", "assignment__token", "assignment__chosen_first",
                    "item__question")
              .annotate(n_revisions=Count("revisions")).order_by("-created_at", "-pk")):
        out.append({"token": r.assignment.token, "question": r.item.question, "rated_at": r.created_at,
                    "revised_at": r.revised_at, "revisions": r.n_revisions, "ratings": by_position(r.assignment, r)})
    return out


def skipped_pairs(*, user: AbstractBaseUser, campaign: Campaign) -> list[dict[str, Any]]:
    """This annotator's skipped pairs in a campaign, newest first, blind:
    [{token, question, reason, flagged, skipped_at}]."""
    rows = (Assignment.objects.filter(campaign=campaign, annotator=user, status=Assignment.Status.SKIPPED)
            .select_related("pair__item").only("token", "skip_reason", "flagged", "skipped_at", "leased_at",
                                               "pair__item__question")
            .order_by(F("skipped_at").desc(nulls_last=True), "-pk"))
    return [{"token": a.token, "question": a.pair.item.question, "reason": a.skip_reason, "flagged": a.flagged,
             "skipped_at": a.skipped_at} for a in rows]


# --- export rows ----------------------------------------------------------------------------------

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


# --- staff views ------------------------------------------------------------------------------------

def rubric_dimension(campaign: Campaign) -> str:
    """The dimension the validation rule asks a clear difference on: Personal Rubrics, else the last."""
    keys = campaign.dimension_keys
    return "personal_rubrics" if "personal_rubrics" in keys else keys[-1]


def gold_pairs(campaign: Campaign) -> list[tuple[str, Any]]:
    """[(source id, expected ratings)] of the campaign's gold pairs, in pair order."""
    return list(campaign.pairs.filter(is_gold=True).order_by("pk").values_list("item__source_id", "gold_expected"))


def validation_sentences(*, pair: dict[str, Any], campaign: Campaign) -> list[str]:
    """Why a pair fails, as sentences a person reads (from agreement.validate_pairs' `diffs`):
    e.g. "Personal Rubrics: the chosen answer is rated 1.50 points above the rejected one;
    a valid pair needs at least 2.0."."""
    labels = {d["key"]: d.get("label", d["key"]) for d in campaign.dimensions}
    rubric = rubric_dimension(campaign)
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


def campaign_pair_detail(*, campaign: Campaign, pair_id: str) -> dict[str, Any] | None:
    """One pair of a campaign for staff, or None when the campaign has no such pair: the item,
    every annotator's ratings side by side (latest version, by role, with the position each
    answer was shown in), the spread per (role, dimension) and the verdict. `disagree` marks
    cells whose spread (max - min over annotators) is at least 2 points. Also the person's
    rubric aspects ({aspect, evidence, reason}) and past posts, and the source ids of the
    previous and next pairs in benchmark order (None at either end) with this pair's place
    `index` (1-based) of `total`."""
    pair = (CampaignPair.objects.filter(campaign=campaign, item__source_id=str(pair_id)).select_related("item")
            .first())
    if pair is None:
        return None
    ratings = list(Rating.objects.filter(campaign=campaign, item=pair.item).select_related("annotator", "assignment")
                   .annotate(n_revisions=Count("revisions")).order_by("annotator__username"))
    keys = campaign.dimension_keys
    spread = {}
    for role in ("chosen", "rejected"):
        for key in keys:
            values = [getattr(r, role)[key] for r in ratings]
            spread[f"{role}.{key}"] = (max(values) - min(values)) if values else None
    from prblib.stats import agreement

    rows = [row for row in rating_rows(campaign=campaign) if row["pair"] == pair.item.source_id]
    verdict = next(iter(agreement.validate_pairs(rows, keys, rubric_dimension=rubric_dimension(campaign),
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
