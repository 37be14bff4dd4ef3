"""Reads for the leaderboard: a fixed number of queries whatever the number of submissions."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Prefetch, Q, QuerySet

from pipeline.models import Domain

from .models import EvaluationRun, PairScore, RunStatus, Submission

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
          .prefetch_related(Prefetch("runs", queryset=EvaluationRun.objects.order_by("setting"))))
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
    computed within each (benchmark, setting[, domain]) from the per-pair results. `search`
    keeps models whose name contains it (any case); ranks are computed before it, so a row
    keeps its rank whatever is searched."""
    runs = list(succeeded_runs(benchmark=benchmark, kind=kind, setting=setting, viewer=viewer))
    rows = []
    for run in runs:
        s, m = run.submission, run.metrics or {}
        scope = (m.get("by_domain") or {}).get(domain, {}) if domain else m
        if domain and not scope:
            continue
        rows.append({
            "run_id": run.pk, "submission_id": s.pk, "display_name": s.display_name, "kind": s.kind,
            "kind_label": s.get_kind_display(), "setting": run.setting, "setting_label": run.get_setting_display(),
            "benchmark": s.benchmark.name, "parameters": s.parameters, "license": s.license, "link": s.link,
            "owner": s.owner.get_username(), "finished_at": run.finished_at, "published": s.published,
            "accuracy": scope.get("accuracy"), "ci_low": scope.get("ci_low"), "ci_high": scope.get("ci_high"),
            "n": scope.get("n"), "tie_rate": scope.get("tie_rate"),
            "by_domain": m.get("by_domain") or {},
        })
    _attach_groups(rows, domain=domain)
    if search and search.strip():
        needle = search.strip().casefold()
        rows = [r for r in rows if needle in r["display_name"].casefold()]
    key = SORT_KEYS.get(sort, SORT_KEYS["accuracy"])
    rows.sort(key=lambda r: (key(r) if key(r) is not None else -1), reverse=descending)
    return rows


def _attach_groups(rows: list[dict[str, Any]], *, domain: str | None) -> None:
    """Rank rows as significance groups within each (benchmark, setting): one query for all
    per-pair outcomes of the listed runs."""
    from pipeline.ml.metrics import significance_groups

    if not rows:
        return
    scores = PairScore.objects.filter(run_id__in=[r["run_id"] for r in rows])
    if domain:
        scores = scores.filter(item__domain=domain)
    outcomes: dict[int, dict[int, bool]] = defaultdict(dict)
    for run_id, item_id, correct in scores.values_list("run_id", "item_id", "correct").iterator(chunk_size=5000):
        outcomes[run_id][item_id] = correct
    by_scope: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_scope[(row["benchmark"], row["setting"])].append(row)
    for scope_rows in by_scope.values():
        common = set.intersection(*(set(outcomes[r["run_id"]]) for r in scope_rows))
        items = sorted(common)
        systems = {r["run_id"]: [outcomes[r["run_id"]][i] for i in items] for r in scope_rows}
        groups = significance_groups(systems) if items else {}
        for row in scope_rows:
            row["rank"] = groups.get(row["run_id"])


def correlation_report(*, kind: str = "best_of_n", policy: str | None = None, k: int | None = 16,
                       domain: str = "") -> dict[str, Any]:
    """How well each benchmark (ours per setting, and imported ones) predicts a downstream
    outcome: Spearman, Kendall, Pearson with p-values and bootstrap CIs over RMs, and NDCG."""
    from pipeline.ml.correlation import correlate, rank_stability

    from .models import DownstreamOutcome, ExternalBenchmarkScore

    outcomes_qs = DownstreamOutcome.objects.filter(kind=kind, domain=domain)
    policies = sorted(set(outcomes_qs.values_list("policy", flat=True)))
    policy = policy or (policies[0] if policies else None)
    scoped = outcomes_qs.filter(policy=policy, k=k if kind == "best_of_n" else None)
    outcome_by_rm: dict[str, float] = {}
    for rm, value, source in scoped.order_by("rm_name", "source").values_list("rm_name", "outcome", "source"):
        if rm not in outcome_by_rm or source == "prbench":  # our own measurement wins over an import
            outcome_by_rm[rm] = value

    sources: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for run in succeeded_runs().order_by("finished_at"):
        m = run.metrics or {}
        acc = ((m.get("by_domain") or {}).get(domain) or {}).get("accuracy") if domain else m.get("accuracy")
        if acc is not None:
            sources[(run.submission.benchmark.name, run.setting)][run.submission.display_name] = acc
    for bench, rm, setting, acc in ExternalBenchmarkScore.objects.values_list("benchmark", "rm_name", "setting",
                                                                              "accuracy"):
        sources[(bench, setting)][rm] = acc

    rows = []
    for (bench, setting), accuracy in sorted(sources.items()):
        stats = correlate(accuracy, outcome_by_rm)
        rows.append({"benchmark": bench, "setting": setting, **stats,
                     "points": [{"rm": rm, "accuracy": accuracy[rm], "outcome": outcome_by_rm[rm]}
                                for rm in stats["rms"]]})

    curves: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if kind == "best_of_n":
        for rm, kk, value, low, high in (outcomes_qs.filter(policy=policy).exclude(k=None).order_by("rm_name", "k")
                                         .values_list("rm_name", "k", "outcome", "ci_low", "ci_high")):
            curves[rm].append({"k": kk, "outcome": value, "ci_low": low, "ci_high": high})
    by_policy: dict[str, dict[str, float]] = defaultdict(dict)
    for p, rm, value in outcomes_qs.filter(k=k if kind == "best_of_n" else None).values_list(
            "policy", "rm_name", "outcome"):
        by_policy[p][rm] = value
    return {
        "outcome": {"kind": kind, "policy": policy, "k": k if kind == "best_of_n" else None, "domain": domain or None,
                    "rms": len(outcome_by_rm)},
        "policies": policies,
        "correlations": rows,
        "curves": dict(curves),
        "stability": rank_stability(dict(by_policy)) if len(by_policy) > 1 else None,
    }


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
                "item__question", "item__position"))
    if domain:
        qs = qs.filter(item__domain=domain)
    if outcome == "correct":
        qs = qs.filter(correct=True)
    elif outcome == "wrong":
        qs = qs.filter(correct=False, tie=False)
    elif outcome == "tie":
        qs = qs.filter(tie=True)
    return qs


def model_compare(*, run_a: EvaluationRun, run_b: EvaluationRun) -> dict[str, Any]:
    """Two runs on the pairs both scored.

    Returns n (common pairs), agreement (share of them on which both preferred the same answer:
    chosen, rejected or tie), accuracy_a / accuracy_b on those pairs, mcnemar (the exact
    McNemar test of `pipeline.ml.metrics.paired_comparison`: a_only, b_only, diff, p_value and
    a 95% bootstrap CI of the accuracy difference) and differ: the pairs where the calls differ,
    [{id, domain, question, a, b}] in benchmark order, `a`/`b` each chosen | rejected | tie."""
    from pipeline.ml.metrics import paired_comparison

    def calls(run):
        return {item_id: (correct, tie) for item_id, correct, tie in
                PairScore.objects.filter(run=run).values_list("item_id", "correct", "tie")}

    a, b = calls(run_a), calls(run_b)
    common = sorted(set(a) & set(b))
    same = sum(1 for i in common if _call(*a[i]) == _call(*b[i]))
    differing = [i for i in common if _call(*a[i]) != _call(*b[i])]
    items = {item.pk: item for item in run_a.submission.benchmark.items.filter(pk__in=differing)
             .only("source_id", "domain", "question", "position")}
    differ = [{"id": items[i].source_id, "domain": items[i].domain, "question": items[i].question,
               "a": _call(*a[i]), "b": _call(*b[i]), "position": items[i].position} for i in differing if i in items]
    differ.sort(key=lambda row: row.pop("position"))
    correct_a = [a[i][0] for i in common]
    correct_b = [b[i][0] for i in common]
    return {"n": len(common), "agreement": same / len(common) if common else None,
            "accuracy_a": sum(correct_a) / len(common) if common else None,
            "accuracy_b": sum(correct_b) / len(common) if common else None,
            "mcnemar": paired_comparison(correct_a, correct_b), "differ": differ}

def correlation_params(params) -> dict:
    """Query parameters of the correlation views (page and API), with safe defaults for bad values."""
    from .models import OutcomeKind

    kind = params.get("outcome") or "best_of_n"
    if kind not in OutcomeKind.values:
        kind = "best_of_n"
    try:
        k = int(params.get("k") or 16)
    except ValueError:
        k = 16
    domain = params.get("domain") or ""
    return {"kind": kind, "policy": params.get("policy") or None, "k": k,
            "domain": domain if domain in Domain.values else ""}
