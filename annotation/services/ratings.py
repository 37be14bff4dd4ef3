"""Ratings: the one typed rating payload, submit, revision and drafts.

What an annotator sends for a pair is a `RatingPayload` (pydantic): per shown response ("1",
"2") a whole number from 1 to 5 for every dimension of the campaign (by default Factuality,
Relevance, Helpfulness and Personal Rubrics), a comment, a flag reason and the active seconds.
A `Draft` is the same payload not yet sent (any subset of the ratings, and the flag toggle).
The API's body (`RatingIn`, the payload plus the assignment token), the rating page's revision
form (`form_payload`) and the draft API all reach the same model, validated once, inside the
service, once the campaign (its dimensions) is known: a bad value gets one sentence naming the
field (`"ratings.1.relevance: must be a whole number from 1 to 5."`, `field` the same path), the
same on every door.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import BooleanField, ExpressionWrapper, OuterRef
from django.db.models.functions import Coalesce
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from core.schema import NO_NUL, NO_NUL_NOT_ONLY_WHITESPACE
from pipeline.blindness import pair_read_exists, per_pair_read_exists
from prblib.rows import Number, RowError, Text, check_text

from ..models import Assignment, Rating, RatingRevision
from ..selectors import by_position, defer_unread, open_to, progress_for, progress_of
from .errors import NOT_ASSIGNED, AnnotationError
from .leases import (Lease, annotator_role, assignment_payload, count_of, own_assignment, refuse_if_read,
                     require_still_assigned, take_slot)

RESPONSE_KEYS = ("1", "2")
# The most active seconds one rating may record: 4 hours (the page's clock counts only time with
# the tab visible and touched in the last minute, and stops here; static/js/annotate.js).
# More is refused (400), not capped, so the time reports sum stays what annotators really spent.
MAX_ACTIVE_SECONDS = 4 * 3600
# The longest comment and flag reason (the rating screen's text boxes stop there too).
COMMENT_MAX, FLAG_REASON_MAX = 5000, 2000

# --- the payload ---------------------------------------------------------------------------------

_SCORES_SCHEMA = {"type": "object", "description": "{dimension: a whole number from 1 to 5}.",
                  "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 5}}
_RATINGS_SCHEMA = {"type": "object", "properties": {"1": _SCORES_SCHEMA, "2": _SCORES_SCHEMA},
                   "additionalProperties": False}

Score = Annotated[int, Field(strict=True, ge=1, le=5)]
Scores = dict[Literal["1", "2"], dict[str, Score]]


def _text_schema(max_length: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "maxLength": max_length, "pattern": NO_NUL})


def _openapi(schema: dict[str, Any]) -> None:
    """The model's JSON schema as the OpenAPI document shows it: no generated titles."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)


class RatingPayload(BaseModel):
    """One annotator's rating of one pair, by shown position. `ratings` must hold every
    dimension of the campaign for both responses (checked against the `dimensions` the
    validation context names); `check` validates and raises AnnotationError."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_openapi)
    any_subset: ClassVar[bool] = False  # a draft: any subset of the ratings

    ratings: Annotated[Scores, WithJsonSchema({
        **_RATINGS_SCHEMA, "required": list(RESPONSE_KEYS),
        "description": 'Per shown response ("1", "2"): {dimension: 1-5} for every dimension of the campaign.'})]
    comment: Annotated[Text(COMMENT_MAX), _text_schema(COMMENT_MAX)] = ""
    flag_reason: Annotated[Text(FLAG_REASON_MAX), _text_schema(FLAG_REASON_MAX)] = ""
    seconds: Annotated[Number(low=0, high=MAX_ACTIVE_SECONDS, optional=True), WithJsonSchema({
        "type": "number", "minimum": 0, "maximum": MAX_ACTIVE_SECONDS, "nullable": True,
        "description": "Active seconds spent on the pair (optional)."})] = None

    @model_validator(mode="after")
    def _every_dimension(self, info):
        dimensions = (info.context or {}).get("dimensions")
        if dimensions is None:
            return self
        for response in RESPONSE_KEYS:
            given = self.ratings.get(response)
            if given is None and not self.any_subset:
                raise _refused("response", f"ratings.{response}", response)
            missing = [] if self.any_subset else [key for key in dimensions if key not in given]
            if missing:
                raise _refused("score", f"ratings.{response}.{missing[0]}")
            unknown = sorted(set(given or {}) - set(dimensions))
            if unknown:
                raise _refused("unknown_dimensions", f"ratings.{response}", ", ".join(unknown))
        return self

    @classmethod
    def check(cls, data: dict[str, Any], *, dimensions: list[str], prefix: str = ""):
        """`data` validated for a campaign with these dimension keys. Errors: AnnotationError 400
        with one sentence naming the field (`prefix` + its path, e.g. "draft.ratings.1.relevance")."""
        try:
            check_text(data)  # NUL and lone surrogates: no database stores them
        except RowError as exc:
            where = prefix + (exc.field or "")
            raise AnnotationError(f"{where or 'payload'}: {exc.reason}.", field=where or None) from None
        try:
            return cls.model_validate(data, context={"dimensions": list(dimensions)})
        except ValidationError as exc:
            raise _refusal(exc, prefix) from None

    def by_role(self, assignment: Assignment) -> tuple[dict[str, int], dict[str, int]]:
        """(chosen, rejected): the ratings by role, from the order `assignment` showed the answers in."""
        return by_role(assignment, self.ratings)


class RatingIn(RatingPayload):
    """The API's rating body: the payload plus the assignment it is for (the token `next` gave;
    an unknown one is a 404). Other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    assignment: Annotated[str, WithJsonSchema({"type": "string", "minLength": 1,
                                               "pattern": NO_NUL_NOT_ONLY_WHITESPACE})]


class Draft(RatingPayload):
    """Unsent work on a pair: any subset of the ratings, the comment, the flag toggle and its
    reason, the seconds so far. Unknown keys are refused."""

    any_subset: ClassVar[bool] = True

    ratings: Annotated[Scores, WithJsonSchema({
        **_RATINGS_SCHEMA, "description": 'Per shown response ("1", "2"): {dimension: 1-5}, any subset.'})] = {}
    flag: Annotated[StrictBool, WithJsonSchema({"type": "boolean"})] = False


class SavedDraft(Draft):
    """A stored draft as the API returns it: when it was saved (ISO 8601)."""

    saved_at: Annotated[str, WithJsonSchema({"type": "string", "format": "date-time", "readOnly": True})]


# The sentence for each kind of refusal, from the field's path (`where`) and a detail.
_SENTENCES = {
    "score": "{where}: must be a whole number from 1 to 5.",
    "response": "{where}: rate response {detail}.",
    "response_type": "{where} must be an object {{dimension: 1-5}}.",
    "ratings": '{where} must be an object keyed by response "1" and "2".',
    "unknown_responses": "{where}: unknown response key(s) {detail}.",
    "unknown_dimensions": "{where}: unknown dimension(s) {detail}.",
    "unknown_keys": "{where}: unknown key(s) {detail}.",
    "seconds": "{where} must be a number from 0 to " + str(MAX_ACTIVE_SECONDS) + " (4 hours of active time): {detail}.",
    "flag": "{where} must be true or false.",
    "text": "{where}: {detail}.",
}


def _refused(kind: str, where: str, detail: str = "") -> PydanticCustomError:
    return PydanticCustomError("rating_payload", "{where}", {"kind": kind, "where": where, "detail": detail})


def _kind_of(error: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, path, detail) of one pydantic error of a RatingPayload."""
    if error["type"] == "rating_payload":
        ctx = error["ctx"]
        return ctx["kind"], ctx["where"], ctx["detail"]
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        return "unknown_keys", "", loc[-1]
    field, detail = loc[0], str(error.get("ctx", {}).get("error", error["msg"]))
    if field == "ratings":
        if loc[-1] == "[key]":  # a key that is not "1" or "2" (or, from Python, a dimension that is no string)
            return ("unknown_responses", "ratings", loc[1]) if len(loc) == 3 else (
                "unknown_dimensions", ".".join(loc[:2]), loc[2])
        if len(loc) == 1:
            return "ratings", "ratings", ""
        if len(loc) == 2:
            return "response_type", ".".join(loc), loc[1]
        return "score", ".".join(loc[:3]), ""
    if field == "seconds":
        return "seconds", field, detail
    if field == "flag":
        return "flag", field, ""
    return "text", field, "expected a string, got null" if detail == "missing field" else detail


def _refusal(exc: ValidationError, prefix: str) -> AnnotationError:
    """The first error of `exc` as one AnnotationError sentence (unknown keys and response keys
    listed together)."""
    errors = exc.errors(include_url=False)
    kind, where, detail = _kind_of(errors[0])
    if kind in ("unknown_keys", "unknown_responses"):
        detail = ", ".join(sorted({k[2] for k in map(_kind_of, errors) if k[0] == kind}))
    where = prefix + where if where else prefix.rstrip(".") or "payload"
    return AnnotationError(_SENTENCES[kind].format(where=where, detail=detail), field=where)


def form_payload(post, dimensions: list[str]) -> dict[str, Any]:
    """A payload from the rating page's form fields (r<response>-<dimension>, comment): a digit
    string is read as its number, anything else is passed on as sent, for the model to refuse."""
    def number(value):
        return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value

    ratings = {response: {key: number(post[f"r{response}-{key}"]) for key in dimensions
                          if f"r{response}-{key}" in post} for response in RESPONSE_KEYS}
    return {"ratings": ratings, "comment": post.get("comment", "")}


def by_role(assignment: Assignment, ratings: dict[str, dict[str, int]]) -> tuple[dict, dict]:
    """(chosen, rejected) from ratings keyed by shown position."""
    first, second = ratings["1"], ratings["2"]
    return (first, second) if assignment.chosen_first else (second, first)


def _check(data: dict[str, Any], dimensions: list[str]) -> RatingPayload:
    """The payload of a submit or revision, validated (the one place both do it)."""
    return RatingPayload.check(data, dimensions=dimensions)


# --- submit and revise -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitResult:
    rating: Rating
    created: bool
    progress: dict[str, int]


def rating_submit(*, user: AbstractBaseUser, token: str, ratings: Any, seconds: Any = None, comment: Any = "",
                  flag_reason: Any = "") -> SubmitResult:
    """Store one annotator's ratings of one pair, by role. Idempotent: a repeated submit
    returns the first rating (revisions go through `rating_revise`). A late submit after
    the lease expired is accepted while the pair has room, else refused with 409 (the
    client keeps the draft). The lease moves to SUBMITTED by a conditional UPDATE, so a
    concurrent sweep either expires it first (then a slot must be won back) or not at all.
    `ratings`, `seconds`, `comment` and `flag_reason` are checked as one RatingPayload.

    Statements: 5 (assignment with its rating, progress and role; BEGIN; status update;
    insert; COMMIT); a pair's `taken` already counts submitted ratings, so nothing else
    changes. With token auth a request makes 6.
    A lease on a pair whose answer key the annotator was shown since it was leased (the
    rules of `assignment_next`: leases.refuse_if_read) is refused with 403 and released.
    Errors: AnnotationError 400 (field named), 403 (role, assignees, answer key shown), 404
    (not yours), 409 (skipped, closed, lease ran out and the pair is full)."""
    done_sq = count_of(Assignment.objects.filter(campaign=OuterRef("campaign"), annotator=user,
                                                 status=Assignment.Status.SUBMITTED))
    assignment = defer_unread(Assignment.objects.select_related("campaign", "pair", "rating")
                              .annotate(done=Coalesce(done_sq, 0), annotator_role=annotator_role(user),
                                        open_to_me=ExpressionWrapper(open_to(user, "campaign_id"),
                                                                     output_field=BooleanField()),
                                        read_its_pairs=per_pair_read_exists(user, "campaign__benchmark_id"),
                                        pair_read=pair_read_exists(user))
                              .filter(token=str(token), annotator=user), campaign="campaign", pair="pair").first()
    if assignment is None:
        raise AnnotationError("No such assignment.", status=404, field="assignment")
    campaign = assignment.campaign
    existing = getattr(assignment, "rating", None)
    if existing is not None:
        return SubmitResult(existing, False, progress_of(campaign, assignment.done))
    if not (user.is_staff or assignment.annotator_role):
        raise AnnotationError("Annotating needs the annotator role.", status=403)
    if not (user.is_staff or assignment.open_to_me):
        raise AnnotationError(NOT_ASSIGNED, status=403)
    if assignment.read_its_pairs or assignment.pair_read:  # shown its answer key after it was leased
        refuse_if_read(user, assignment)
    payload = _check({"ratings": ratings, "seconds": seconds, "comment": comment, "flag_reason": flag_reason},
                     campaign.dimension_keys)
    if assignment.status == Assignment.Status.SKIPPED:
        raise AnnotationError("You skipped this pair.", status=409)
    if not campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)
    chosen, rejected = payload.by_role(assignment)
    # The draft goes in the same UPDATE: a submitted pair keeps none.
    mark = {"status": Assignment.Status.SUBMITTED, "flagged": bool(payload.flag_reason), "draft": None,
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
                if not take_slot(assignment.pair_id, campaign.overlap):
                    raise AnnotationError("Your time on this pair ran out and enough people have rated it since; "
                                          "your draft is kept.", status=409)
                mine.update(**mark)
            rating = Rating.objects.create(
                assignment=assignment, campaign=campaign, item_id=assignment.pair.item_id, annotator=user,
                chosen=chosen, rejected=rejected, comment=payload.comment, flag_reason=payload.flag_reason,
                seconds=payload.seconds)
    except (IntegrityError, _StoredMeanwhile):  # a concurrent repeat of the same submit stored it first
        return SubmitResult(Rating.objects.get(assignment=assignment), False, progress_for(user=user, campaign=campaign))
    return SubmitResult(rating, True, progress_of(campaign, assignment.done + 1))


class _StoredMeanwhile(Exception):
    """Inside rating_submit: a concurrent repeat of the same submit stored the rating first."""


def rating_revise(*, user: AbstractBaseUser, token: str, ratings: Any, comment: Any = None,
                  campaign_id: int | None = None) -> Rating:
    """An annotator changes their own rating while the campaign is open, still names them and
    they have not been shown the pair's answer key since (leases.refuse_if_read). The earlier
    version is kept as a RatingRevision; the Rating holds the latest, which reports use.
    `ratings` is keyed by the shown position ("1", "2") like a submit, checked with `comment`
    (None: the comment stays) as one RatingPayload; `campaign_id`: the campaign the token must
    belong to (a page's URL), checked before anything changes.
    Errors: AnnotationError 404 (not yours / not in that campaign / not rated yet), 400 (field
    named), 403 (no longer assigned, or shown the answer key), 409 (closed)."""
    assignment = own_assignment(user, token, campaign_id)
    rating = Rating.objects.filter(assignment=assignment).first()
    if rating is None:
        raise AnnotationError("You have not rated this pair yet.", status=404, field="assignment")
    if not assignment.campaign.is_open:
        raise AnnotationError("This campaign is closed; ratings can no longer be revised.", status=409)
    require_still_assigned(user, assignment.campaign)
    refuse_if_read(user, assignment)
    payload = _check({"ratings": ratings, "comment": rating.comment if comment is None else comment},
                     assignment.campaign.dimension_keys)
    chosen, rejected = payload.by_role(assignment)
    if chosen == rating.chosen and rejected == rating.rejected and payload.comment == rating.comment:
        return rating
    with transaction.atomic():
        RatingRevision.objects.create(rating=rating, chosen=rating.chosen, rejected=rating.rejected,
                                      comment=rating.comment, flag_reason=rating.flag_reason, seconds=rating.seconds,
                                      rated_at=rating.revised_at or rating.created_at)
        rating.chosen, rating.rejected, rating.comment, rating.revised_at = (chosen, rejected, payload.comment,
                                                                             timezone.now())
        rating.save(update_fields=["chosen", "rejected", "comment", "revised_at"])
    return rating


def rating_for_revision(*, user: AbstractBaseUser, token: str, campaign_id: int | None = None) -> dict[str, Any]:
    """The blind pair as this annotator saw it, with their current ratings by shown position.
    Errors: AnnotationError 404 (not yours / not in campaign `campaign_id` / not rated), 403
    (no longer assigned, or shown the pair's answer key since: `rating_revise` would refuse).
    A lease it finds read is released, so this is a service, not a selector."""
    assignment = own_assignment(user, token, campaign_id)
    rating = Rating.objects.filter(assignment=assignment).first()
    if rating is None:
        raise AnnotationError("You have not rated this pair yet.", status=404, field="assignment")
    require_still_assigned(user, assignment.campaign)
    refuse_if_read(user, assignment)
    payload = assignment_payload(lease=Lease(assignment, {}))
    payload.update(current=by_position(assignment, rating), comment=rating.comment,
                   is_open=assignment.campaign.is_open)
    return payload


# --- drafts ----------------------------------------------------------------------------------------

def draft_save(*, user: AbstractBaseUser, token: str, draft: Any) -> dict[str, Any]:
    """Store the annotator's unsent work on a pair they hold (a live or expired lease), by
    shown position, checked as a Draft (fields named "draft.<path>"); returns it with
    `saved_at` (ISO 8601). Nothing in it says which answer is which: it is what the annotator
    typed. Errors: AnnotationError 400 (field named), 404 (not yours), 403 (no longer assigned,
    or shown the pair's answer key since: a submit would be refused), 409 (rated, skipped or
    closed)."""
    assignment = own_assignment(user, token)
    if not isinstance(draft, dict):
        raise AnnotationError("draft must be an object.", field="draft")
    clean = Draft.check(draft, dimensions=assignment.campaign.dimension_keys, prefix="draft.").model_dump()
    clean["ratings"] = {response: clean["ratings"].get(response, {}) for response in RESPONSE_KEYS}
    if not assignment.campaign.is_open:
        raise AnnotationError("This campaign is closed.", status=409)
    require_still_assigned(user, assignment.campaign)
    refuse_if_read(user, assignment)
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
