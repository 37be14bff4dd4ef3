import csv
import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from pipeline.domains import LAMP_QA_DOMAINS, SHORT_LABELS
from pipeline.models import Benchmark, Domain
from prbench.roles import RESEARCHER, role_required
from prbench.uploads import upload_refusal

from . import selectors, services
from .forms import SubmissionForm
from .models import EvaluationRun, Kind, PairScore, Setting, Submission


researcher_required = role_required(
    RESEARCHER, "Submitting and inspecting reward models needs the researcher role.")


def leaderboard(request):
    params = request.GET
    benchmarks = list(Benchmark.objects.filter(submissions__runs__status="SUCCEEDED")
                      .filter(selectors.visibility_filter(request.user, "submissions__")).distinct()
                      .values_list("name", flat=True))
    benchmark = params.get("benchmark") or (benchmarks[0] if benchmarks else None)
    filters = {
        "benchmark": benchmark,
        "kind": params.get("kind") if params.get("kind") in Kind.values else None,
        "setting": params.get("setting") if params.get("setting") in Setting.values else None,
        "domain": params.get("domain") if params.get("domain") in Domain.values else None,
    }
    sort = params.get("sort", "accuracy")
    descending = params.get("order", "desc") != "asc"
    tables = selectors.leaderboard_tables(**filters, sort=sort, descending=descending, viewer=request.user)
    rows = [row for table in tables for row in table["rows"]]
    return render(request, "leaderboard/leaderboard.html", {
        "tables": tables, "rows": rows, "filters": filters, "benchmarks": benchmarks, "sort": sort,
        "descending": descending,
        "kinds": Kind.choices, "settings_choices": Setting.choices, "domains": Domain.choices,
        "domain_columns": _domain_columns(rows),
        "recent_benchmarks": Benchmark.objects.all()[:5],
    })


def _domain_columns(rows) -> list[tuple[str, str, str]]:
    """Per-domain columns for the domains the listed results have (LaMP-QA's three by default)."""
    present = {d for row in rows for d in row["by_domain"]} or set(LAMP_QA_DOMAINS)
    return [(value, SHORT_LABELS[value], label) for value, label in Domain.choices if value in present]


@researcher_required
def submit(request):
    status = 200
    if request.method == "POST":
        form = SubmissionForm(request.POST, request.FILES)
        refusal = upload_refusal(request)
        if refusal is not None:
            form.is_valid()
            form.add_error(refusal[0] if refusal[0] in form.fields else None, refusal[1])
            status = 413
        elif form.is_valid():
            data = form.cleaned_data
            try:
                submission = services.submission_create(user=request.user, request=services.SubmissionRequest(
                    display_name=data["display_name"], benchmark=data["benchmark"], kind=data["kind"],
                    settings=tuple(data["settings"]), model_path=data["model_path"],
                    judge_backend=data["judge_backend"], scores_file=data["scores_file"], dtype=data["dtype"],
                    max_length=data["max_length"], batch_size=data["batch_size"], profile_k=data["profile_k"],
                    parameters=data["parameters"], license=data["license"], link=data["link"],
                    options=_kind_options(data)))
            except services.SubmissionRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                messages.success(request, f"Submitted '{submission.display_name}': queued for evaluation.")
                return redirect(submission)
    else:
        form = SubmissionForm()
    from pipeline.ml.options import OPTIONS, options_doc

    return render(request, "leaderboard/submit.html", {
        "form": form, "kind_options": [(kind, Kind(kind).label, options_doc(kind)) for kind in OPTIONS]},
        status=status)


def _kind_options(data: dict):
    """The options JSON, plus P-GenRM's own fields when that kind is chosen (the service
    checks the result against the kind's schema)."""
    options = data.get("options")
    if options in (None, ""):
        options = {}
    if data["kind"] == Kind.PGENRM and isinstance(options, dict):
        options = {**options}
        for key in ("m", "n", "prototypes"):
            if data.get(key) not in (None, ""):
                options[key] = data[key]
    return options


def submission_detail(request, pk):
    """Public for a published submission; its owner and staff only otherwise (404 to others)."""
    submission = get_object_or_404(selectors.submissions_visible_to(request.user)
                                   .select_related("benchmark", "owner", "judge_backend"), pk=pk)
    runs = list(submission.runs.all())
    return render(request, "leaderboard/submission.html", {
        "submission": submission, "runs": runs, "can_act": services.can_act(request.user, submission),
        "domains": [(v, label) for v, _, label in _domain_columns(
            [{"by_domain": (r.metrics or {}).get("by_domain") or {}} for r in runs])],
        "has_judge": any((r.metrics or {}).get("judge") for r in runs),
        "outcomes": submission.outcomes.filter(domain="").order_by("kind", "policy", "k"),
        "scaling": [{"setting": r.get_setting_display(), "points": r.metrics["scaling"]}
                    for r in runs if (r.metrics or {}).get("scaling")],
        "chart": [{"setting": r.get_setting_display(), "by_domain": (r.metrics or {}).get("by_domain", {}),
                   "accuracy": (r.metrics or {}).get("accuracy")} for r in runs if r.metrics],
        "domain_labels": dict(Domain.choices),
    })


@require_POST
@researcher_required
def submission_action(request, pk, action):
    submission = get_object_or_404(selectors.submissions_visible_to(request.user), pk=pk)
    try:
        if action == "publish":
            if services.submission_publish(user=request.user, submission=submission):
                messages.success(request, "Published: the submission's results and predictions are now public.")
        elif action == "cancel":
            count = services.submission_cancel(user=request.user, submission=submission)
            messages.info(request, f"Cancelled {count} run(s).")
        else:
            count = services.submission_retry(user=request.user, submission=submission)
            messages.info(request, f"Re-queued {count} run(s); pairs already scored are kept.")
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from None
    return redirect(submission)


EXPORT_FIELDS = ("id", "domain", "chosen_score", "rejected_score", "correct", "tie")


def pair_score_rows(run: EvaluationRun):
    for source_id, domain, chosen, rejected, correct, tie in (
            PairScore.objects.filter(run=run).order_by("item__position")
            .values_list("item__source_id", "item__domain", "chosen_score", "rejected_score", "correct", "tie")
            .iterator(chunk_size=2000)):
        yield {"id": source_id, "domain": domain, "chosen_score": chosen, "rejected_score": rejected,
               "correct": correct, "tie": tie}


class _Echo:
    def write(self, value):
        return value


def export_response(run: EvaluationRun, fmt: str) -> HttpResponse:
    name = f"prbench-{run.submission_id}-{run.setting}.{fmt}"
    if fmt == "csv":
        writer = csv.DictWriter(_Echo(), fieldnames=EXPORT_FIELDS)
        body = (writer.writerow(row) for row in _with_header(pair_score_rows(run)))
        response = StreamingHttpResponse(body, content_type="text/csv")
    else:
        body = (json.dumps(row) + "\n" for row in pair_score_rows(run))
        response = StreamingHttpResponse(body, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _with_header(rows):
    yield dict(zip(EXPORT_FIELDS, EXPORT_FIELDS))
    yield from rows


def run_export(request, pk, run_id, fmt):
    """Per-pair predictions: public once published, the owner's and staff's before."""
    submission = get_object_or_404(selectors.submissions_visible_to(request.user), pk=pk)
    run = get_object_or_404(EvaluationRun, pk=run_id, submission=submission)
    return export_response(run, fmt)


def _correlation_params(request):
    """The report's parameters, or a 400 response naming the bad one."""
    from rest_framework.exceptions import ValidationError

    from .api import correlation_params

    try:
        return correlation_params(request.GET), None
    except ValidationError as exc:
        reason = "; ".join(f"{key}: {' '.join(map(str, msgs)) if isinstance(msgs, list) else msgs}"
                           for key, msgs in exc.detail.items())
        return None, HttpResponseBadRequest(reason, content_type="text/plain")


def correlations(request):
    from .models import DownstreamOutcome, OutcomeKind

    params, refused = _correlation_params(request)
    if refused:
        return refused
    report = selectors.correlation_report(**params)
    return render(request, "leaderboard/correlations.html", {
        "report": report, "params": params, "kinds": OutcomeKind.choices, "domains": Domain.choices,
        "k_choices": (1, 2, 4, 8, 16), "settings_choices": Setting.choices,
        "has_outcomes": DownstreamOutcome.objects.exists()})


CORRELATION_METRICS = ("spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo")
# The first twelve columns are the original export's, in its order; the rest were added after.
CORRELATION_FIELDS = ("benchmark", "setting", "n", "spearman", "spearman_p", "spearman_ci_low", "spearman_ci_high",
                      "kendall", "kendall_p", "pearson", "pearson_p", "ndcg",
                      "kendall_ci_low", "kendall_ci_high", "pearson_ci_low", "pearson_ci_high", "ndcg_ci_low",
                      "ndcg_ci_high", "weighted_tau", "weighted_tau_ci_low", "weighted_tau_ci_high", "ndcg_shifted",
                      "ndcg_shifted_ci_low", "ndcg_shifted_ci_high", "rbo", "rbo_ci_low", "rbo_ci_high",
                      "outcome_setting", "warning")


def correlations_csv(request):
    params, refused = _correlation_params(request)
    if refused:
        return refused
    report = selectors.correlation_report(**params)
    writer = csv.DictWriter(_Echo(), fieldnames=CORRELATION_FIELDS)

    def rows():
        yield dict(zip(CORRELATION_FIELDS, CORRELATION_FIELDS))
        for r in report["correlations"]:
            row = {"benchmark": r["benchmark"], "setting": r["setting"], "outcome_setting": r["outcome_setting"],
                   "n": r["n"], "warning": r["warning"] or ""}
            for m in CORRELATION_METRICS:
                row.update({m: r[m]["value"], f"{m}_ci_low": r[m]["ci_low"], f"{m}_ci_high": r[m]["ci_high"]})
                if "p_value" in r[m]:
                    row[f"{m}_p"] = r[m]["p_value"]
            yield row

    response = StreamingHttpResponse((writer.writerow(r) for r in rows()), content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="prbench-correlations.csv"'
    return response
