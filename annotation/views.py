import markdown
import nh3
from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
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
    campaigns = Campaign.objects.filter(is_open=True).select_related("benchmark")
    rows = [{"campaign": c, "progress": services.progress_for(user=request.user, campaign=c)} for c in campaigns]
    return render(request, "annotation/campaigns.html", {"rows": rows})


@annotator_required
def annotate(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk, is_open=True)
    return render(request, "annotation/annotate.html", {
        "campaign": campaign, "guidelines_html": render_guidelines(campaign.guidelines)})


class CampaignForm(forms.Form):
    benchmark = forms.ChoiceField()
    name = forms.CharField(required=False, max_length=120)
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 10}), help_text="Markdown.")
    overlap = forms.IntegerField(initial=3, min_value=1, max_value=20)
    target_per_annotator = forms.IntegerField(required=False, min_value=1)
    lease_minutes = forms.IntegerField(initial=30, min_value=1, max_value=1440)
    rubric_min_diff = forms.FloatField(initial=2.0, label="Valid pair: Personal Rubrics difference at least")
    other_max_diff = forms.FloatField(initial=1.0, label="Valid pair: other dimensions differ by less than")

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


@staff_required
def report(request, pk):
    campaign = get_object_or_404(Campaign.objects.select_related("benchmark"), pk=pk)
    data = services.campaign_report(campaign=campaign)
    return render(request, "annotation/report.html", {"campaign": campaign, "report": data,
                                                      "dimensions": campaign.dimensions, "domain_labels": LABELS})


@require_POST
@staff_required
def record_validation(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    counts = services.campaign_record_validation(campaign=campaign)
    messages.success(request, f"Recorded {counts['valid']} valid and {counts['invalid']} invalid pairs on "
                              f"{campaign.benchmark.name}; export them with --validated-only.")
    return redirect(campaign)


@require_POST
@staff_required
def toggle_open(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    Campaign.objects.filter(pk=pk).update(is_open=not campaign.is_open)
    return redirect(campaign)


@staff_required
def export(request, pk, fmt):
    return api.ratings_export(get_object_or_404(Campaign, pk=pk), fmt)
