import markdown
import nh3
from django import forms
from django.contrib import messages

from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from pipeline.domains import LABELS
from pipeline.models import Benchmark
from prbench.roles import ANNOTATOR, role_required, staff_required

from . import api, services
from .models import Campaign


def render_guidelines(text: str) -> str:
    """Markdown written by staff, sanitised before it reaches annotators' browsers."""
    return nh3.clean(markdown.markdown(text, extensions=["extra", "sane_lists"]))


annotator_required = role_required(ANNOTATOR, "Rating pairs needs the annotator role.")


@annotator_required
def campaign_list(request):
    campaigns = services.defer_unread(Campaign.objects.filter(is_open=True).select_related("benchmark"),
                                      campaign="")
    rows = [{"campaign": c, "progress": services.progress_for(user=request.user, campaign=c)} for c in campaigns]
    return render(request, "annotation/campaigns.html", {"rows": rows})


@annotator_required
def annotate(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    if not campaign.is_open:  # an old link: say so on the app's own page
        return render(request, "annotation/closed.html", {"campaign": campaign}, status=410)
    return render(request, "annotation/annotate.html", {
        "campaign": campaign, "guidelines_html": render_guidelines(campaign.guidelines),
        "max_active_seconds": services.MAX_ACTIVE_SECONDS})


@annotator_required
def history(request, pk):
    campaign = get_object_or_404(services.defer_unread(Campaign.objects, campaign=""), pk=pk)
    rows = services.rating_history(user=request.user, campaign=campaign)
    for row in rows:  # values in the campaign's dimension order, for the table
        row["shown"] = [[row["ratings"][r].get(key) for key in campaign.dimension_keys] for r in ("1", "2")]
    return render(request, "annotation/history.html", {"campaign": campaign, "rows": rows,
                                                       "dimensions": campaign.dimensions})


@annotator_required
def revise(request, pk, token):
    campaign = get_object_or_404(services.defer_unread(Campaign.objects, campaign=""), pk=pk)
    errors = []
    if request.method == "POST":
        given = {response: {d["key"]: _int_or_none(request.POST.get(f"r{response}-{d['key']}"))
                            for d in campaign.dimensions} for response in services.RESPONSE_KEYS}
        try:
            services.rating_revise(user=request.user, token=token, ratings=given,
                                   comment=request.POST.get("comment", ""))
        except services.AnnotationError as exc:
            if exc.status == 404:
                raise Http404(str(exc)) from None
            errors.append(str(exc))
        else:
            messages.success(request, "Your revised rating is saved; the report uses it from now on.")
            return redirect("annotation:history", pk=campaign.pk)
    try:
        pair = services.rating_for_revision(user=request.user, token=token)
    except services.AnnotationError as exc:
        raise Http404(str(exc)) from None
    if pair["campaign"]["id"] != campaign.pk:
        raise Http404("No such rating in this campaign.")
    for response in pair["responses"]:
        current = pair["current"][response["key"]]
        response["fields"] = [{"key": d["key"], "label": d.get("label", d["key"]),
                               "current": str(request.POST.get(f"r{response['key']}-{d['key']}")
                                              or current.get(d["key"]))} for d in campaign.dimensions]
    return render(request, "annotation/revise.html", {"campaign": campaign, "pair": pair, "errors": errors,
                                                      "scale": ("1", "2", "3", "4", "5")},
                  status=400 if errors else 200)


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class CampaignForm(forms.Form):
    """The API's CampaignCreateSerializer as a page: the same bounds (services.campaign_bounds)."""

    benchmark = forms.ChoiceField()
    name = forms.CharField(required=False, max_length=120)
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 10}), help_text="Markdown.")
    overlap = forms.IntegerField(initial=3, **services.campaign_bounds("overlap"))
    target_per_annotator = forms.IntegerField(required=False, **services.campaign_bounds("target_per_annotator"))
    lease_minutes = forms.IntegerField(initial=30, **services.campaign_bounds("lease_minutes"))
    rubric_min_diff = forms.FloatField(initial=2.0, label="Valid pair: Personal Rubrics difference at least",
                                       **services.campaign_bounds("rubric_min_diff"))
    other_max_diff = forms.FloatField(initial=1.0, label="Valid pair: other dimensions differ by less than",
                                      **services.campaign_bounds("other_max_diff"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["benchmark"].choices = [(n, n) for n in Benchmark.objects.values_list("name", flat=True)]


@staff_required
def campaign_new(request):
    form = CampaignForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            campaign = services.campaign_create(user=request.user, **form.cleaned_data)
        except services.AnnotationError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            messages.success(request, f"Campaign '{campaign.name}' is open.")
            return redirect(campaign)
    return render(request, "annotation/campaign_new.html", {"form": form})


REPORT_FAILING_SHOWN = 50  # the rest behind "show all", so a large campaign's report stays quick

METHOD_LABELS = {
    "unit": "Unit of analysis", "ci": "Confidence intervals", "test": "Significance test",
    "zero_differences": "Zero differences", "effect_sizes": "Effect sizes", "agreement": "Agreement between annotators",
    "annotator_agreement": "Agreement of each annotator", "validation": "Validation rule", "gold": "Gold pairs",
    "position_bias": "Position bias",
}


@staff_required
def dashboard(request):
    return render(request, "annotation/dashboard.html", {"rows": services.campaign_dashboard()})


@staff_required
def report(request, pk):
    campaign = get_object_or_404(Campaign.objects.select_related("benchmark"), pk=pk)
    data = services.campaign_report(campaign=campaign)
    failing_all = [p for p in data["validation"]["pairs"] if not p["valid"]]
    shown = failing_all if request.GET.get("failing") == "all" else failing_all[:REPORT_FAILING_SHOWN]
    failing = [{**p, "sentences": services.validation_sentences(pair=p, campaign=campaign)} for p in shown]
    method = [(METHOD_LABELS.get(key, key.replace("_", " ").capitalize()), text)
              for key, text in data["method"].items()]
    return render(request, "annotation/report.html", {
        "campaign": campaign, "report": data, "failing": failing, "failing_total": len(failing_all),
        "method": method,
        # The charts need only these; the per-pair list stays out of the page's JSON.
        "chart_data": {"dimensions": data["dimensions"], "distribution": data["distribution"]},
        "pair_base": reverse("annotation:pair", args=[campaign.pk, "x"])[:-2],
        "rubric_label": {d["key"]: d.get("label", d["key"]) for d in campaign.dimensions}.get(
            data["validation"]["rubric_dimension"], data["validation"]["rubric_dimension"]),
        "dimensions": campaign.dimensions, "domain_labels": LABELS})


@staff_required
def pair_detail(request, pk, pair_id):
    campaign = get_object_or_404(Campaign.objects.select_related("benchmark"), pk=pk)
    try:
        detail = services.campaign_pair_detail(campaign=campaign, pair_id=pair_id)
    except services.AnnotationError as exc:
        raise Http404(str(exc)) from None
    return render(request, "annotation/pair.html", {"campaign": campaign, "d": detail,
                                                    "dimensions": campaign.dimensions, "domain_labels": LABELS})


class GuidelinesForm(forms.Form):
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 18}), help_text="Markdown.")


@staff_required
def guidelines_edit(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    form = GuidelinesForm(request.POST or None, initial={"guidelines": campaign.guidelines})
    if request.method == "POST" and form.is_valid():
        try:
            services.campaign_update_guidelines(campaign=campaign, guidelines=form.cleaned_data["guidelines"])
        except services.AnnotationError as exc:
            form.add_error("guidelines", str(exc))
        else:
            messages.success(request, f"Guidelines of '{campaign.name}' saved; annotators see them on their next pair.")
            return redirect("annotation:campaigns")
    return render(request, "annotation/guidelines_edit.html", {"campaign": campaign, "form": form})


@require_POST
@staff_required
def record_validation(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    counts = services.campaign_record_validation(campaign=campaign)
    messages.success(request, f"Recorded {counts['valid']} valid and {counts['invalid']} invalid pairs on "
                              f"{campaign.benchmark.name} (shown in its benchmark browser); export them with "
                              f"--validated-only.")
    return redirect(campaign)


@require_POST
@staff_required
def set_open(request, pk, is_open: bool | None = None):
    """Close or reopen a campaign: explicit operations, never a toggle, so two staff pressing
    Close at once both leave it closed (the second is a no-op). The former /toggle/ URL takes
    the operation as action=close|reopen and refuses a request without one."""
    campaign = get_object_or_404(Campaign, pk=pk)
    if is_open is None:
        action = request.POST.get("action", "")
        if action not in ("close", "reopen"):
            return HttpResponseBadRequest("Say action=close or action=reopen; this URL no longer flips the state.",
                                          content_type="text/plain")
        is_open = action == "reopen"
    changed = services.campaign_set_open(campaign=campaign, is_open=is_open)
    name = campaign.name
    if is_open:
        messages.success(request, f"Campaign '{name}' is open again; annotators can rate its pairs." if changed
                         else f"Campaign '{name}' was already open.")
    else:
        messages.success(request, f"Campaign '{name}' is closed; open leases were ended and annotators can no "
                                  f"longer rate or revise. Reopen it here at any time." if changed
                         else f"Campaign '{name}' was already closed.")
    return redirect("annotation:campaigns" if request.POST.get("next") == "dashboard" else campaign)


@staff_required
def export(request, pk, fmt):
    return api.ratings_export(get_object_or_404(Campaign, pk=pk), fmt)
