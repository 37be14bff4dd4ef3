"""The benchmark browser: server-rendered pages for researchers.

Item pages show the answer key (narrative, rubric aspects, which answer is chosen), so
every page here needs the researcher role (staff have it implicitly). Annotators rate
pairs blind and must never reach these pages.
"""

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from core.roles import RESEARCHER, role_required, staff_required
from core.validation import MAX_INT

from .domains import LABELS, SHORT_LABELS, SUBSET_TO_DOMAIN, domain_from_label
from .filters import BenchmarkItemFilter
from .blindness import per_pair_access, per_pair_withheld
from .build import BuildError, build_create, build_enqueue, build_resume
from .models import Benchmark, BenchmarkItem, BuildRun, Domain, LLMEndpoint

ITEMS_PER_PAGE = 25


# Columns the item table never shows; leaving them out keeps a page of long answers light.
_ITEM_LIST_DEFERRED = ("narrative", "rubric_aspects", "chosen", "rejected", "extra")


researcher_required = role_required(
    RESEARCHER, "The benchmark browser shows answer keys; it needs the researcher role.")


def _domain_count_key(domain: str) -> str:
    return f"n_{domain}"


@researcher_required
def benchmark_list(request):
    # One query for all rows: per-domain counts come from conditional aggregates.
    benchmarks = list(
        Benchmark.objects.defer("stats").annotate(**{
            _domain_count_key(value): Count("items", filter=Q(items__domain=value)) for value in Domain.values
        })
    )
    for benchmark in benchmarks:
        benchmark.domain_counts = [
            (label, getattr(benchmark, _domain_count_key(value))) for value, label in Domain.choices
        ]
    return render(request, "pipeline/benchmark_list.html", {
        "benchmarks": benchmarks,
        "domain_columns": [(SHORT_LABELS[value], label) for value, label in Domain.choices],
    })


def _stats_rows(stats: dict | None) -> list[tuple[str, dict]]:
    """Per-domain statistics in the fixed domain order, then the overall row."""
    if not stats:
        return []
    by_domain = stats.get("by_domain") or {}
    rows = [(label, by_domain[value]) for value, label in Domain.choices if value in by_domain]
    labels = dict(Domain.choices)
    rows += [(key, values) for key, values in sorted(by_domain.items()) if key not in labels]
    if stats.get("overall"):
        rows.append(("All domains", stats["overall"]))
    return rows


@researcher_required
def benchmark_detail(request, name):
    benchmark = get_object_or_404(Benchmark, name=name)
    # The item list (ids and questions, searchable over the answers) is per-pair data too:
    # withheld, with the reason, from whoever may rate the benchmark's pairs.
    withheld = per_pair_withheld(request.user, benchmark.pk)
    # Through the related manager each item already knows its benchmark, so the rows'
    # get_absolute_url() costs no query.
    items = benchmark.items.none() if withheld else benchmark.items.defer(*_ITEM_LIST_DEFERRED).order_by("position")
    item_filter = BenchmarkItemFilter(request.GET or None, queryset=items)
    page_obj = Paginator(item_filter.qs, ITEMS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "pipeline/benchmark_detail.html", {
        "benchmark": benchmark,
        "filter": item_filter,
        "page_obj": page_obj,
        "is_filtered": bool(item_filter.form.is_bound and any(
            item_filter.form.cleaned_data.get(field) for field in ("domain", "q"))),
        "stats_rows": _stats_rows(benchmark.stats),
        "metadata": sorted((benchmark.metadata or {}).items()),
        "per_pair_withheld": withheld,
    })


def _category_label(category: str) -> str:
    """A published subset name such as Art_and_Entertainment reads as its domain label;
    anything else is shown as written."""
    return LABELS.get(SUBSET_TO_DOMAIN.get(category, ""), category)


@researcher_required
def item_detail(request, name, pk):
    item = get_object_or_404(BenchmarkItem.objects.select_related("benchmark"), pk=pk, benchmark__name=name)
    withheld = per_pair_access(request.user, item.benchmark_id, what="benchmark item page", pair_key=item.pair_key)
    if withheld:
        raise PermissionDenied(withheld)
    siblings = BenchmarkItem.objects.filter(benchmark_id=item.benchmark_id).only("pk", "position")
    previous_item = siblings.filter(position__lt=item.position).order_by("-position").first()
    next_item = siblings.filter(position__gt=item.position).order_by("position").first()
    for sibling in (previous_item, next_item):
        if sibling is not None:
            sibling.benchmark = item.benchmark
    return render(request, "pipeline/item_detail.html", {
        "benchmark": item.benchmark,
        "item": item,
        "profile": [{**post, "category_label": _category_label(str(post.get("category") or ""))}
                    for post in item.profile if isinstance(post, dict)],
        # The source's category string only adds information when it is not just the domain.
        "show_category": bool(item.category) and domain_from_label(item.category) != item.domain,
        "rubric_aspects": [aspect for aspect in item.rubric_aspects if isinstance(aspect, dict)],
        "previous_item": previous_item,
        "next_item": next_item,
    })


# --- benchmark construction (staff) ----------------------------------------------------------

class BuildForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Name of the benchmark the build creates.")
    source_path = forms.CharField(max_length=500, help_text="LaMP-QA file or folder under the data folder.")
    domains = forms.MultipleChoiceField(choices=Domain.choices, required=False, widget=forms.CheckboxSelectMultiple)
    split = forms.CharField(required=False, max_length=40)
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_INT)  # as the API's BuildCreateSerializer
    profile_k = forms.IntegerField(initial=10, min_value=1, max_value=50, label="Profile posts (k)")
    retriever = forms.CharField(required=False, help_text="Empty: the bundled all-MiniLM-L6-v2.")
    generator = forms.ChoiceField(required=False)
    generator_model = forms.CharField(max_length=300)
    planner = forms.ChoiceField(required=False)
    planner_model = forms.CharField(required=False, max_length=300, help_text="Empty: no planner stage.")
    temperature = forms.FloatField(initial=0.7, min_value=0, max_value=2)
    seed = forms.IntegerField(initial=0, min_value=-MAX_INT, max_value=MAX_INT)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        endpoints = [("", "— local model folder —")] + [
            (n, n) for n in LLMEndpoint.objects.filter(enabled=True).values_list("name", flat=True)]
        self.fields["generator"].choices = self.fields["planner"].choices = endpoints


@staff_required
def build_list(request):
    form = BuildForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            build = build_create(user=request.user, **form.cleaned_data)
        except (BuildError, ValidationError) as exc:
            form.add_error(None, " ".join(getattr(exc, "messages", [str(exc)])))
        else:
            build_enqueue(build=build)
            return redirect(build)
    builds = BuildRun.objects.select_related("benchmark")[:50]
    return render(request, "pipeline/builds.html", {"form": form, "builds": builds})


@staff_required
def build_detail(request, pk):
    build = get_object_or_404(BuildRun.objects.select_related("benchmark", "chosen_template"), pk=pk)
    failed = build.items.exclude(error="").only("source_id", "error_stage", "error_reason", "error")[:200]
    return render(request, "pipeline/build_detail.html", {"build": build, "failed": failed,
                                                          "stages": ("retrieved", "generated", "planned")})


@require_POST
@staff_required
def build_resume_view(request, pk):
    build = get_object_or_404(BuildRun, pk=pk)
    try:
        build_resume(build=build, skip_failed=request.POST.get("skip_failed") == "1")
    except BuildError as exc:
        messages.error(request, str(exc))
    return redirect(build)
