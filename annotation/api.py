"""Annotation API: the JSON payloads of the rating screen and campaigns (README, "Human validation"; schema at /api/schema/); logic lives in services."""


from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import (OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field,
                                   inline_serializer)
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission, IsAdminUser, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from core import exports
from core.permissions import IsAnnotator
from core.validation import JSONBodyParser

from . import selectors
from .models import Campaign
from .services.campaigns import campaign_bounds, campaign_create
from .services.errors import AnnotationError
from .services.leases import assignment_next, assignment_payload, assignment_skip, assignment_unskip
from .services.ratings import Draft, RatingIn, SavedDraft, draft_delete, draft_get, draft_save, rating_submit
from .services.reports import campaign_report


def error_response(exc: AnnotationError) -> Response:
    body = {"detail": str(exc)}
    if exc.field:
        body["field"] = exc.field
    return Response(body, status=exc.status)


def invalid_response(serializer: serializers.Serializer) -> Response:
    """400 {"detail": "field: reason", "field": field} for the first invalid field."""
    field, messages = next(iter(serializer.errors.items()))
    message = messages[0] if isinstance(messages, list) else messages
    return Response({"detail": f"{field}: {message}", "field": field}, status=400)


class IsStaffOrAnnotatorReading(BasePermission):
    def has_permission(self, request, view):
        if request.method == "GET":
            return IsAnnotator().has_permission(request, view)
        return bool(request.user and request.user.is_staff)


class CampaignSerializer(serializers.ModelSerializer):
    """A campaign; `annotators` is filled for staff only (pass the request in the context)."""

    benchmark = serializers.CharField(source="benchmark.name")
    annotators = serializers.SerializerMethodField()
    groups = serializers.SlugRelatedField(source="assignee_groups", slug_field="name", many=True, read_only=True,
                                          help_text="Groups whose members may rate it.")

    class Meta:
        model = Campaign
        fields = ("id", "name", "benchmark", "overlap", "guidelines", "dimensions", "target_per_annotator",
                  "lease_minutes", "rubric_min_diff", "other_max_diff", "is_open", "created_at", "annotators",
                  "groups")

    @extend_schema_field({"type": "array", "items": {"type": "string"}, "nullable": True,
                          "description": "Usernames of the annotators who may rate it, with `groups` (both empty: "
                                         "every annotator). Staff only: null for everyone else, who is not told "
                                         "who else rates a campaign."})
    def get_annotators(self, campaign):
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            return None
        return [user.username for user in campaign.assignees.all()]


class CampaignCreateSerializer(serializers.Serializer):
    """Bounded as the Campaign columns are (campaigns.CAMPAIGN_BOUNDS, shared with the page's form):
    bad input is a 400 naming the field, never a database error."""

    benchmark = serializers.CharField(max_length=100)
    overlap = serializers.IntegerField(default=3, **campaign_bounds("overlap"))
    guidelines = serializers.CharField(max_length=100_000)
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=120)
    dimensions = serializers.ListField(child=serializers.DictField(), required=False, default=None, max_length=20)
    target_per_annotator = serializers.IntegerField(required=False, allow_null=True, default=None,
                                                    **campaign_bounds("target_per_annotator"))
    lease_minutes = serializers.IntegerField(required=False, default=30, **campaign_bounds("lease_minutes"))
    rubric_min_diff = serializers.FloatField(required=False, default=2.0, **campaign_bounds("rubric_min_diff"))
    other_max_diff = serializers.FloatField(required=False, default=1.0, **campaign_bounds("other_max_diff"))
    gold = serializers.ListField(child=serializers.DictField(), required=False, default=None, max_length=100_000)
    annotators = serializers.ListField(child=serializers.CharField(max_length=150), required=False, default=None,
                                       max_length=10_000, help_text="Usernames of the annotators who may rate it "
                                                                    "(with `groups`; both empty: every annotator).")
    groups = serializers.ListField(child=serializers.CharField(max_length=150), required=False, default=None,
                                   max_length=1000, help_text="Groups whose members may rate it.")


class CampaignsView(APIView):
    """Campaigns: annotators list the open ones (without who else rates them: `annotators` is
    null); staff list all, with their assignees, and create (a JSON body: its dimensions and
    gold pairs are objects, which a form cannot carry)."""

    permission_classes = [IsAuthenticated, IsStaffOrAnnotatorReading]
    parser_classes = [JSONBodyParser]

    @extend_schema(responses=CampaignSerializer(many=True))
    def get(self, request):
        campaigns = selectors.campaigns_listed_for(user=request.user)
        return Response(CampaignSerializer(campaigns, many=True, context={"request": request}).data)

    @extend_schema(request=CampaignCreateSerializer, responses={201: CampaignSerializer})
    def post(self, request):
        data = CampaignCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            campaign = campaign_create(user=request.user, **data.validated_data)
        except AnnotationError as exc:
            return error_response(exc)
        return Response(CampaignSerializer(campaign, context={"request": request}).data,
                        status=status.HTTP_201_CREATED)


NEXT_RESPONSE = inline_serializer("NextPair", {
    "assignment": serializers.CharField(), "question": serializers.CharField(),
    "profile": serializers.ListField(child=serializers.DictField()),
    "rubric": serializers.ListField(child=serializers.DictField()),
    "responses": serializers.ListField(child=serializers.DictField()),
    "dimensions": serializers.ListField(child=serializers.DictField()),
    "progress": serializers.DictField(), "expires_at": serializers.CharField(),
    "campaign": serializers.DictField(),
})


class NextView(APIView):
    """The next pair for this annotator (blind), or 204 when no work is left for them. The
    annotator role is checked by the service, in the query it makes anyway."""

    permission_classes = [IsAuthenticated]

    @extend_schema(parameters=[OpenApiParameter("campaign", int, required=True)],
                   responses={200: NEXT_RESPONSE, 204: OpenApiResponse(description="No work left for you."),
                              400: OpenApiResponse(description="campaign is not a number; `field` names it."),
                              403: OpenApiResponse(description="Needs the annotator role, the campaign is "
                                                               "assigned to others, or you were shown per-pair "
                                                               "results of its benchmark."),
                              404: OpenApiResponse(description="No such campaign."),
                              409: OpenApiResponse(description="The campaign is closed.")})
    def get(self, request):
        try:
            lease = assignment_next(user=request.user, campaign_id=request.query_params.get("campaign"))
        except AnnotationError as exc:
            return error_response(exc)
        if lease is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(assignment_payload(lease=lease))


class RatingsView(APIView):
    """Submit ratings for a pair: 201 the first time, 200 for a repeat (never a second rating).
    The annotator role is checked by the service, in the query it makes anyway. A JSON body:
    `ratings` is an object, which a form cannot carry."""

    permission_classes = [IsAuthenticated]
    parser_classes = [JSONBodyParser]

    @extend_schema(request=RatingIn, responses={
        201: inline_serializer("RatingStored", {"id": serializers.IntegerField(), "progress": serializers.DictField()}),
        400: OpenApiResponse(description="Invalid ratings; `field` names the field."),
        403: OpenApiResponse(description="Needs the annotator role, the campaign is assigned to others, or you "
                                         "were shown the pair's answer key since it was leased (the lease is "
                                         "released)."),
        404: OpenApiResponse(description="No such assignment of yours (also when none is given)."),
        409: OpenApiResponse(description="The lease ran out and the pair is full; keep the draft.")})
    def post(self, request):
        body = request.data  # a JSON object (JSONBodyParser); the service checks it as a RatingPayload
        try:
            result = rating_submit(user=request.user, token=body.get("assignment", ""), ratings=body.get("ratings"),
                                   seconds=body.get("seconds"), comment=body.get("comment", ""),
                                   flag_reason=body.get("flag_reason", ""))
        except AnnotationError as exc:
            return error_response(exc)
        return Response({"id": result.rating.pk, "progress": result.progress},
                        status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


class SkipInSerializer(serializers.Serializer):
    # Blank values reach the service, which answers with its own message ("Say why you skip this pair.").
    assignment = serializers.CharField(max_length=200, allow_blank=True, default="")
    reason = serializers.CharField(max_length=2000, allow_blank=True, default="")
    flag = serializers.BooleanField(default=False)


class SkipView(APIView):
    """Skip or flag a pair with a reason; it is not offered to you again."""

    permission_classes = [IsAnnotator]

    @extend_schema(request=SkipInSerializer,
                   responses={200: inline_serializer("Skipped", {"status": serializers.CharField()})})
    def post(self, request):
        data = SkipInSerializer(data=request.data)
        if not data.is_valid():
            return invalid_response(data)
        v = data.validated_data
        try:
            assignment = assignment_skip(user=request.user, token=v["assignment"], reason=v["reason"],
                                                  flag=v["flag"])
        except AnnotationError as exc:
            return error_response(exc)
        return Response({"status": assignment.status})


class SkipUndoInSerializer(serializers.Serializer):
    assignment = serializers.CharField(max_length=200)


class SkipUndoView(APIView):
    """Undo a skip while the campaign is open: the pair is offered to you again (after the
    pair you hold now)."""

    permission_classes = [IsAnnotator]

    @extend_schema(request=SkipUndoInSerializer, responses={
        200: inline_serializer("Unskipped", {"status": serializers.CharField()}),
        400: OpenApiResponse(description="No assignment given; `field` names it."),
        403: OpenApiResponse(description="Needs the annotator role, the campaign is assigned to others, or you "
                                         "were shown the pair's answer key since."),
        404: OpenApiResponse(description="Not your assignment."),
        409: OpenApiResponse(description="Not skipped, the campaign is closed, or the pair is full.")})
    def post(self, request):
        data = SkipUndoInSerializer(data=request.data)
        if not data.is_valid():
            return invalid_response(data)
        try:
            assignment = assignment_unskip(user=request.user, token=data.validated_data["assignment"])
        except AnnotationError as exc:
            return error_response(exc)
        return Response({"status": assignment.status})


class DraftView(APIView):
    """Your unsent work on a pair you hold, kept on the server so any browser restores it; a
    submit or skip clears it. Responses by shown position only."""

    permission_classes = [IsAnnotator]
    parser_classes = [JSONBodyParser]

    @extend_schema(responses={200: SavedDraft, 204: OpenApiResponse(description="No draft stored."),
                              403: OpenApiResponse(description="Needs the annotator role."),
                              404: OpenApiResponse(description="Not your assignment.")})
    def get(self, request, token):
        try:
            draft = draft_get(user=request.user, token=token)
        except AnnotationError as exc:
            return error_response(exc)
        return Response(draft) if draft is not None else Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=Draft, responses={
        200: SavedDraft, 400: OpenApiResponse(description="An invalid draft; `field` names the field."),
        403: OpenApiResponse(description="Needs the annotator role, the campaign is assigned to others, or you "
                                         "were shown the pair's answer key since it was leased."),
        404: OpenApiResponse(description="Not your assignment."),
        409: OpenApiResponse(description="Rated, skipped or closed.")})
    def put(self, request, token):
        try:
            draft = draft_save(user=request.user, token=token, draft=request.data)
        except AnnotationError as exc:
            return error_response(exc)
        return Response(draft)

    @extend_schema(responses={204: OpenApiResponse(description="Forgotten."),
                              403: OpenApiResponse(description="Needs the annotator role."),
                              404: OpenApiResponse(description="Not your assignment.")})
    def delete(self, request, token):
        try:
            draft_delete(user=request.user, token=token)
        except AnnotationError as exc:
            return error_response(exc)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ReportView(APIView):
    """The campaign's validation report (staff)."""

    permission_classes = [IsAdminUser]

    @extend_schema(responses={200: OpenApiResponse(description="Report: per-dimension means and CIs, Wilcoxon, "
                                                               "effect sizes, agreement, validation.")})
    def get(self, request, pk):
        return Response(campaign_report(campaign=get_object_or_404(Campaign, pk=pk)))


EXPORT_FIELDS = ("annotator", "pair", "domain", "role", "dimension", "value", "position", "seconds", "comment",
                 "flag_reason", "created_at", "revised_at")


def ratings_export(campaign: Campaign, fmt: str) -> StreamingHttpResponse:
    return exports.export_response(selectors.rating_rows(campaign=campaign), fields=EXPORT_FIELDS, fmt=fmt,
                                   filename=f"prbench-campaign-{campaign.pk}-ratings")


def skips_export(campaign: Campaign, fmt: str) -> StreamingHttpResponse:
    return exports.export_response(selectors.skip_rows(campaign=campaign), fields=selectors.SKIP_FIELDS, fmt=fmt,
                                   filename=f"prbench-campaign-{campaign.pk}-skips")


class _CampaignExportView(exports.JSONErrorsMixin, APIView):
    """One campaign's rows as JSON lines or CSV (staff); `export(campaign, fmt)` builds the response."""

    permission_classes = [IsAdminUser]
    renderer_classes = exports.EXPORT_RENDERERS
    export = None

    @extend_schema(parameters=[OpenApiParameter("format", str, enum=list(exports.FORMATS),
                                                description="jsonl (default) or csv")],
                   responses=exports.EXPORT_SCHEMA_RESPONSES)
    def get(self, request, pk):
        return type(self).export(get_object_or_404(Campaign, pk=pk), request.accepted_renderer.format)


class SkipsExportView(_CampaignExportView):
    """Skipped pairs (staff): one row per annotator and pair, with the reason and the flag."""

    export = staticmethod(skips_export)


class RatingsExportView(_CampaignExportView):
    """All ratings in long format (staff): one row per annotator, pair, role and dimension."""

    export = staticmethod(ratings_export)
