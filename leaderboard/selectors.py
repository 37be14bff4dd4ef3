"""Reads for the leaderboard: a fixed number of queries whatever the number of submissions."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import QuerySet

from pipeline.models import Domain

from .models import EvaluationRun, PairScore, RunStatus

SORT_KEYS = {
    "accuracy": lambda r: r["accuracy"],
    "date": lambda r: r["finished_at"].timestamp() if r["finished_at"] else 0,
    "name": lambda r: r["display_name"].lower(),
    "parameters": lambda r: r["parameters"] or 0,
    **{f"domain:{d}": (lambda r, d=d: (r["by_domain"].get(d) or {}).get("accuracy", -1)) for d in Domain.values},
}


def succeeded_runs(*, benchmark: str | None = None, kind: str | None = None,
                   setting: str | None = None) -> QuerySet[EvaluationRun]:
    runs = (EvaluationRun.objects.filter(status=RunStatus.SUCCEEDED)
            .select_related("submission__benchmark", "submission__owner"))
    if benchmark:
        runs = runs.filter(submission__benchmark__name=benchmark)
    if kind:
        runs = runs.filter(submission__kind=kind)
    if setting:
        runs = runs.filter(setting=setting)
    return runs


def leaderboard_rows(*, benchmark: str | None = None, kind: str | None = None, setting: str | None = None,
                     domain: str | None = None, sort: str = "accuracy", descending: bool = True) -> list[dict[str, Any]]:
    """One row per succeeded (submission, setting), with significance-group ranks computed
    within each (benchmark, setting[, domain]) from the per-pair results."""
    runs = list(succeeded_runs(benchmark=benchmark, kind=kind, setting=setting))
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
            "owner": s.owner.get_username(), "finished_at": run.finished_at,
            "accuracy": scope.get("accuracy"), "ci_low": scope.get("ci_low"), "ci_high": scope.get("ci_high"),
            "n": scope.get("n"), "tie_rate": scope.get("tie_rate"),
            "by_domain": m.get("by_domain") or {},
        })
    _attach_groups(rows, domain=domain)
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
