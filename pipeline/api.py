"""Read-only API over benchmarks and their items (researchers and staff: items carry the answer key)."""

import django_filters
from django.shortcuts import get_object_or_404
from rest_framework import mixins, serializers, viewsets

from prbench.permissions import IsResearcher

from .models import Benchmark, BenchmarkItem, Domain


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
        return benchmark.items.order_by("position")
