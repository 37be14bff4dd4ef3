"""Filters for the benchmark browser (server-rendered pages)."""

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from .models import BenchmarkItem, Domain


class BenchmarkItemFilter(django_filters.FilterSet):
    domain = django_filters.ChoiceFilter(choices=Domain.choices, empty_label="All domains")
    q = django_filters.CharFilter(
        method="filter_text", label="Search",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "Question text or source id"}),
    )

    class Meta:
        model = BenchmarkItem
        fields = ["domain"]

    def filter_text(self, queryset: QuerySet[BenchmarkItem], name: str, value: str) -> QuerySet[BenchmarkItem]:
        value = value.strip()
        if not value:
            return queryset
        return queryset.filter(Q(question__icontains=value) | Q(source_id__icontains=value))
