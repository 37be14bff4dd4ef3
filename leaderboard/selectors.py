"""Reads for the leaderboard: a fixed number of queries whatever the number of submissions."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import F, Prefetch, Q, QuerySet

from pipeline.models import Domain
from pipeline.services import correlation_defaults
from prblib import registry

from .models import EvaluationRun, PairScore, RunStatus, Setting, Submission

SORT_KEYS = {
    "accuracy": lambda r: r["accuracy"],
    "date": lambda r: r["finished_at"].timestamp() if r["finished_at"] else 0,
    "name": lambda r: r["display_name"].lower(),
    "parameters": lambda r: r["parameters"] or 0,
    **{f"domain:{d}": (lambda r, d=d: (r["by_domain"].get(d) or {}).get("accuracy", -1)) for d in Domain.values},
}


def visibility_filter(viewer: AbstractBaseUser | AnonymousUser | None, prefix: str = "") -> Q:
    """What `viewer` may see of submissions: published ones, their own, everything for staff.
    None means the public (anonymous) view. `prefix` reaches a submission through a relation."""
    if viewer is not None and viewer.is_staff:
        return Q()
    public = Q(**{f"{prefix}published": True})
    if viewer is not None and viewer.is_authenticated:
        return public | Q(**{f"{prefix}owner": viewer})
    return public


def submissions_visible_to(viewer: AbstractBaseUser | AnonymousUser | None) -> QuerySet[Submission]:
    """Submissions `viewer` may open; any other is answered 404, as if it did not exist."""
    return Submission.objects.filter(visibility_filter(viewer))


def submissions_visible(*, user) -> QuerySet[Submission]:
    """Submissions `user` lists on the queue page and `GET /api/submissions/`, newest first,
    runs prefetched in setting order: staff see everyone's, researchers their own."""
    qs = (Submission.objects.select_related("benchmark", "owner", "judge_backend")
          .prefetch_related(Prefetch("runs", queryset=EvaluationRun.objects.order_by("setting")), "outcomes"))
    return qs if user.is_staff else qs.filter(owner=user)


def succeeded_runs(*, benchmark: str | None = None, kind: str | None = None, setting: str | None = None,
                   viewer: AbstractBaseUser | AnonymousUser | None = None) -> QuerySet[EvaluationRun]:
    """Succeeded runs of the submissions `viewer` may see (None: published ones only)."""
    runs = (EvaluationRun.objects.filter(status=RunStatus.SUCCEEDED).filter(visibility_filter(viewer, "submission__"))
            .select_related("submission__benchmark", "submission__owner"))
    if benchmark:
        runs = runs.filter(submission__benchmark__name=benchmark)
    if kind:
        runs = runs.filter(submission__kind=kind)
    if setting:
        runs = runs.filter(setting=setting)
    return runs


def leaderboard_rows(*, benchmark: str | None = None, kind: str | None = None, setting: str | None = None,
                     domain: str | None = None, sort: str = "accuracy", descending: bool = True,
                     viewer: AbstractBaseUser | AnonymousUser | None = None,
                     search: str | None = None) -> list[dict[str, Any]]:
    """One row per succeeded (submission, setting) that `viewer` may see (published ones, and
    their own unpublished ones marked `published: false`), with significance-group ranks
    computed within each (benchmark, setting, protocol[, domain]) from the per-pair results. Rows come
    grouped by (benchmark, setting, protocol), sorted by `sort` inside each group: every group is one
    ranked table. `search` keeps models whose name contains it (any case); ranks are computed
    before it, so a row keeps its rank whatever is searched."""
    runs = list(succeeded_runs(benchmark=benchmark, kind=kind, setting=setting, viewer=viewer))
    rows = []
    for run in runs:
        s, m = run.submission, run.metrics or {}
        scope = (m.get("by_domain") or {}).get(domain, {}) if domain else m
        if domain and not scope:
            continue
        rows.append({
            "run_id": run.pk, "submission_id": s.pk, "display_name": s.display_name, "kind": s.kind,
            "rm": f"{s.owner_shown_to(viewer)}/{s.display_name}",
            "kind_label": s.get_kind_display(), "setting": run.setting, "setting_label": run.get_setting_display(),
            "benchmark": s.benchmark.name, "parameters": s.parameters, "license": s.license, "link": s.link,
            "owner": s.owner_shown_to(viewer), "finished_at": run.finished_at, "published": s.published,
            "accuracy": scope.get("accuracy"), "ci_low": scope.get("ci_low"), "ci_high": scope.get("ci_high"),
            "n": scope.get("n"), "tie_rate": scope.get("tie_rate"),
            "by_domain": m.get("by_domain") or {},
            # The rules behind the figure; a judge's strict figure beside a release-comparable one.
            **_protocol_fields(s, m),
        })
    _attach_groups(rows, domain=domain)
    if search and search.strip():
        needle = search.strip().casefold()
        rows = [r for r in rows if needle in r["display_name"].casefold()]
    key = SORT_KEYS.get(sort, SORT_KEYS["accuracy"])
    rows.sort(key=lambda r: (key(r) if key(r) is not None else -1), reverse=descending)
    # One table per (benchmark, setting, protocol): ranks compare rows inside a table only, so tables never
    # interleave and a release-protocol figure is never ranked against a prbench one.
    order = {value: i for i, value in enumerate(Setting.values)}
    protocols = {p.name: i for i, p in enumerate(registry.PROTOCOLS)}
    rows.sort(key=lambda r: (r["benchmark"], order.get(r["setting"], len(order)), protocols.get(r["protocol"], 0)))
    return rows


def _protocol_fields(submission: Submission, metrics: dict[str, Any]) -> dict[str, Any]:
    """{protocol, protocol_label, protocol_definition, strict_accuracy} of a result: the protocol its
    options name (`registry.protocol_display`), and the strict accuracy (an unreadable verdict
    wrong) where the run's figure counts one otherwise (pairwise judges under release); else None."""
    shown = registry.protocol_display(submission.kind, submission.options)
    return {"protocol": shown["name"], "protocol_label": shown["label"], "protocol_definition": shown["definition"],
            "strict_accuracy": (metrics.get("protocol") or {}).get("strict_accuracy")}


def leaderboard_tables(**filters: Any) -> list[dict[str, Any]]:
    """`leaderboard_rows` as one ranked table per (benchmark, setting, protocol):
    [{benchmark, setting, setting_label, protocol, protocol_label, rows}], in benchmark, setting,
    then protocol order (prbench first): ranks never compare figures of two protocols."""
    tables: list[dict[str, Any]] = []
    for row in leaderboard_rows(**filters):
        scope = (row["benchmark"], row["setting"], row["protocol"])
        if not tables or (tables[-1]["benchmark"], tables[-1]["setting"], tables[-1]["protocol"]) != scope:
            tables.append({"benchmark": row["benchmark"], "setting": row["setting"],
                           "setting_label": row["setting_label"], "protocol": row["protocol"],
                           "protocol_label": row["protocol_label"], "rows": []})
        tables[-1]["rows"].append(row)
    return tables


def _attach_groups(rows: list[dict[str, Any]], *, domain: str | None) -> None:
    """Rank rows as significance groups within each (benchmark, setting, protocol): one query for all
    per-pair outcomes of the listed runs."""
    from prblib.stats.metrics import significance_groups

    if not rows:
        return
    scores = PairScore.objects.filter(run_id__in=[r["run_id"] for r in rows])
    if domain:
        scores = scores.filter(item__domain=domain)
    outcomes: dict[int, dict[int, bool]] = defaultdict(dict)
    for run_id, item_id, correct in scores.values_list("run_id", "item_id", "correct").iterator(chunk_size=5000):
        outcomes[run_id][item_id] = correct
    by_scope: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:  # one ranking per protocol: a release figure is never ranked against a prbench one
        by_scope[(row["benchmark"], row["setting"], row["protocol"])].append(row)
    for scope_rows in by_scope.values():
        common = set.intersection(*(set(outcomes[r["run_id"]]) for r in scope_rows))
        items = sorted(common)
        systems = {r["run_id"]: [outcomes[r["run_id"]][i] for i in items] for r in scope_rows}
        groups = significance_groups(systems) if items else {}
        for row in scope_rows:
            row["rank"] = groups.get(row["run_id"])


def rm_key(*, submission_id: int | None, source: str, rm_name: str) -> str:
    """The stable identity of a reward model in reports: our submission's id, or the
    declared (source, rm) pair of an external model."""
    return f"submission:{submission_id}" if submission_id is not None else f"external:{source}:{rm_name}"


def _labels(names: dict[str, tuple[str, str]]) -> dict[str, str]:
    """{key: label}: the plain name where it is unique in the report, else "owner/name" for
    our submissions and "name (source)" for external models; a label still shared by two keys
    (a model named "b/x" beside user b's model "x") gets the key appended, so no two RMs ever
    share a label. Labels are for reading only: every join is on the key."""
    counts: dict[str, int] = defaultdict(int)
    for name, _ in names.values():
        counts[name] += 1
    labels = {key: name if counts[name] == 1 else (qualifier if key.startswith("submission:") else f"{name} ({qualifier})")
              for key, (name, qualifier) in names.items()}
    shared: dict[str, int] = defaultdict(int)
    for label in labels.values():
        shared[label] += 1
    return {key: label if shared[label] == 1 else f"{label} [{key}]" for key, label in labels.items()}


# Outcomes compared with a row whose setting has no outcomes of its own (another benchmark's rows).
DEFAULT_OUTCOME_SETTING = "profile"

# Where a row's accuracies come from: computed here from per-pair scores, or imported
# (import_benchmark_scores). Never pooled: an imported figure for one of our own submissions
# is its own row beside the computed one.
COMPUTED, IMPORTED = "computed", "imported"


def _outcome_choice(candidates: list[Any], *, run: int | None, k: int | None) -> str:
    """The config_key of the outcome used for one RM (one policy and setting) among the stored
    ones: the one recorded by run `run` when there is one, else the most recent one with k = `k`,
    else the most recent one. Candidates are DownstreamOutcome rows."""
    if run is not None:
        for o in candidates:
            if run in (o.bon_run_id, o.ppo_run_id):
                return o.config_key
    at_k = [o for o in candidates if o.k == k] or candidates
    return max(at_k, key=lambda o: (o.created_at, o.pk)).config_key


def correlation_report(*, kind: str = "best_of_n", policy: str | None = None, k: int | None = 16,
                       domain: str = "", setting: str | None = None, ndcg_k: int | None = None,
                       rbo_p: float = 0.9, run: int | None = None,
                       protocol: str = registry.DEFAULT_PROTOCOL) -> dict[str, Any]:
    """How well each benchmark (ours per setting, and imported ones) predicts a downstream
    outcome (kind, policy, k, domain): the metrics of `prblib.stats.correlation.correlate`.

    One protocol at a time (`protocol`, default prbench; `outcome.protocol` names it): only
    accuracies of results that follow it (`registry.protocol_of` of the submission's options) and
    outcomes of runs that followed it (their manifest's `protocol`; a row without one, e.g. an
    import, is prbench) are correlated, so a release figure is never set against a prbench one.
    Imported benchmark accuracies name no protocol: they are prbench rows.

    RMs are joined by identity (`rm_key`: a submission's id, an external model's source and
    name), never by display name; `correlate` receives the keys, labels are attached after.
    Accuracies computed here and imported ones (ExternalBenchmarkScore) are separate rows, even
    for the same benchmark name and setting (row `origin`: computed | imported).

    An RM may hold several outcomes for one (kind, policy, setting, domain, k), one per
    configuration (judge, judge model, run options: DownstreamOutcome.config_key). The one used
    is the outcome of the Best-of-N or PPO run `run` when given, else the most recent one
    (`_outcome_choice`); each point names it (outcome_id, outcome_run, judge_model, config_key,
    alternatives: how many configurations that RM has), and `outcome.selection` says the rule.

    A row for our benchmark in setting S uses the outcomes of the RMs used in setting S; a row
    for another benchmark uses the outcomes in `setting` (default "profile"), named in the row's
    `outcome_setting`. Keys: outcome {kind, policy, k, domain, setting, rms, selection, run},
    policies, settings (with outcomes), definitions {metric: text}, correlations [{benchmark,
    setting, origin, outcome_setting, n, rms (labels), dropped {label: reason}, warning,
    <metric>: {value, ci_low, ci_high, ...}, points [{rm, key, accuracy, outcome, outcome_id,
    outcome_run, judge_model, config_key, alternatives, synthetic}]}], curves {rm: [{k, outcome,
    ci_low, ci_high}]} (Best-of-N, in `setting`), stability (rank_stability across policies in
    `setting`, or None), synthetic (labels of the RMs whose outcomes used are made up)."""
    from pipeline.services import correlate
    from prblib.stats.correlation import definitions as correlation_definitions, rank_stability

    from .models import DownstreamOutcome, ExternalBenchmarkScore

    # Published submissions' results only (and external models'): a private result stays private here too.
    public = Q(submission__isnull=True) | Q(submission__published=True)
    # A row naming no protocol (an import, a run from before protocols) follows prbench.
    of_protocol = (Q(manifest__protocol=protocol) if protocol != registry.DEFAULT_PROTOCOL
                   else ~Q(manifest__has_key="protocol") | Q(manifest__protocol=protocol))
    outcomes_qs = (DownstreamOutcome.objects.filter(public, kind=kind, domain=domain).filter(of_protocol)
                   .select_related("submission__owner"))
    policies = sorted(set(outcomes_qs.values_list("policy", flat=True)))
    policy = policy or (policies[0] if policies else None)
    chart_setting = setting or DEFAULT_OUTCOME_SETTING
    per_k = registry.outcome_kind(kind).per_k  # Best-of-k outcomes: one per k, with curves over k
    kk = k if per_k else None
    names: dict[str, tuple[str, str]] = {}

    def key_of(submission, source: str, rm_name: str) -> str:
        if submission is not None:
            key = rm_key(submission_id=submission.pk, source="", rm_name="")
            # A staff owner is shown as "prbench staff", which two staff members share: their id tells them apart.
            staff = f" #{submission.pk}" if submission.owner.is_staff else ""
            names[key] = (submission.display_name, f"{submission.owner_shown_to(None)}/{submission.display_name}{staff}")
        else:
            key = rm_key(submission_id=None, source=source, rm_name=rm_name)
            names[key] = (rm_name, source)
        return key

    stored = list(outcomes_qs.order_by("k", "created_at", "pk"))
    groups: dict[tuple[str, str, str], list[Any]] = defaultdict(list)  # (policy, setting, rm key) -> outcomes
    for o in stored:
        groups[(o.policy, o.setting, key_of(o.submission, o.source, o.rm_name))].append(o)
    chosen = {group: _outcome_choice(candidates, run=run, k=kk) for group, candidates in groups.items()}
    configs = {group: len({o.config_key for o in candidates}) for group, candidates in groups.items()}

    outcome_by_setting: dict[str, dict[str, float]] = defaultdict(dict)
    used: dict[tuple[str, str], Any] = {}  # (setting, key) -> the DownstreamOutcome used
    curves_by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_policy: dict[str, dict[str, float]] = defaultdict(dict)
    for (o_policy, o_setting, key), candidates in groups.items():
        for o in candidates:
            if o.config_key != chosen[(o_policy, o_setting, key)]:
                continue
            if o_policy == policy and o.k == kk:
                outcome_by_setting[o_setting][key] = o.outcome
                used[(o_setting, key)] = o
            if per_k and o_policy == policy and o_setting == chart_setting and o.k is not None:
                curves_by_key[key].append({"k": o.k, "outcome": o.outcome, "ci_low": o.ci_low, "ci_high": o.ci_high})
            if o.k == kk and o_setting == chart_setting:
                by_policy[o_policy][key] = o.outcome

    sources: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for run_row in succeeded_runs().order_by("finished_at"):
        m = run_row.metrics or {}
        acc = ((m.get("by_domain") or {}).get(domain) or {}).get("accuracy") if domain else m.get("accuracy")
        if acc is not None and registry.protocol_of(run_row.submission.kind, run_row.submission.options) == protocol:
            sources[(run_row.submission.benchmark.name, run_row.setting, COMPUTED)][
                key_of(run_row.submission, "", "")] = acc
    imported = (ExternalBenchmarkScore.objects.filter(public) if protocol == registry.DEFAULT_PROTOCOL
                else ExternalBenchmarkScore.objects.none())
    for score in imported.select_related("submission__owner"):
        sources[(score.benchmark, score.setting, IMPORTED)][
            key_of(score.submission, score.source, score.rm_name)] = score.accuracy

    label = _labels(names)
    rows = []
    for (bench, row_setting, origin), accuracy in sorted(sources.items()):
        outcome_setting = row_setting if row_setting in Setting.values and not setting else chart_setting
        outcomes = outcome_by_setting.get(outcome_setting, {})
        stats = correlate(accuracy, outcomes, ndcg_k=ndcg_k, rbo_p=rbo_p)  # joined on keys, never on labels
        points = []
        for key in stats["rms"]:
            o = used[(outcome_setting, key)]
            points.append({"rm": label[key], "key": key, "accuracy": accuracy[key], "outcome": outcomes[key],
                           "outcome_id": o.pk, "outcome_run": o.run_ref, "judge_model": (o.manifest or {}).get(
                               "judge_model"), "config_key": o.config_key,
                           "alternatives": configs[(policy, outcome_setting, key)], "synthetic": o.synthetic})
        rows.append({"benchmark": bench, "setting": row_setting, "origin": origin, "outcome_setting": outcome_setting,
                     **stats, "rms": [label[key] for key in stats["rms"]],
                     "dropped": {label.get(key, key): why for key, why in stats["dropped"].items()},
                     "points": points})
    synthetic = sorted({label[key] for (_, key), o in used.items() if o.synthetic})
    return {
        "outcome": {"kind": kind, "policy": policy, "k": kk, "domain": domain or None, "setting": chart_setting,
                    "rms": len(outcome_by_setting.get(chart_setting, {})), "run": run, "protocol": protocol,
                    "protocol_label": registry.protocol(protocol).label,
                    "protocol_definition": registry.protocol(protocol).description,
                    "selection": (f"the outcome of run {run} where that RM has one, else the most recent"
                                  if run is not None else "the most recent outcome of each RM")},
        "policies": policies,
        "settings": sorted(outcome_by_setting),
        "definitions": correlation_definitions(ndcg_k=ndcg_k, rbo_p=rbo_p),
        "correlations": rows,
        "curves": {label[key]: points for key, points in sorted(curves_by_key.items(), key=lambda kv: label[kv[0]])},
        "stability": _labelled_stability(rank_stability(dict(by_policy)), label) if len(by_policy) > 1 else None,
        "synthetic": synthetic,
    }


def _labelled_stability(stability: dict[str, Any], label: dict[str, str]) -> dict[str, Any]:
    """rank_stability's report (computed on RM keys) with each RM named by its label."""
    return {**stability, "rms": [label.get(k, k) for k in stability.get("rms") or []],
            "dropped": {label.get(k, k): why for k, why in (stability.get("dropped") or {}).items()},
            "ranks": {p: {label.get(k, k): r for k, r in ranks.items()}
                      for p, ranks in (stability.get("ranks") or {}).items()}}


# --- public model pages -------------------------------------------------------------------

def published_submissions() -> QuerySet[Submission]:
    """Submissions with a public model page: published ones with at least one succeeded run."""
    return (Submission.objects.filter(published=True, runs__status=RunStatus.SUCCEEDED).distinct()
            .select_related("benchmark", "owner", "judge_backend"))


def _call(correct: bool, tie: bool) -> str:
    """Which answer a model preferred on one pair: chosen, rejected or tie."""
    return "tie" if tie else ("chosen" if correct else "rejected")


def model_pairs(*, run: EvaluationRun, domain: str | None = None, outcome: str | None = None) -> QuerySet[PairScore]:
    """One run's per-pair predictions in benchmark order; `outcome` is correct | wrong | tie."""
    qs = (PairScore.objects.filter(run=run).select_related("item").order_by("item__position")
          .only("chosen_score", "rejected_score", "correct", "tie", "item__source_id", "item__domain",
                "item__question", "item__position")
          .annotate(margin=F("chosen_score") - F("rejected_score")))
    if domain:
        qs = qs.filter(item__domain=domain)
    if outcome == "correct":
        qs = qs.filter(correct=True)
    elif outcome == "wrong":
        qs = qs.filter(correct=False, tie=False)
    elif outcome == "tie":
        qs = qs.filter(tie=True)
    return qs


def model_pair(*, score: PairScore) -> dict[str, Any]:
    """One pair of one run, as the pair page shows it.

    Returns ``item`` (the BenchmarkItem); ``chosen_score`` / ``rejected_score`` (floats at full
    precision, None where the model gave none) and ``margin`` (chosen minus rejected, None when
    either is missing); ``outcome``: correct | wrong | tie (a tie counts wrong); ``posts``: the
    profile posts the run's setting gives the model (the top ``profile_k``, most relevant first;
    empty outside the "profile" setting); ``plan``: the planner's aspects (the "plan" setting
    only); ``orders``: a pairwise judge's calls, one per order shown ({position of chosen "A" or
    "B", verdict, counted_as, raw reply}); ``replies``: a pointwise judge's reply to each answer
    ({"chosen", "rejected"}); ``details``: everything stored for the pair (a dict);
    ``previous`` / ``next``: the item ids of the neighbouring pairs the run scored, in benchmark
    order (None at either end)."""
    from pipeline.services import item_pair_input

    run, item = score.run, score.item
    pair = item_pair_input(item)
    details = score.details if isinstance(score.details, dict) else {}
    margin = (score.chosen_score - score.rejected_score
              if score.chosen_score is not None and score.rejected_score is not None else None)
    scored = PairScore.objects.filter(run=run)
    previous = (scored.filter(item__position__lt=item.position).order_by("-item__position")
                .values_list("item_id", flat=True).first())
    following = (scored.filter(item__position__gt=item.position).order_by("item__position")
                 .values_list("item_id", flat=True).first())
    orders = [o for o in details.get("orders") or [] if isinstance(o, dict)]
    replies = details.get("raw") if isinstance(details.get("raw"), dict) else {}
    return {
        "item": item, "chosen_score": score.chosen_score, "rejected_score": score.rejected_score, "margin": margin,
        "outcome": "tie" if score.tie else "correct" if score.correct else "wrong",
        "posts": list(pair.profile[:run.submission.profile_k]) if run.setting == "profile" else [],
        "plan": list(pair.plan) if run.setting == "plan" else [],
        "orders": orders, "replies": replies, "details": details,
        "previous": previous, "next": following,
    }


def model_compare(*, run_a: EvaluationRun, run_b: EvaluationRun) -> dict[str, Any]:
    """Two runs on the pairs both scored.

    Returns n (common pairs), agreement (share of them on which both preferred the same answer:
    chosen, rejected or tie), accuracy_a / accuracy_b on those pairs, mcnemar (the exact
    McNemar test of `prblib.stats.metrics.paired_comparison`: a_only, b_only, diff, p_value and
    a 95% bootstrap CI of the accuracy difference) and differ: the pairs where the calls differ,
    [{id, item, domain, question, a, b, scores_a, scores_b}] in benchmark order: `item` the item's
    pk (for the pair page), `a`/`b` each chosen | rejected | tie, `scores_a`/`scores_b` each run's
    (chosen score, rejected score) at full precision."""
    from prblib.stats.metrics import paired_comparison

    def calls(run):
        return {item_id: (correct, tie) for item_id, correct, tie in
                PairScore.objects.filter(run=run).values_list("item_id", "correct", "tie")}

    a, b = calls(run_a), calls(run_b)
    common = sorted(set(a) & set(b))
    same = sum(1 for i in common if _call(*a[i]) == _call(*b[i]))
    differing = [i for i in common if _call(*a[i]) != _call(*b[i])]
    items = {item.pk: item for item in run_a.submission.benchmark.items.filter(pk__in=differing)
             .only("source_id", "domain", "question", "position")}
    scores = [{item_id: (chosen, rejected) for item_id, chosen, rejected in PairScore.objects.filter(
        run=run, item_id__in=differing).values_list("item_id", "chosen_score", "rejected_score")}
        for run in (run_a, run_b)]
    differ = [{"id": items[i].source_id, "item": i, "domain": items[i].domain, "question": items[i].question,
               "a": _call(*a[i]), "b": _call(*b[i]), "scores_a": scores[0][i], "scores_b": scores[1][i],
               "position": items[i].position} for i in differing if i in items]
    differ.sort(key=lambda row: row.pop("position"))
    correct_a = [a[i][0] for i in common]
    correct_b = [b[i][0] for i in common]
    return {"n": len(common), "agreement": same / len(common) if common else None,
            "accuracy_a": sum(correct_a) / len(common) if common else None,
            "accuracy_b": sum(correct_b) / len(common) if common else None,
            "mcnemar": paired_comparison(correct_a, correct_b), "differ": differ}

class ParamError(ValueError):
    """A query parameter refused; `field` names it (the API answers 400, the pages 400 text)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


# What the correlation views take. Each new (ndcg_k, rbo_p) misses the correlation cache
# (pipeline.services.correlate) and pays a bootstrap, about a second of CPU: bounded, they allow a
# few cache entries per set of outcomes, not one per number a client makes up. The page, its CSV
# and the API take the same values (and /api/schema/ lists them).
RBO_P_CHOICES = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99)  # persistence: p = 0.9 weighs the top 10 by 86%
NDCG_K_MAX = 20
K_MAX = 32767  # DownstreamOutcome.k's column
RUN_ID_MAX = 2**63 - 1  # a Best-of-N or PPO run's id (BigAutoField)


def _whole_number(params, name: str, *, high: int, default: int | None) -> int | None:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(high)) and 1 <= int(raw) <= high):
        raise ParamError(name, f"must be a whole number between 1 and {high}")
    return int(raw)


def correlation_params(params) -> dict:
    """Query parameters of the correlation views (page, CSV and API); an absent or empty one
    takes its default. A value outside what the view takes is a ParamError naming the limit:
    outcome, domain and setting one of theirs, k a whole number 1..K_MAX, ndcg_k 1..NDCG_K_MAX,
    rbo_p one of RBO_P_CHOICES, run (the Best-of-N or PPO run whose outcomes to use) a whole number."""
    kind = params.get("outcome") or registry.OUTCOME_KINDS[0].name
    if kind not in registry.outcome_kind_names():
        raise ParamError("outcome", f"must be one of {', '.join(registry.outcome_kind_names())}")
    k = _whole_number(params, "k", high=K_MAX, default=registry.KS[-1])
    domain = params.get("domain") or ""
    if domain and domain not in Domain.values:
        raise ParamError("domain", f"must be one of {', '.join(Domain.values)}")
    setting = params.get("setting") or None
    if setting is not None and setting not in registry.setting_names():
        raise ParamError("setting", f"must be one of {', '.join(registry.setting_names())}")
    ndcg_k = _whole_number(params, "ndcg_k", high=NDCG_K_MAX, default=None)
    run = _whole_number(params, "run", high=RUN_ID_MAX, default=None)
    rbo_p = params.get("rbo_p") or ""
    try:
        rbo_p = float(rbo_p) if rbo_p else correlation_defaults()["rbo_p"]
    except ValueError:
        rbo_p = None
    if rbo_p not in RBO_P_CHOICES:
        raise ParamError("rbo_p", f"must be one of {', '.join(map(str, RBO_P_CHOICES))}")
    protocol = params.get("protocol") or registry.DEFAULT_PROTOCOL
    names = [p.name for p in registry.PROTOCOLS]
    if protocol not in names:
        raise ParamError("protocol", f"must be one of {', '.join(names)} (one protocol at a time: figures of two "
                                     "protocols are never correlated together)")
    return {"kind": kind, "policy": params.get("policy") or None, "k": k, "domain": domain, "setting": setting,
            "ndcg_k": ndcg_k, "rbo_p": rbo_p, "run": run, "protocol": protocol}


def downstream_runs(submission) -> list[dict[str, Any]]:
    """The submission's Best-of-N and PPO runs, newest first: [{experiment, policy, setting (label),
    status (label), knobs {name: value}}], knobs being every sampling or PPO option the run used."""
    from .services import bon_options, ppo_options

    bon = [{"experiment": "Best-of-N", "policy": r.sample_set.policy, "setting": r.get_setting_display(),
            "status": r.get_status_display(),
            "created_at": r.created_at, "knobs": {**bon_options(r.sample_set), "protocol": r.protocol}}
           for r in submission.bon_runs.select_related("sample_set")]
    ppo = [{"experiment": "PPO", "policy": r.policy, "setting": r.get_setting_display(), "status": r.get_status_display(),
            "created_at": r.created_at, "knobs": ppo_options(r).model_dump()} for r in submission.ppo_runs.all()]
    return sorted(bon + ppo, key=lambda r: r["created_at"], reverse=True)
