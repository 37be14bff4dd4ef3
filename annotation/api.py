"""Annotation API. Payloads follow DESIGN.md; logic lives in services."""

import csv
import json

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission, IsAdminUser, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from prbench.permissions import IsAnnotator

from . import services
from .models import Campaign


def error_response(exc: services.AnnotationError) -> Response:
    body = {"detail": str(exc)}
    if exc.field:
        body["field"] = exc.field
    return Response(body, status=exc.status)


class IsStaffOrAnnotatorReading(BasePermission):
    def has_permission(self, request, view):
        if request.method == "GET":
            return IsAnnotator().has_permission(request, view)
        return bool(request.user and request.user.is_staff)


class CampaignSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.name")

    class Meta:
        model = Campaign
        fields = ("id", "name", "benchmark", "overlap", "guidelines", "dimensions", "target_per_annotator",
                  "lease_minutes", "rubric_min_diff", "other_max_diff", "is_open", "created_at")


class CampaignCreateSerializer(serializers.Serializer):
    benchmark = serializers.CharField()
    overlap = serializers.IntegerField(default=3)
    guidelines = serializers.CharField()
    name = serializers.CharField(required=False, allow_blank=True, default="")
    dimensions = serializers.ListField(child=serializers.DictField(), required=False, default=None)
    target_per_annotator = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    lease_minutes = serializers.IntegerField(required=False, default=30, min_value=1, max_value=24 * 60)
    rubric_min_diff = serializers.FloatField(required=False, default=2.0)
    other_max_diff = serializers.FloatField(required=False, default=1.0)
    gold = serializers.ListField(child=serializers.DictField(), required=False, default=None)


class CampaignsView(APIView):
    """Campaigns: annotators list the open ones; staff list all and create."""

    permission_classes = [IsAuthenticated, IsStaffOrAnnotatorReading]

    @extend_schema(responses=CampaignSerializer(many=True))
    def get(self, request):
        campaigns = Campaign.objects.select_related("benchmark")
        if not request.user.is_staff:
            campaigns = campaigns.filter(is_open=True)
        return Response(CampaignSerializer(campaigns, many=True).data)

    @extend_schema(request=CampaignCreateSerializer, responses={201: CampaignSerializer})
    def post(self, request):
        data = CampaignCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            campaign = services.campaign_create(user=request.user, **data.validated_data)
        except services.AnnotationError as exc:
            return error_response(exc)
        return Response(CampaignSerializer(campaign).data, status=status.HTTP_201_CREATED)


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
                              403: OpenApiResponse(description="Needs the annotator role."),
                              404: OpenApiResponse(description="No such campaign."),
                              409: OpenApiResponse(description="The campaign is closed.")})
    def get(self, request):
        try:
            lease = services.assignment_next(user=request.user, campaign_id=request.query_params.get("campaign"))
        except services.AnnotationError as exc:
            return error_response(exc)
        if lease is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(services.assignment_payload(lease=lease))


class RatingInSerializer(serializers.Serializer):
    assignment = serializers.CharField()
    ratings = serializers.JSONField()
    seconds = serializers.JSONField(required=False, default=None)
    comment = serializers.CharField(required=False, allow_blank=True, default="")
    flag_reason = serializers.CharField(required=False, allow_blank=True, default="")


class RatingsView(APIView):
    """Submit ratings for a pair: 201 the first time, 200 for a repeat (never a second rating).
    The annotator role is checked by the service, in the query it makes anyway."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=RatingInSerializer, responses={
        201: inline_serializer("RatingStored", {"id": serializers.IntegerField(), "progress": serializers.DictField()}),
        400: OpenApiResponse(description="Invalid ratings; `field` names the field."),
        409: OpenApiResponse(description="The lease ran out and the pair is full; keep the draft.")})
    def post(self, request):
        data = RatingInSerializer(data=request.data)
        if not data.is_valid():
            field, messages = next(iter(data.errors.items()))
            return Response({"detail": f"{field}: {messages[0]}", "field": field}, status=400)
        v = data.validated_data
        try:
            result = services.rating_submit(user=request.user, token=v["assignment"], ratings=v["ratings"],
                                            seconds=v["seconds"], comment=v["comment"], flag_reason=v["flag_reason"])
        except services.AnnotationError as exc:
            return error_response(exc)
        return Response({"id": result.rating.pk, "progress": result.progress},
                        status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


class SkipView(APIView):
    """Skip or flag a pair with a reason; it is not offered to you again."""

    permission_classes = [IsAnnotator]

    @extend_schema(request=inline_serializer("Skip", {"assignment": serializers.CharField(),
                                                      "reason": serializers.CharField(),
                                                      "flag": serializers.BooleanField(default=False)}),
                   responses={200: inline_serializer("Skipped", {"status": serializers.CharField()})})
    def post(self, request):
        try:
            assignment = services.assignment_skip(user=request.user, token=str(request.data.get("assignment", "")),
                                                  reason=str(request.data.get("reason", "")),
                                                  flag=bool(request.data.get("flag", False)))
        except services.AnnotationError as exc:
            return error_response(exc)
        return Response({"status": assignment.status})


class ReportView(APIView):
    """The campaign's validation report (staff)."""

    permission_classes = [IsAdminUser]

    @extend_schema(responses={200: OpenApiResponse(description="Report: per-dimension means and CIs, Wilcoxon, "
                                                               "effect sizes, agreement, validation.")})
    def get(self, request, pk):
        return Response(services.campaign_report(campaign=get_object_or_404(Campaign, pk=pk)))


EXPORT_FIELDS = ("annotator", "pair", "domain", "role", "dimension", "value", "position", "seconds", "comment",
                 "flag_reason", "created_at", "revised_at")


class _Echo:
    def write(self, value):
        return value


def ratings_export(campaign: Campaign, fmt: str) -> StreamingHttpResponse:
    rows = services.rating_rows(campaign=campaign)
    if fmt == "csv":
        writer = csv.DictWriter(_Echo(), fieldnames=EXPORT_FIELDS)
        body = (writer.writerow(r) for r in _header_then(rows))
        response = StreamingHttpResponse(body, content_type="text/csv")
    else:
        response = StreamingHttpResponse((json.dumps(r) + "\n" for r in rows), content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="prbench-campaign-{campaign.pk}-ratings.{fmt}"'
    return response


def _header_then(rows):
    yield dict(zip(EXPORT_FIELDS, EXPORT_FIELDS))
    yield from rows


class RatingsExportView(APIView):
    """All ratings in long format (staff): one row per annotator, pair, role and dimension."""

    permission_classes = [IsAdminUser]

    @extend_schema(parameters=[OpenApiParameter("format", str, enum=["csv", "jsonl"])],
                   responses={(200, "text/csv"): str, (200, "application/x-ndjson"): str})
    def get(self, request, pk):
        fmt = "csv" if request.query_params.get("format") == "csv" else "jsonl"
        return ratings_export(get_object_or_404(Campaign, pk=pk), fmt)
