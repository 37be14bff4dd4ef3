
import json

from django.contrib import messages
from django.db.models import Prefetch
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from jobs.models import ACTIVE_STATUSES
from pipeline.domains import LAMP_QA_DOMAINS, SHORT_LABELS
from pipeline.models import Benchmark, Domain
from pipeline.services import metrics_shown, per_pair_access, per_pair_withheld
from prblib import registry
from core import exports
from core.roles import RESEARCHER, role_required
from core.uploads import upload_refusal

from . import identity, selectors, services
from .forms import SubmissionForm
from .models import EvaluationRun, PairScore, RunStatus, Submission


researcher_required = role_required(
    RESEARCHER, "Submitting and inspecting reward models needs the researcher role.")


def _leaderboard_query(request) -> tuple[list[str], dict, str, bool, str]:
    """(benchmarks with results the user may see, filters, sort key, descending, search) from the query string."""
    params = request.GET
    benchmarks = list(Benchmark.objects.filter(submissions__runs__status="SUCCEEDED")
                      .filter(selectors.visibility_filter(request.user, "submissions__")).distinct()
                      .values_list("name", flat=True))
    filters = {
        "benchmark": params.get("benchmark") or (benchmarks[0] if benchmarks else None),
        "kind": params.get("kind") if params.get("kind") in registry.kind_names() else None,
        "setting": params.get("setting") if params.get("setting") in registry.setting_names() else None,
        "domain": params.get("domain") if params.get("domain") in Domain.values else None,
    }
    return benchmarks, filters, params.get("sort", "accuracy"), params.get("order", "desc") != "asc", \
        params.get("q", "").strip()


def leaderboard(request):
    """One ranked table per (benchmark, setting): ranks compare rows inside a table only."""
    benchmarks, filters, sort, descending, search = _leaderboard_query(request)
    tables = selectors.leaderboard_tables(**filters, sort=sort, descending=descending, search=search,
                                          viewer=request.user)
    rows = [row for table in tables for row in table["rows"]]
    return render(request, "leaderboard/leaderboard.html", {
        "tables": tables, "rows": rows, "filters": filters, "benchmarks": benchmarks, "sort": sort,
        "descending": descending,
        "search": search, "kinds": registry.kind_choices(), "settings_choices": registry.setting_choices(), "domains": Domain.choices,
        "domain_columns": _domain_columns(rows), "query": request.GET.urlencode(),
        "toggle_columns": (("kind", "Kind"), ("setting", "Setting"), ("ci", "95% CI"), ("domains", "Domains"),
                           ("params", "Params"), ("date", "Date")),
        "recent_benchmarks": Benchmark.objects.all()[:5],
    })


LEADERBOARD_FIELDS = ("rank", "display_name", "kind", "setting", "benchmark", "accuracy", "ci_low", "ci_high",
                      "tie_rate", "n", "parameters", "license", "link", "finished_at", "submission_id", "protocol",
                      "strict_accuracy")


def leaderboard_export(request, fmt):
    """The leaderboard as shown (same filters, search and order), as CSV or JSON; per-domain
    accuracies become `acc_<domain>` columns in CSV and stay a `by_domain` object in JSON.
    CSV goes through the one export writer (core.exports), so a model name cannot become a
    spreadsheet formula."""
    import json

    _, filters, sort, descending, search = _leaderboard_query(request)
    rows = selectors.leaderboard_rows(**filters, sort=sort, descending=descending, search=search,
                                      viewer=request.user)
    name = f"prbench-leaderboard-{filters['benchmark'] or 'all'}.{fmt}"
    if fmt == "json":
        body = json.dumps([{**{f: row[f] for f in LEADERBOARD_FIELDS}, "by_domain": row["by_domain"]} for row in rows],
                          default=str, indent=1, allow_nan=False)
        response = HttpResponse(body, content_type="application/json")
    else:
        domains = [value for value, _, _ in _domain_columns(rows)]
        flat = ({**{f: row[f] for f in LEADERBOARD_FIELDS},
                 **{f"acc_{d}": (row["by_domain"].get(d) or {}).get("accuracy") for d in domains}} for row in rows)
        response = HttpResponse("".join(exports.csv_lines(flat, [*LEADERBOARD_FIELDS, *(f"acc_{d}" for d in domains)])),
                                content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _domain_columns(rows) -> list[tuple[str, str, str]]:
    """Per-domain columns for the domains the listed results have (LaMP-QA's three by default)."""
    present = {d for row in rows for d in row["by_domain"]} or set(LAMP_QA_DOMAINS)
    return [(value, SHORT_LABELS[value], label) for value, label in Domain.choices if value in present]


@researcher_required
def submit(request):
    """The submit form: only the chosen kind's fields count (forms.kind_fields), settings a
    benchmark cannot run are refused, and every problem is shown at once."""
    from .forms import kind_options

    status = 200
    if request.method == "POST":
        form = SubmissionForm(request.POST, request.FILES)
        early = _early_refusal(request)
        if early is not None:
            status, field, message = early
            form.is_valid()
            form.add_error(field if field in form.fields else None, message)
        elif form.is_valid():
            data = form.cleaned_data
            option_names = kind_options().get(data["kind"], ())
            given = {name: data[name] for name in form.kind_fields[data["kind"]] if data[name] not in (None, "")}
            raw = given.pop("options", {})  # the JSON object; the service checks it against the kind's schema
            picked = {k: given.pop(k) for k in option_names if k in given}
            try:
                submission = services.submission_create(user=request.user, request=services.SubmissionRequest(
                    display_name=data["display_name"], benchmark=data["benchmark"], kind=data["kind"],
                    preset=data.get("preset") or "",
                    settings=tuple(data["settings"]), parameters=data["parameters"], license=data["license"],
                    link=data["link"], options={**raw, **picked} if isinstance(raw, dict) else raw, **given))
            except services.SubmissionRefused as exc:
                for field, problems in exc.errors.items():
                    for problem in problems:
                        form.add_error(field if field in form.fields else None, problem)
                if exc.status == 429:  # the hourly limit; other refusals show the form as before
                    status = exc.status
            else:
                messages.success(request, f"Submitted '{submission.display_name}': queued for evaluation.")
                return redirect(submission)
    else:
        form = SubmissionForm(initial={k: request.GET[k] for k in ("benchmark", "kind", "preset")
                                       if request.GET.get(k)})
    from prblib.rewards.options import options_doc

    return render(request, "leaderboard/submit.html", {
        "form": form, "benchmark_settings": form.benchmark_settings,
        "kind_options": [(k.name, k.label, options_doc(k.name)) for k in registry.KINDS]}, status=status)


def _early_refusal(request) -> tuple[int, str | None, str] | None:
    """(status, field, reason) of a submission refused before its upload is looked at: the
    hourly limit (429) first, so nothing more is done; then an upload past MAX_UPLOAD_MB (413),
    which counts toward that limit as every refused attempt does."""
    try:
        services.submission_rate_check(user=request.user)
    except services.SubmissionRefused as exc:
        return exc.status, None, str(exc)
    refusal = upload_refusal(request)
    if refusal is not None:
        services.submission_attempt_refused(user=request.user)
        return 413, *refusal
    return None


@researcher_required
def example_scores(request):
    """A scores file for the chosen benchmark to start from: every pair id once, in benchmark
    order, both scores 0.0 (uploaded unchanged it scores 0%: every pair a tie)."""
    benchmark = get_object_or_404(Benchmark, name=request.GET.get("benchmark", ""))
    ids = benchmark.items.order_by("position").values_list("source_id", flat=True)
    body = "".join(exports.jsonl_lines({"id": i, "chosen_score": 0.0, "rejected_score": 0.0} for i in ids))
    response = HttpResponse(body, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{benchmark.name}-scores-example.jsonl"'
    return response


@researcher_required
def submission_list(request):
    """The researcher's queue: every submission with each run's status, progress and reason
    (staff see everyone's); `?status=` keeps one overall status."""
    from .models import SUBMISSION_STATUS_ORDER

    submissions = list(selectors.submissions_visible(user=request.user)[:500])
    status = request.GET.get("status", "")
    if status in SUBMISSION_STATUS_ORDER:
        submissions = [s for s in submissions if s.overall_status == status]
    labels = {s: RunStatus(s).label for s in SUBMISSION_STATUS_ORDER}  # "FAILED" -> "Failed"
    return render(request, "leaderboard/submission_list.html", {
        "submissions": submissions, "status": status, "status_label": labels.get(status, ""),
        "statuses": list(labels.items()),
        "show_owner": request.user.is_staff,
        "actionable": {s.pk for s in submissions if services.can_act(request.user, s)},
    })


def submission_detail(request, pk):
    """Public for a published submission; its owner and staff only otherwise (404 to others)."""
    submission = get_object_or_404(selectors.submissions_visible_to(request.user)
                                   .select_related("benchmark", "owner", "judge_backend"), pk=pk)
    runs = list(submission.runs.all())
    withheld = per_pair_withheld(request.user, submission.benchmark_id)
    for run in runs:  # calibration bins are per-pair data (pipeline/blindness.py)
        run.metrics = metrics_shown(run.metrics, withheld)
    benchmark_domains = set(submission.benchmark.items.values_list("domain", flat=True).distinct())
    return render(request, "leaderboard/submission.html", {
        "submission": submission, "runs": runs, "can_act": services.can_act(request.user, submission),
        # Offered only when they would act on something (the page reloads when the last run ends).
        "can_cancel": any(r.status in ACTIVE_STATUSES for r in runs),
        "can_retry": any(r.status in (RunStatus.FAILED, RunStatus.CANCELLED) for r in runs),
        # Nothing to publish while every run failed or was cancelled (a retry may still give results).
        "can_publish": any(r.status not in (RunStatus.FAILED, RunStatus.CANCELLED) for r in runs),
        "public_page": selectors.published_submissions().filter(pk=submission.pk).exists(),
        "per_pair_withheld": withheld, "owner_shown": submission.owner_shown_to(request.user),
        "protocol": registry.protocol_display(submission.kind, submission.options),
        # Other submissions of these weights the reader may know of (published, or theirs): never another's private one.
        "same_weights": identity.same_weights_as(submission, request.user),
        "domains": [(v, label) for v, _, label in _domain_columns(
            [{"by_domain": (r.metrics or {}).get("by_domain") or {}} for r in runs])],
        "has_judge": any((r.metrics or {}).get("judge") for r in runs),
        "outcomes": submission.outcomes.filter(domain="").order_by("kind", "policy", "k"),
        "downstream_runs": selectors.downstream_runs(submission),
        "scaling": [{"setting": r.get_setting_display(), "points": r.metrics["scaling"]}
                    for r in runs if (r.metrics or {}).get("scaling")],
        "chart": [{"setting": r.get_setting_display(), "by_domain": (r.metrics or {}).get("by_domain", {}),
                   "accuracy": (r.metrics or {}).get("accuracy")} for r in runs if r.metrics],
        # The per-domain chart: only the domains the benchmark has items in.
        "domain_labels": {value: label for value, label in Domain.choices
                          if value in benchmark_domains},
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
    except services.SubmissionRefused as exc:  # a retry past the hourly limit
        messages.error(request, str(exc))
    return redirect(submission)


PAIR_FIELDS = ("id", "domain", "chosen_score", "rejected_score", "correct", "tie")
# The manifest's keys that identify a result, repeated as columns of every CSV row (see export_response).
MANIFEST_COLUMNS = ("code_version", "weights_hash", "benchmark_content_hash", "templates", "options", "seed")
EXPORT_FIELDS = (*PAIR_FIELDS, *(f"manifest_{key}" for key in MANIFEST_COLUMNS), "manifest")


def pair_score_rows(run: EvaluationRun):
    for source_id, domain, chosen, rejected, correct, tie in (
            PairScore.objects.filter(run=run).order_by("item__position")
            .values_list("item__source_id", "item__domain", "chosen_score", "rejected_score", "correct", "tie")
            .iterator(chunk_size=2000)):
        yield {"id": source_id, "domain": domain, "chosen_score": chosen, "rejected_score": rejected,
               "correct": correct, "tie": tie}


def export_response(run: EvaluationRun, fmt: str) -> HttpResponse:
    """Per-pair results of a run, each row carrying the run's manifest (what reproduces it).

    JSON lines: every row is {id, domain, chosen_score, rejected_score, correct, tie, manifest}
    with the whole manifest object, so any single line (or a filtered subset) still says where
    it came from. CSV: the pair columns, then manifest_code_version, manifest_weights_hash,
    manifest_benchmark_content_hash, manifest_templates, manifest_options, manifest_seed and
    manifest (the whole manifest as JSON text), repeated on every row: a comment or metadata line
    above the header breaks spreadsheets and CSV readers, and a sidecar file gets separated from
    its data. An unfinished run's manifest is computed as of now."""
    recorded = (run.metrics or {}).get("manifest") or services.run_manifest(run=run)
    if fmt == "csv":
        extra = {f"manifest_{key}": _cell(recorded.get(key)) for key in MANIFEST_COLUMNS}
        extra["manifest"] = _cell(recorded)
    else:
        extra = {"manifest": recorded}
    rows = ({**row, **extra} for row in pair_score_rows(run))
    return exports.export_response(rows, fields=EXPORT_FIELDS, fmt=fmt,
                                   filename=f"prbench-{run.submission_id}-{run.setting}")


def _cell(value):
    """A CSV cell: objects and lists as compact JSON text, None as empty, the rest as is."""
    import json

    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "" if value is None else value


def per_pair_allowed(user, submission: Submission, what: str = "model predictions") -> None:
    """PermissionDenied (403 with the reason) when per-pair data of the submission's benchmark
    is withheld from `user` while people rate its pairs blind; otherwise the read is logged
    (`what`), so `user` is never leased these pairs to rate blind (pipeline/blindness.py)."""
    withheld = per_pair_access(user, submission.benchmark_id, what=what)
    if withheld:
        raise PermissionDenied(withheld)


def run_export(request, pk, run_id, fmt):
    """Per-pair predictions: public once published, the owner's and staff's before; withheld
    from those who may rate the benchmark's pairs while a campaign on it is open."""
    submission = get_object_or_404(selectors.submissions_visible_to(request.user), pk=pk)
    per_pair_allowed(request.user, submission, "run scores export")
    run = get_object_or_404(EvaluationRun, pk=run_id, submission=submission)
    return export_response(run, fmt)


def _correlation_params(request):
    """The report's parameters, or a 400 response naming the bad one."""
    try:
        return selectors.correlation_params(request.GET), None
    except selectors.ParamError as exc:
        return None, HttpResponseBadRequest(str(exc), content_type="text/plain")


def correlations(request):
    from .models import DownstreamOutcome

    params, refused = _correlation_params(request)
    if refused:
        return refused
    report = selectors.correlation_report(**params)
    setting_labels = dict(registry.setting_choices())
    # A chart is drawn only with something on it: no empty axes when every row lacks outcomes.
    charts = {"scatter": any(r["points"] for r in report["correlations"]),
              "bars": any(r["spearman"]["value"] is not None for r in report["correlations"])}
    return render(request, "leaderboard/correlations.html", {
        "report": report, "params": params, "charts": charts, "kinds": registry.outcome_kind_choices(), "domains": Domain.choices,
        "protocol_choices": [p.name for p in registry.PROTOCOLS],
        "k_choices": registry.KS, "settings_choices": registry.setting_choices(), "setting_labels": setting_labels,
        "default_outcome_setting": setting_labels[selectors.DEFAULT_OUTCOME_SETTING],
        "has_outcomes": DownstreamOutcome.objects.exists(),
        # How many reward models here have made-up (seed_demo) outcomes: a count, not the sources' raw names.
        "synthetic_rms": len(report["synthetic"])})


CORRELATION_METRICS = ("spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo")
# The first twelve columns are the original export's, in its order; the rest were added after.
CORRELATION_FIELDS = ("benchmark", "setting", "n", "spearman", "spearman_p", "spearman_ci_low", "spearman_ci_high",
                      "kendall", "kendall_p", "pearson", "pearson_p", "ndcg",
                      "kendall_ci_low", "kendall_ci_high", "pearson_ci_low", "pearson_ci_high", "ndcg_ci_low",
                      "ndcg_ci_high", "weighted_tau", "weighted_tau_ci_low", "weighted_tau_ci_high", "ndcg_shifted",
                      "ndcg_shifted_ci_low", "ndcg_shifted_ci_high", "rbo", "rbo_ci_low", "rbo_ci_high",
                      "outcome_setting", "warning", "origin", "dropped", "synthetic_rms",
                      # how each p was computed, what a random ordering gives, and why an interval is absent
                      "spearman_p_method", "kendall_p_method", "pearson_p_method", "chance_method",
                      *(f"{m}_{part}" for m in CORRELATION_METRICS if m != "weighted_tau"
                        for part in ("chance_mean", "chance_sd", "chance_share_at_least")),
                      "ndcg_worst", "ndcg_shifted_worst", *(f"{m}_ci_reason" for m in CORRELATION_METRICS),
                      "protocol")


def correlations_csv(request):
    params, refused = _correlation_params(request)
    if refused:
        return refused
    report = selectors.correlation_report(**params)

    def rows():
        for r in report["correlations"]:
            row = {"benchmark": r["benchmark"], "setting": r["setting"], "outcome_setting": r["outcome_setting"],
                   "n": r["n"], "warning": r["warning"] or "", "origin": r["origin"],
                   "dropped": "; ".join(f"{rm}: {why}" for rm, why in sorted(r["dropped"].items())),
                   # made-up (seed_demo) outcomes among this row's points: said in the export too
                   "synthetic_rms": "; ".join(p["rm"] for p in r["points"] if p["synthetic"]),
                   "protocol": report["outcome"]["protocol"]}  # the one protocol of every figure here
            row["chance_method"] = r.get("chance_method") or ""
            for m in CORRELATION_METRICS:
                row.update({m: r[m]["value"], f"{m}_ci_low": r[m]["ci_low"], f"{m}_ci_high": r[m]["ci_high"],
                            f"{m}_ci_reason": r[m].get("ci_reason") or ""})
                if "p_value" in r[m]:
                    row[f"{m}_p"] = r[m]["p_value"]
                    row[f"{m}_p_method"] = r[m].get("p_method") or ""
                chance = r[m].get("chance") or {}
                if m != "weighted_tau":
                    row.update({f"{m}_chance_mean": chance.get("mean"), f"{m}_chance_sd": chance.get("sd"),
                                f"{m}_chance_share_at_least": chance.get("share_at_least")})
                if m.startswith("ndcg"):
                    row[f"{m}_worst"] = chance.get("worst")
            yield row

    return exports.export_response(rows(), fields=CORRELATION_FIELDS, fmt="csv", filename="prbench-correlations")


# --- public model pages -------------------------------------------------------------------

def _published(pk) -> Submission:
    return get_object_or_404(selectors.published_submissions(), pk=pk)


def _succeeded_run(submission: Submission, setting: str | None) -> EvaluationRun:
    runs = submission.runs.filter(status="SUCCEEDED").order_by("setting")
    run = runs.filter(setting=setting).first() if setting else runs.first()
    if run is None:
        raise Http404(f"No finished result of this model in the '{setting}' setting.")
    return run


def model_page(request, pk):
    """A published model: its card, results per setting and domain with CIs, and links to its
    per-pair predictions and to a comparison with another model on the same pairs."""
    submission = _published(pk)
    runs = list(submission.runs.filter(status="SUCCEEDED").order_by("setting"))
    done = Prefetch("runs", queryset=EvaluationRun.objects.filter(status="SUCCEEDED").order_by("setting"),
                    to_attr="done_runs")
    others = [(s, r) for s in selectors.published_submissions().filter(benchmark=submission.benchmark)
              .exclude(pk=submission.pk).order_by("display_name").prefetch_related(done)
              for r in s.done_runs if r.setting in {run.setting for run in runs}]  # comparable: a shared setting
    return render(request, "leaderboard/model.html", {
        "submission": submission, "runs": runs, "others": others,
        "compare_settings": _compare_settings(runs, others),
        "domains": [(v, label) for v, _, label in _domain_columns(
            [{"by_domain": (r.metrics or {}).get("by_domain") or {}} for r in runs])],
        "can_see_submission": services.can_act(request.user, submission),
        "per_pair_withheld": per_pair_withheld(request.user, submission.benchmark_id),
        "owner_shown": submission.owner_shown_to(request.user),
        "protocol": registry.protocol_display(submission.kind, submission.options),
    })


def _compare_settings(runs, others) -> list[dict]:
    """The compare form's setting options: this model's settings that at least one other model
    also has, each as {setting, label, with: [other pks having it], note}; `note` names the
    models that have it when not all of them do ("" otherwise)."""
    models = {s.pk: s.display_name for s, _ in others}
    having: dict[str, list[int]] = {}
    for other, run in others:
        having.setdefault(run.setting, []).append(other.pk)
    options = []
    for run in runs:
        pks = having.get(run.setting, [])
        if not pks:
            continue
        note = "" if len(pks) == len(models) else "only " + ", ".join(models[pk] for pk in pks)
        options.append({"setting": run.setting, "label": run.get_setting_display(), "with": pks, "note": note})
    return options


PAIRS_PER_PAGE = 50


def model_pairs(request, pk):
    """Per-pair predictions of one published model in one setting, 50 a page, filterable by
    domain and outcome (correct | wrong | tie)."""
    from django.core.paginator import Paginator

    submission = _published(pk)
    per_pair_allowed(request.user, submission, "model pair page")
    run = _succeeded_run(submission, request.GET.get("setting"))
    domain = request.GET.get("domain") if request.GET.get("domain") in Domain.values else ""
    outcome = request.GET.get("outcome") if request.GET.get("outcome") in ("correct", "wrong", "tie") else ""
    page = Paginator(selectors.model_pairs(run=run, domain=domain, outcome=outcome), PAIRS_PER_PAGE).get_page(
        request.GET.get("page"))
    params = request.GET.copy()
    params.pop("page", None)
    return render(request, "leaderboard/model_pairs.html", {
        "submission": submission, "run": run, "page": page, "domain": domain, "outcome": outcome,
        "settings": [r.setting for r in submission.runs.filter(status="SUCCEEDED").order_by("setting")],
        "domains": Domain.choices, "query": params.urlencode(),
    })


def model_pair(request, pk, item_pk):
    """One pair of one model's result in a setting (?setting=, default the first finished): the
    question and what the setting gave the model beside it, both answers, both scores at full
    precision and, for judges, each verdict with its reply. Per-pair data: visible as the run's
    exports are (published, or the owner's and staff's) and withheld from those who may rate the
    benchmark's pairs while a campaign on it is open."""
    submission = get_object_or_404(selectors.submissions_visible_to(request.user).select_related("benchmark"), pk=pk)
    per_pair_allowed(request.user, submission, "model pair detail")
    run = _succeeded_run(submission, request.GET.get("setting"))
    score = get_object_or_404(PairScore.objects.select_related("item", "run__submission"), run=run, item_id=item_pk)
    shown = selectors.model_pair(score=score)
    return render(request, "leaderboard/model_pair.html", {
        **shown, "submission": submission, "run": run,
        "details_json": json.dumps(shown["details"], indent=2, sort_keys=True, ensure_ascii=False),
        "setting_label": dict(registry.setting_choices()).get(run.setting, run.setting),
        "public_page": selectors.published_submissions().filter(pk=submission.pk).exists(),
    })


def model_predictions(request, pk, fmt):
    """Per-pair predictions of a published model as CSV or JSON lines (?setting=)."""
    submission = _published(pk)
    per_pair_allowed(request.user, submission)
    return export_response(_succeeded_run(submission, request.GET.get("setting")), fmt)


def model_compare(request, pk):
    """This model against another published model of the same benchmark, same setting, on
    the pairs both scored: agreement, exact McNemar test, and the pairs where they differ."""
    submission = _published(pk)
    per_pair_allowed(request.user, submission, "model comparison")
    setting = request.GET.get("setting") if request.GET.get("setting") in registry.setting_names() else None
    run_a = _succeeded_run(submission, setting)
    try:
        other_pk = int(request.GET.get("with", ""))
    except ValueError:
        raise Http404("Choose a model to compare with (?with=ID).") from None
    other = get_object_or_404(selectors.published_submissions().filter(benchmark=submission.benchmark), pk=other_pk)
    run_b = other.runs.filter(status="SUCCEEDED", setting=run_a.setting).first()
    if run_b is None:  # a 404 that says why and offers the settings both models have
        mine = {r.setting: r for r in submission.runs.filter(status="SUCCEEDED").order_by("setting")}
        shared = [mine[s] for s in other.runs.filter(status="SUCCEEDED").values_list("setting", flat=True) if s in mine]
        response = render(request, "leaderboard/model_compare_missing.html", {
            "a": submission, "b": other, "run_a": run_a, "shared": shared}, status=404)
        response.explained = True  # kept by AppNotFoundMiddleware with DEBUG on
        return response
    return render(request, "leaderboard/model_compare.html", {
        "a": submission, "b": other, "run_a": run_a, "run_b": run_b,
        "result": selectors.model_compare(run_a=run_a, run_b=run_b), "domain_labels": dict(Domain.choices),
    })
