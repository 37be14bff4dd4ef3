"""Benchmark health pages: the per-pair health table and summary (researchers and staff), its
CSV, and the staff actions it offers (a re-annotation campaign on selected or flagged pairs, a
new version without the pairs humans found invalid)."""

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from annotation.services.campaigns import campaign_bounds
from pipeline.models import Benchmark, Domain
from pipeline.blindness import per_pair_access
from pipeline.services import BenchmarkError, benchmark_without_invalid
from core import exports
from core.roles import RESEARCHER, role_required, staff_required

from . import health
from .services import health as service

PAIRS_PER_PAGE = 50
MAX_SELECTED = 100_000  # ticked pairs read from one form
# Annotators read these: they say nothing of why the pairs were picked (a hint such as "reward
# models disagree with the label" tells a rater which answer to doubt).
REANNOTATION_GUIDELINES = """# Rating pairs again

These pairs are being rated again to check the benchmark. Rate **each answer on its own**,
1 to 5, on every scale:

- **Factuality**: is it accurate?
- **Relevance**: does it answer the question asked?
- **Helpfulness**: would it help someone asking this?
- **Personal Rubrics**: does it meet *this person's* rubric aspects?

Nothing on the screen says which answer the benchmark prefers.
"""

researcher_required = role_required(RESEARCHER, "Benchmark health is for researchers and staff.")


def _benchmark_for(request, name: str) -> Benchmark:
    benchmark = get_object_or_404(Benchmark, name=name)
    # Every pair's results: withheld from raters while a campaign is open, and logged as a read of
    # every pair (pipeline/blindness.py), so whoever saw them cannot rate this benchmark blind later.
    withheld = per_pair_access(request.user, benchmark.pk, what="benchmark health page")
    if withheld:
        raise PermissionDenied(withheld)
    return benchmark


def _choice(value, choices):
    return value if value in choices else None


def _num(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _setting_cells(figures) -> tuple[str, str, str]:
    """(right/n, "(share; w weighted share)", discrimination) of one setting, as shown."""
    if not figures:
        return "—", "", "—"
    return (f"{figures['right']}/{figures['n']}", f"({_num(figures['share'])}; w {_num(figures['weighted_share'])})",
            _num(figures["discrimination"]))


def _change(change) -> str:
    return "—" if change is None else (f"▲ {change}" if change > 0 else f"▼ {-change}" if change < 0 else "=")


def _comparison_rows(rows):
    """Copies of leaderboard_without rows with their numbers as shown."""
    return [{**r, "accuracy_text": _num(r["accuracy"], 3), "without_text": _num(r["accuracy_without"], 3),
             "change_text": _change(r["rank_change"])} for r in rows]


@researcher_required
def health_page(request, name):
    """Per-pair health of a benchmark version (see leaderboard.health for every definition)."""
    benchmark = _benchmark_for(request, name)
    report = service.benchmark_health(benchmark=benchmark)
    flag = _choice(request.GET.get("flag"), service.FLAG_CHOICES)
    domain = _choice(request.GET.get("domain"), Domain.values)
    without = _choice(request.GET.get("without"), service.FLAG_CHOICES) or "any"
    rows = service.health_pairs(report, flag=flag, domain=domain)
    page = Paginator(rows, PAIRS_PER_PAGE).get_page(request.GET.get("page"))
    # The report's rows are shared (service.benchmark_health): shown copies, numbers formatted here
    # (a template filter per cell costs more).
    page.object_list = [{
        **row, "per_setting": [_setting_cells(row["settings"].get(s)) for s in report["settings"]],
        "ratio_text": _num(row["length_ratio"]), "gap_text": _num(row["gap"]),
        "flag_labels": [(f, health.FLAGS[f]["label"], row["flag_settings"].get(f) or []) for f in row["flags"]]}
        for row in page.object_list]
    params = request.GET.copy()
    params.pop("page", None)
    summary = report["summary"]
    comparison = summary["without"][without]
    return render(request, "leaderboard/health.html", {
        "benchmark": benchmark, "settings_shown": report["settings"], "computed_at": report["computed_at"],
        "cached": report["cached"], "summary": summary, "page": page, "flag": flag or "",
        "domain": domain or "", "without": without, "comparison": comparison,
        "comparison_tables": [(setting, _comparison_rows(rows)) for setting, rows in comparison["settings"].items()],
        "flags": [(k, v["label"], v["rule"], summary["by_flag"][k]) for k, v in health.FLAGS.items()],
        "definitions": list(report["definitions"].items()), "domains": Domain.choices,
        "spread": list(summary["spread"].items()), "query": params.urlencode(),
        "by_domain": _share_rows(summary["by_domain"], dict(Domain.choices)),
        "by_variant": _share_rows(summary["by_variant"], {}),
        "flag_names": list(health.FLAGS), "lineage": report["lineage"],
        "campaigns": _campaigns_from_health(benchmark) if request.user.is_staff else [],
    })


def _share_rows(groups, labels):
    """[(label, pairs, flagged, share, [count per flag in FLAGS order])] for a summary table."""
    return [(labels.get(key, key), g["pairs"], g["flagged"], g["share"], [g["by_flag"][f] for f in health.FLAGS])
            for key, g in groups.items()]


def _campaigns_from_health(benchmark):
    from annotation.models import Campaign

    return list(Campaign.objects.filter(benchmark=benchmark, origin__has_key="from").order_by("-created_at")
                .only("pk", "name", "is_open", "origin", "created_at"))


@researcher_required
def health_csv(request, name):
    """Every pair's health figures as CSV (one row per pair; columns in service.health_csv)."""
    benchmark = _benchmark_for(request, name)
    fields, rows = service.health_csv(service.benchmark_health(benchmark=benchmark))
    return exports.export_response(rows, fields=fields, fmt="csv", filename=f"{benchmark.name}-health")


class ReannotationForm(forms.Form):
    """A campaign's settings as on the new-campaign page (the same bounds), for the selected pairs."""

    name = forms.CharField(required=False, max_length=120)
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 12}), initial=REANNOTATION_GUIDELINES,
                                 help_text="Markdown, shown to the annotators: do not say why the pairs were "
                                           "picked (it tells them which answer to doubt).")
    overlap = forms.IntegerField(initial=3, **campaign_bounds("overlap"))
    lease_minutes = forms.IntegerField(initial=30, **campaign_bounds("lease_minutes"))
    rubric_min_diff = forms.FloatField(initial=2.0, label="Valid pair: Personal Rubrics difference at least",
                                       **campaign_bounds("rubric_min_diff"))
    other_max_diff = forms.FloatField(initial=1.0, label="Valid pair: other dimensions differ by less than",
                                      **campaign_bounds("other_max_diff"))


@staff_required
def reannotate(request, name):
    """Step 1 (POST from the health page, pairs ticked or a flag chosen): the campaign form for
    those pairs. Step 2 (POST with `confirm`): open the campaign on exactly those pairs."""
    benchmark = _benchmark_for(request, name)
    if request.method != "POST":
        return redirect(reverse("leaderboard:health", args=[benchmark.name]))
    by_flag = bool(request.POST.get("by_flag"))
    pairs = [] if by_flag else [p for p in request.POST.getlist("pair") if p][:MAX_SELECTED]
    flag = _choice(request.POST.get("flag"), service.FLAG_CHOICES) if not pairs else None
    form = ReannotationForm(request.POST if request.POST.get("confirm") else None)
    error = ""
    if not pairs and not flag:
        error = "Tick pairs in the table, or choose a flag, before opening a campaign."
    elif form.is_bound and form.is_valid():
        try:
            campaign = service.health_campaign_create(user=request.user, benchmark=benchmark, pairs=pairs, flag=flag,
                                                      **form.cleaned_data)
        except service.HealthRefused as exc:
            error = str(exc)
        else:
            messages.success(request, f"Campaign '{campaign.name}' is open on {campaign.pairs.count()} pairs.")
            return redirect("annotation:campaigns")
    report = service.benchmark_health(benchmark=benchmark)
    selected = pairs or ([r["id"] for r in service.health_pairs(report, flag=flag)] if flag else [])
    return render(request, "leaderboard/health_reannotate.html", {
        "benchmark": benchmark, "form": form, "pairs": pairs, "flag": flag or "", "selected": selected,
        "flag_label": health.FLAGS[flag]["label"] if flag in health.FLAGS else ("any flag" if flag else ""),
        "error": error}, status=400 if error else 200)


@staff_required
@require_POST
def cut_version(request, name):
    """A new frozen version of the benchmark without the pairs whose recorded verdict is invalid."""
    benchmark = _benchmark_for(request, name)
    try:
        created = benchmark_without_invalid(source=benchmark.name, name=request.POST.get("name", "").strip(),
                                            created_by=request.user)
    except BenchmarkError as exc:
        messages.error(request, f"No version cut: {exc}.")
        return redirect(reverse("leaderboard:health", args=[benchmark.name]))
    messages.success(request, f"Version '{created.name}' cut from '{benchmark.name}': "
                              f"{len(created.metadata.get('dropped_invalid', []))} invalid pairs left out, "
                              f"{created.item_count} kept.")
    return redirect(reverse("leaderboard:health", args=[created.name]))
