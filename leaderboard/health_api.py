"""Benchmark health API: the report (researchers and staff, withheld from raters while a blind
campaign on the benchmark is open), and the staff actions of the health page."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation.services.campaigns import campaign_bounds
from pipeline.models import Benchmark, Domain
from pipeline.blindness import per_pair_access
from pipeline.services import BenchmarkError, benchmark_without_invalid
from core.permissions import IsResearcher
from core.validation import JSONBodyParser, query_choice, query_int

from .services import health as service

API_PAGE_SIZE = 500
_OBJECT = {"type": "object", "additionalProperties": True}
HEALTH_ANSWER = {"type": "object", "required": [
    "benchmark", "key", "computed_at", "cached", "settings", "results", "summary", "flags", "definitions", "lineage",
    "count", "page", "pages", "pairs"], "properties": {
    "benchmark": {"type": "string"}, "key": {"type": "string"}, "computed_at": {"type": "string"},
    "cached": {"type": "boolean"}, "settings": {"type": "array", "items": {"type": "string"}},
    "results": _OBJECT, "summary": _OBJECT, "flags": _OBJECT, "definitions": _OBJECT, "lineage": _OBJECT,
    "count": {"type": "integer"}, "page": {"type": "integer"}, "pages": {"type": "integer"},
    "pairs": {"type": "array", "items": _OBJECT}}}


def _benchmark(request, name: str) -> Benchmark:
    benchmark = get_object_or_404(Benchmark, name=name)
    # Every pair's results: withheld from raters while a campaign is open, and logged as a read of
    # every pair (pipeline/blindness.py), so whoever saw them cannot rate this benchmark blind later.
    withheld = per_pair_access(request.user, benchmark.pk, what="benchmark health API")
    if withheld:
        raise PermissionDenied(withheld)
    return benchmark


def _refused(message: str, field: str | None = None, code: int = 400) -> Response:
    body = {"detail": message}
    if field:
        body["field"] = field
    return Response(body, status=code)


class BenchmarkHealthView(APIView):
    """Per-pair health of a benchmark version with its summary (every figure defined under
    `definitions`, every flag's rule under `flags`); pairs in benchmark order, API_PAGE_SIZE a
    page, filtered by `flag` and `domain`."""

    permission_classes = [IsResearcher]

    @extend_schema(parameters=[
        OpenApiParameter("flag", str, enum=list(service.FLAG_CHOICES), description="Only pairs with this flag "
                                                                                     "('any': at least one)."),
        OpenApiParameter("domain", str, enum=Domain.values),
        OpenApiParameter("page", {"type": "integer", "minimum": 1, "maximum": 1_000_000}, description="From 1.")],
        responses={200: OpenApiResponse(HEALTH_ANSWER, description="The health report.")})
    def get(self, request, name):
        p = request.query_params
        flag = query_choice(p, "flag", service.FLAG_CHOICES)
        domain = query_choice(p, "domain", Domain.values)
        page = query_int(p, "page", low=1, high=1_000_000) or 1
        benchmark = _benchmark(request, name)
        report = service.benchmark_health(benchmark=benchmark)
        rows = service.health_pairs(report, flag=flag, domain=domain)
        pages = max(1, -(-len(rows) // API_PAGE_SIZE))
        shown = rows[(page - 1) * API_PAGE_SIZE: page * API_PAGE_SIZE]
        return Response({**{k: report[k] for k in ("benchmark", "key", "computed_at", "cached", "settings", "results",
                                                    "summary", "flags", "definitions", "lineage")},
                         "count": len(rows), "page": page, "pages": pages, "pairs": shown})


class HealthCampaignSerializer(serializers.Serializer):
    pairs = serializers.ListField(child=serializers.CharField(max_length=200), required=False, default=list,
                                  max_length=100_000, help_text="Source ids of the pairs to re-annotate.")
    flag = serializers.ChoiceField(choices=list(service.FLAG_CHOICES), required=False, allow_null=True, default=None,
                                   help_text="Every pair carrying this flag ('any': at least one), when `pairs` is "
                                             "empty.")
    guidelines = serializers.CharField(max_length=100_000)
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=120)
    overlap = serializers.IntegerField(default=3, **campaign_bounds("overlap"))
    lease_minutes = serializers.IntegerField(required=False, default=30, **campaign_bounds("lease_minutes"))
    rubric_min_diff = serializers.FloatField(required=False, default=2.0, **campaign_bounds("rubric_min_diff"))
    other_max_diff = serializers.FloatField(required=False, default=1.0, **campaign_bounds("other_max_diff"))


CAMPAIGN_ANSWER = {"type": "object", "required": ["id", "name", "benchmark", "pairs", "origin"], "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "benchmark": {"type": "string"},
    "pairs": {"type": "integer"}, "origin": _OBJECT}}


class HealthCampaignView(APIView):
    """Staff open a re-annotation campaign on exactly the given pairs (or every pair with a flag);
    the campaign records where its pairs came from (`origin`)."""

    permission_classes = [IsAdminUser]
    parser_classes = [JSONBodyParser]

    @extend_schema(request=HealthCampaignSerializer,
                   responses={201: OpenApiResponse(CAMPAIGN_ANSWER, description="The campaign opened.")})
    def post(self, request, name):
        data = HealthCampaignSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        benchmark = _benchmark(request, name)
        try:
            campaign = service.health_campaign_create(user=request.user, benchmark=benchmark, **data.validated_data)
        except service.HealthRefused as exc:
            return _refused(str(exc), exc.field, exc.status)
        return Response({"id": campaign.pk, "name": campaign.name, "benchmark": benchmark.name,
                         "pairs": campaign.pairs.count(), "origin": campaign.origin}, status=status.HTTP_201_CREATED)


class HealthVersionSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="The new version's name.")


VERSION_ANSWER = {"type": "object", "required": ["name", "item_count", "derived_from", "dropped_invalid"],
                  "properties": {"name": {"type": "string"}, "item_count": {"type": "integer"},
                                 "derived_from": {"type": "string"},
                                 "dropped_invalid": {"type": "array", "items": {"type": "string"}}}}


class HealthVersionView(APIView):
    """Staff cut a new frozen version of the benchmark without the pairs whose recorded human
    verdict is invalid (pairs never validated are kept); its metadata holds the lineage."""

    permission_classes = [IsAdminUser]
    parser_classes = [JSONBodyParser]

    @extend_schema(request=HealthVersionSerializer,
                   responses={201: OpenApiResponse(VERSION_ANSWER, description="The new version.")})
    def post(self, request, name):
        data = HealthVersionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        benchmark = _benchmark(request, name)
        try:
            created = benchmark_without_invalid(source=benchmark.name, name=data.validated_data["name"],
                                                created_by=request.user)
        except BenchmarkError as exc:
            return _refused(str(exc), "name")
        return Response({"name": created.name, "item_count": created.item_count, "derived_from": benchmark.name,
                         "dropped_invalid": created.metadata["dropped_invalid"]}, status=status.HTTP_201_CREATED)

