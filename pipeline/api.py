"""Read-only API over benchmarks and their items (researchers and staff: items carry the answer key)."""

import django_filters
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response

from core.permissions import IsResearcher
from core.validation import MAX_INT

from .blindness import per_pair_access
from .models import Benchmark, BenchmarkItem, BuildRun, Domain


class BenchmarkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Benchmark
        fields = ("name", "description", "source", "content_hash", "metadata", "item_count", "stats",
                  "frozen_at", "created_at")


class BenchmarkItemSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="source_id")

    class Meta:
        model = BenchmarkItem
        fields = ("id", "position", "domain", "category", "question", "profile", "rubric_aspects", "narrative",
                  "chosen", "rejected")


class BenchmarkViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Benchmark.objects.all()
    serializer_class = BenchmarkSerializer
    permission_classes = [IsResearcher]
    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9][A-Za-z0-9._-]*"


class ItemFilter(django_filters.FilterSet):
    domain = django_filters.ChoiceFilter(choices=Domain.choices)

    class Meta:
        model = BenchmarkItem
        fields = ["domain"]


class BenchmarkItemViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = BenchmarkItemSerializer
    permission_classes = [IsResearcher]
    filterset_class = ItemFilter
    queryset = BenchmarkItem.objects.none()  # for schema generation; get_queryset narrows by benchmark

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return BenchmarkItem.objects.none()
        benchmark = get_object_or_404(Benchmark, name=self.kwargs["benchmark_name"])
        withheld = per_pair_access(self.request.user, benchmark.pk, what="benchmark items API")
        if withheld:
            raise PermissionDenied(withheld)
        return benchmark.items.order_by("position")


class BuildSerializer(serializers.ModelSerializer):
    # None until the build made its benchmark, and where no endpoint was named.
    benchmark = serializers.CharField(source="benchmark.name", default=None, allow_null=True)
    generator = serializers.CharField(source="generator.name", default=None, allow_null=True)
    planner = serializers.CharField(source="planner.name", default=None, allow_null=True)

    class Meta:
        model = BuildRun
        fields = ("id", "name", "status", "counts", "progress_text", "tokens", "error", "source_path", "domains", "split", "limit",
                  "profile_k", "retriever", "generator", "generator_model", "planner", "planner_model", "benchmark",
                  "created_at", "finished_at")


class BuildCreateSerializer(serializers.Serializer):
    """Bounded as the BuildRun columns are: bad input is a 400 naming the field, never a database error."""

    name = serializers.CharField(max_length=100)
    source_path = serializers.CharField(max_length=500)
    generator_model = serializers.CharField(max_length=300)
    generator = serializers.CharField(required=False, allow_blank=True, default="", max_length=50)
    planner = serializers.CharField(required=False, allow_blank=True, default="", max_length=50)
    planner_model = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    domains = serializers.ListField(child=serializers.ChoiceField(choices=Domain.choices), required=False, default=list,
                                    max_length=len(Domain.choices))
    split = serializers.CharField(required=False, allow_blank=True, default="", max_length=40)
    limit = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1, max_value=MAX_INT)
    profile_k = serializers.IntegerField(required=False, default=10, min_value=1, max_value=50)
    retriever = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    temperature = serializers.FloatField(required=False, default=0.7, min_value=0, max_value=2)
    seed = serializers.IntegerField(required=False, default=0, min_value=-MAX_INT, max_value=MAX_INT)


class BuildViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Benchmark builds from LaMP-QA (staff): per-stage progress, create, resume."""

    lookup_value_regex = r"[0-9]+"  # anything else is a 404, never a ValueError
    queryset = BuildRun.objects.select_related("benchmark", "generator", "planner")
    serializer_class = BuildSerializer
    permission_classes = [IsAdminUser]

    @extend_schema(request=BuildCreateSerializer, responses={201: BuildSerializer})
    def create(self, request):
        from .build import BuildError, build_create, build_enqueue

        data = BuildCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            build = build_create(user=request.user, **data.validated_data)
        except (BuildError, ValidationError) as exc:
            return Response({"detail": " ".join(getattr(exc, "messages", [str(exc)]))}, status=400)
        build_enqueue(build=build)
        return Response(BuildSerializer(build).data, status=201)

    @extend_schema(request=None, responses={200: BuildSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        from .build import BuildError, build_resume

        build = self.get_object()
        try:
            build_resume(build=build, skip_failed=bool(request.data.get("skip_failed")))
        except BuildError as exc:
            return Response({"detail": str(exc)}, status=409)
        build.refresh_from_db()
        return Response(BuildSerializer(build).data)
