import markdown
import nh3
from django import forms
from django.contrib import messages
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from pipeline.domains import LABELS
from pipeline.models import Benchmark
from core.roles import ANNOTATOR, ROLE_GROUPS, role_required, staff_required

from . import api, selectors
from .models import Campaign
from .services.campaigns import (GUIDELINES_TEMPLATE, campaign_bounds, campaign_create, campaign_set_assignees,
                                 campaign_set_open, campaign_update_guidelines)
from .services.errors import NOT_ASSIGNED, AnnotationError
from .services.leases import assignment_unskip
from .services.ratings import MAX_ACTIVE_SECONDS, RESPONSE_KEYS, form_payload, rating_for_revision, rating_revise
from .services.reports import WeakerVerdicts, campaign_record_validation, campaign_report


def render_guidelines(text: str) -> str:
    """Markdown written by staff, sanitised before it reaches annotators' browsers."""
    return nh3.clean(markdown.markdown(text, extensions=["extra", "sane_lists"]))


annotator_required = role_required(ANNOTATOR, "Rating pairs needs the annotator role.")


@annotator_required
def campaign_list(request):
    """The annotator's queue: the open campaigns they may rate (assignees), with their
    progress, a link to their ratings and how many pairs they skipped."""
    return render(request, "annotation/campaigns.html", {"rows": selectors.annotator_queue(user=request.user)})


def _screen_context(campaign: Campaign) -> dict:
    return {"campaign": campaign, "guidelines_html": render_guidelines(campaign.guidelines),
            "max_active_seconds": MAX_ACTIVE_SECONDS}


@annotator_required
def annotate(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    if not campaign.is_open:  # an old link: say so on the app's own page
        return render(request, "annotation/closed.html", {"campaign": campaign}, status=410)
    if not selectors.campaign_open_to(user=request.user, campaign=campaign):
        raise PermissionDenied(NOT_ASSIGNED)
    return render(request, "annotation/annotate.html", _screen_context(campaign))


@annotator_required
def history(request, pk):
    campaign = get_object_or_404(selectors.defer_unread(Campaign.objects, campaign=""), pk=pk)
    rows = selectors.rating_history(user=request.user, campaign=campaign)
    for row in rows:  # values in the campaign's dimension order, for the table
        row["shown"] = [[row["ratings"][r].get(key) for key in campaign.dimension_keys] for r in ("1", "2")]
    return render(request, "annotation/history.html", {
        "campaign": campaign, "rows": rows, "dimensions": campaign.dimensions,
        "skipped": selectors.skipped_pairs(user=request.user, campaign=campaign)})


@require_POST
@annotator_required
def unskip(request, pk, token):
    """Undo a skip (from "Your ratings"): the pair comes back on the rating screen. A token of
    another campaign is a 404 before anything changes."""
    campaign = get_object_or_404(selectors.defer_unread(Campaign.objects, campaign=""), pk=pk)
    try:
        assignment_unskip(user=request.user, token=token, campaign_id=campaign.pk)
    except AnnotationError as exc:
        if exc.status == 404:
            raise Http404(str(exc)) from None
        messages.error(request, str(exc))
        return redirect("annotation:history", pk=campaign.pk)
    messages.success(request, "The skip is undone: the pair is the next one on the rating screen.")
    return redirect("annotation:history", pk=campaign.pk)


@annotator_required
def revise(request, pk, token):
    """Revise a rating on the rating screen itself (labels, keyboard, rubric), prefilled with
    the current rating. The screen posts form fields r<response>-<dimension> and comment with
    Accept: application/json and gets {"next"} or {"detail", "field"} back; a plain form post
    (no script) gets the history page or this page with the error."""
    campaign = get_object_or_404(selectors.defer_unread(Campaign.objects, campaign=""), pk=pk)
    wants_json = "application/json" in request.headers.get("Accept", "")
    errors = []
    if request.method == "POST":
        sent = form_payload(request.POST, campaign.dimension_keys)
        try:
            rating_revise(user=request.user, token=token, ratings=sent["ratings"], comment=sent["comment"],
                          campaign_id=campaign.pk)
        except AnnotationError as exc:
            if exc.status == 404:
                if wants_json:
                    return JsonResponse({"detail": str(exc)}, status=404)
                raise Http404(str(exc)) from None
            if wants_json:
                return JsonResponse({"detail": str(exc), **({"field": exc.field} if exc.field else {})},
                                    status=exc.status)
            errors.append(str(exc))
        else:
            messages.success(request, "Your revised rating is saved; the report uses it from now on.")
            if wants_json:
                return JsonResponse({"next": reverse("annotation:history", args=[campaign.pk])})
            return redirect("annotation:history", pk=campaign.pk)
    try:
        pair = rating_for_revision(user=request.user, token=token, campaign_id=campaign.pk)
    except AnnotationError as exc:
        if exc.status == 403:  # no longer assigned, or shown the pair's answer key: the reason on the 403 page
            raise PermissionDenied(str(exc)) from None
        raise Http404(str(exc)) from None
    if request.method == "POST":  # show what was sent (the values the screen can show), not the stored rating
        for response in RESPONSE_KEYS:
            for key, value in sent["ratings"][response].items():
                if isinstance(value, int) and 1 <= value <= 5:
                    pair["current"][response][key] = value
        pair["comment"] = request.POST.get("comment", pair["comment"])
    pair.pop("expires_at", None)
    return render(request, "annotation/annotate.html", {
        **_screen_context(campaign), "revise": pair, "errors": errors},
        status=400 if errors else 200)


class CampaignForm(forms.Form):
    """The API's CampaignCreateSerializer as a page: the same bounds (campaigns.campaign_bounds)."""

    benchmark = forms.ChoiceField()
    name = forms.CharField(required=False, max_length=120)
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 10}), help_text="Markdown.")
    overlap = forms.IntegerField(initial=3, **campaign_bounds("overlap"))
    target_per_annotator = forms.IntegerField(required=False, **campaign_bounds("target_per_annotator"))
    lease_minutes = forms.IntegerField(initial=30, **campaign_bounds("lease_minutes"))
    rubric_min_diff = forms.FloatField(initial=2.0, label="Valid pair: Personal Rubrics difference at least",
                                       **campaign_bounds("rubric_min_diff"))
    other_max_diff = forms.FloatField(initial=1.0, label="Valid pair: other dimensions differ by less than",
                                      **campaign_bounds("other_max_diff"))

    annotators = forms.ModelMultipleChoiceField(
        queryset=User.objects.none(), required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Only these annotators (and the groups below) see and rate it. None ticked: every annotator.")
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.none(), required=False,
                                            widget=forms.CheckboxSelectMultiple,
                                            help_text="Members of these groups may rate it too.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["benchmark"].choices = [(n, n) for n in Benchmark.objects.values_list("name", flat=True)]
        _assignee_fields(self)


def _assignee_fields(form: forms.Form) -> None:
    """Annotators to choose from: the annotator group's members; groups: every group but the
    role groups themselves (which name a role, not a team)."""
    form.fields["annotators"].queryset = User.objects.filter(groups__name=ANNOTATOR, is_active=True).order_by(
        "username").distinct()
    form.fields["annotators"].label_from_instance = lambda u: u.get_username()
    form.fields["groups"].queryset = Group.objects.exclude(name__in=ROLE_GROUPS).order_by("name")


GUIDELINE_SOURCES_SHOWN = 30  # campaigns offered to copy guidelines from, newest first


def _guideline_sources(exclude: int | None = None) -> list[tuple[str, str]]:
    """(value, label) for "start from": the template, then recent campaigns."""
    recent = Campaign.objects.exclude(pk=exclude).order_by("-created_at").values_list(
        "pk", "name", "benchmark__name")[:GUIDELINE_SOURCES_SHOWN]
    return [("template", "The template")] + [(str(pk), f"{name} ({bench})") for pk, name, bench in recent]


def _guidelines_from(source: str | None) -> str | None:
    """The guidelines text of a "start from" choice: the template or a campaign's; None if unknown."""
    if source == "template":
        return GUIDELINES_TEMPLATE
    if source and source.isdigit():
        return Campaign.objects.filter(pk=int(source)).values_list("guidelines", flat=True).first()
    return None


@staff_required
def campaign_new(request):
    """New campaign. Guidelines start from the template, or from another campaign's
    (?from=<id>); "Preview" shows them as annotators will see them, without creating anything."""
    source = request.GET.get("from")
    initial = {"guidelines": _guidelines_from(source) or GUIDELINES_TEMPLATE}
    if request.GET.get("benchmark"):
        initial["benchmark"] = request.GET["benchmark"]
    form = CampaignForm(request.POST or None, initial=initial)
    preview = None
    if request.method == "POST" and "preview" in request.POST:
        preview = render_guidelines(request.POST.get("guidelines", ""))
    elif request.method == "POST" and form.is_valid():
        try:
            campaign = campaign_create(user=request.user, **form.cleaned_data)
        except AnnotationError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            messages.success(request, f"Campaign '{campaign.name}' is open.")
            return redirect(campaign)
    return render(request, "annotation/campaign_new.html", {
        "form": form, "preview": preview, "sources": _guideline_sources(), "source": source or "template"})


class AssigneesForm(forms.Form):
    annotators = CampaignForm.base_fields["annotators"]
    groups = CampaignForm.base_fields["groups"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _assignee_fields(self)


@staff_required
def campaign_assignees(request, pk):
    """Who may rate a campaign: annotators and groups (none: every annotator)."""
    campaign = get_object_or_404(selectors.defer_unread(Campaign.objects.select_related("benchmark"), campaign=""),
                                 pk=pk)
    form = AssigneesForm(request.POST or None, initial={"annotators": list(campaign.assignees.all()),
                                                        "groups": list(campaign.assignee_groups.all())})
    if request.method == "POST" and form.is_valid():
        try:
            result = campaign_set_assignees(campaign=campaign, annotators=list(form.cleaned_data["annotators"]),
                                            groups=list(form.cleaned_data["groups"]))
        except AnnotationError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        else:
            if result["annotators"] or result["groups"]:
                who = f"{result['annotators']} annotator(s) and {result['groups']} group(s)"
                ended = f" {result['leases_ended']} lease(s) of others ended." if result["leases_ended"] else ""
                messages.success(request, f"'{campaign.name}' is now rated by {who} only.{ended}")
            else:
                messages.success(request, f"'{campaign.name}' is open to every annotator.")
            return redirect("annotation:campaigns")
    return render(request, "annotation/assignees.html", {"campaign": campaign, "form": form})


REPORT_FAILING_SHOWN = 50  # the rest behind "show all", so a large campaign's report stays quick

METHOD_LABELS = {
    "unit": "Unit of analysis", "ci": "Confidence intervals", "test": "Significance test",
    "zero_differences": "Zero differences", "effect_sizes": "Effect sizes", "agreement": "Agreement between annotators",
    "annotator_agreement": "Agreement of each annotator", "validation": "Validation rule", "gold": "Gold pairs",
    "position_bias": "Position bias",
}


@staff_required
def dashboard(request):
    return render(request, "annotation/dashboard.html", {"rows": selectors.campaign_dashboard()})


@staff_required
def report(request, pk):
    campaign = get_object_or_404(Campaign.objects.select_related("benchmark"), pk=pk)
    data = campaign_report(campaign=campaign)
    failing_all = [p for p in data["validation"]["pairs"] if not p["valid"]]
    shown = failing_all if request.GET.get("failing") == "all" else failing_all[:REPORT_FAILING_SHOWN]
    failing = [{**p, "sentences": selectors.validation_sentences(pair=p, campaign=campaign)} for p in shown]
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
    detail = selectors.campaign_pair_detail(campaign=campaign, pair_id=pair_id)
    if detail is None:
        raise Http404("No such pair in this campaign.")
    return render(request, "annotation/pair.html", {"campaign": campaign, "d": detail,
                                                    "dimensions": campaign.dimensions, "domain_labels": LABELS})


class GuidelinesForm(forms.Form):
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 18}), help_text="Markdown.")


@staff_required
def guidelines_edit(request, pk):
    """Edit a campaign's guidelines; ?from= starts from the template or another campaign's,
    "Preview" shows them as annotators will see them without saving."""
    campaign = get_object_or_404(Campaign, pk=pk)
    source = request.GET.get("from")
    form = GuidelinesForm(request.POST or None,
                          initial={"guidelines": _guidelines_from(source) or campaign.guidelines})
    preview = None
    if request.method == "POST" and "preview" in request.POST:
        preview = render_guidelines(request.POST.get("guidelines", ""))
    elif request.method == "POST" and form.is_valid():
        try:
            campaign_update_guidelines(campaign=campaign, guidelines=form.cleaned_data["guidelines"])
        except AnnotationError as exc:
            form.add_error("guidelines", str(exc))
        else:
            messages.success(request, f"Guidelines of '{campaign.name}' saved; annotators see them on their next pair.")
            return redirect("annotation:campaigns")
    return render(request, "annotation/guidelines_edit.html", {
        "campaign": campaign, "form": form, "preview": preview, "sources": _guideline_sources(exclude=campaign.pk),
        "source": source or ""})


@require_POST
@staff_required
def record_validation(request, pk):
    campaign = get_object_or_404(Campaign, pk=pk)
    try:
        counts = campaign_record_validation(campaign=campaign, confirm=request.POST.get("confirm") == "1")
    except WeakerVerdicts as exc:  # asks first: nothing was written
        return render(request, "annotation/record_confirm.html", {"campaign": campaign, "reason": str(exc)},
                      status=409)
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
    changed = campaign_set_open(campaign=campaign, is_open=is_open)
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


@staff_required
def export_skips(request, pk, fmt):
    return api.skips_export(get_object_or_404(Campaign, pk=pk), fmt)
