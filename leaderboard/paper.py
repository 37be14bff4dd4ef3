"""The paper's table: every reward model's accuracy by setting and domain, grouped by RM type, as the
Personalized RewardBench paper lays it out, with downloads a paper can use (LaTeX booktabs, Markdown,
CSV; one content, three spellings).

Rows. One per submission with at least one succeeded run on the benchmark that the viewer may see
(`selectors.succeeded_runs`), grouped by RM type (`presets.rm_type_of`: the submission's preset,
else its kind) in the order of `presets.RM_TYPES`, and sorted within a group by the overall average.
Figures reported elsewhere (`import_benchmark_scores` rows naming this benchmark, with their source,
e.g. "paper, Table 2") come in rows of their own marked "reported", after our rows of their group;
they are never ranked or compared with ours and carry no significance marks.

Columns. For each setting (without profile, with profile, with plan) one column per domain of the
benchmark, then "All": the accuracy over all pairs of the setting (the leaderboard's figure); then
"Avg": the mean of the settings' "All" figures (only where the row has every setting shown). A cell
holds the accuracy (percent, one decimal) and its 95% CI (the run's bootstrap percentile interval
over pairs, `metrics.by_domain[domain]` or the run's own), shown beneath on the page and in the
exports as [low, high].

Significance marks (two-sided, alpha = 0.05; computed from per-pair outcomes, of which nothing per
pair is shown):
- bold: the highest accuracy of the column among our rows;
- dagger: the row is in the column's top significance group: not significantly worse than the
  column's best (exact McNemar test on the pairs every row of the column was scored on,
  Holm-corrected over the leader's comparisons: `prblib.stats.metrics.significance_groups`). Shown
  only where the column has two rows or more;
- up / down arrow (profile and plan settings): significantly better / worse than the same RM without
  profile on the same pairs of that domain (exact McNemar test, `paired_comparison`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from pipeline.domains import SHORT_LABELS
from pipeline.models import Benchmark, Domain
from prblib.stats.metrics import paired_comparison, significance_groups
from prblib.rewards import presets
from prblib import registry

from .models import ExternalBenchmarkScore, PairScore
from .selectors import succeeded_runs

ALPHA = 0.05
ALL = "all"
BASELINE = "no_profile"
MARKS = {
    "best": "the highest accuracy of the column among our models (bold)",
    "top": "not significantly worse than the column's best: its top significance group (exact McNemar test, "
           "Holm-corrected, alpha 0.05)",
    "up": "significantly better than the same model without profile on the same pairs (exact McNemar, alpha 0.05)",
    "down": "significantly worse than the same model without profile on the same pairs (exact McNemar, alpha 0.05)",
}
SYMBOLS = {"top": ("†", r"\dag"), "up": ("▲", r"\uparrow"), "down": ("▼", r"\downarrow")}


def _domain_label(domain: str) -> str:
    return "All" if domain == ALL else SHORT_LABELS.get(domain, domain)


def paper_table(*, benchmark: str | None = None,
                viewer: AbstractBaseUser | AnonymousUser | None = None) -> dict[str, Any]:
    """The table of `benchmark` (default: the first benchmark, by name, with a result the viewer may see).

    Returns {benchmark, benchmarks (names with results), settings [{name, label, columns [{domain,
    label}]}], groups [{rm_type, label, rows [{name, kind, preset, reported, source, cells {setting:
    {domain: cell}}, avg}]}], marks (MARKS)}; a cell is {accuracy, ci_low, ci_high, n, marks [..]}
    or None (not run), accuracies as fractions."""
    runs_all = list(succeeded_runs(viewer=viewer).order_by("submission__benchmark__name", "pk"))
    benchmarks = sorted({run.submission.benchmark.name for run in runs_all} |
                        set(ExternalBenchmarkScore.objects.filter(
                            benchmark__in=Benchmark.objects.values("name"), setting__in=registry.setting_names())
                            .values_list("benchmark", flat=True)))
    name = benchmark if benchmark else (benchmarks[0] if benchmarks else None)
    runs = [run for run in runs_all if run.submission.benchmark.name == name]
    bench = Benchmark.objects.filter(name=name).first() if name else None
    domains = ([d for d in Domain.values if bench.items.filter(domain=d).exists()] if bench else [])
    reported = list(ExternalBenchmarkScore.objects.filter(benchmark=name, setting__in=registry.setting_names())
                    .order_by("source", "rm_name")) if name else []
    used = {run.setting for run in runs} | {r.setting for r in reported}
    settings = [{"name": s.name, "label": s.label,
                 "columns": [{"domain": d, "label": _domain_label(d)} for d in [*domains, ALL]]}
                for s in registry.SETTINGS if s.name in used]

    by_submission: dict[int, dict[str, Any]] = {}
    for run in runs:
        s = run.submission
        row = by_submission.setdefault(s.pk, {
            "key": f"submission:{s.pk}", "submission_id": s.pk, "name": s.display_name,
            "rm": f"{s.owner.get_username()}/{s.display_name}", "kind": s.kind,
            "preset": (s.options or {}).get("model_preset") or "", "reported": False, "source": "",
            "rm_type": presets.rm_type_of(s.kind, s.options), "cells": {}, "runs": {}})
        row["runs"][run.setting] = run.pk
        metrics = run.metrics or {}
        cells = row["cells"].setdefault(run.setting, {})
        for d in domains:
            scope = (metrics.get("by_domain") or {}).get(d)
            if scope and scope.get("accuracy") is not None:
                cells[d] = _cell(scope)
        if metrics.get("accuracy") is not None:
            cells[ALL] = _cell(metrics)
    rows = list(by_submission.values())
    _mark(rows, domains)

    external: dict[tuple, dict[str, Any]] = {}
    for r in reported:
        key = (r.source, r.submission_id, r.rm_name)
        row = external.setdefault(key, {
            "key": f"reported:{r.source}:{r.rm_name}", "submission_id": r.submission_id, "name": r.rm_name,
            "rm": r.rm_name, "kind": "", "preset": "", "reported": True, "source": r.source,
            "rm_type": r.rm_type or "other", "cells": {}, "runs": {}})
        row["cells"].setdefault(r.setting, {})[r.domain or ALL] = {
            "accuracy": r.accuracy, "ci_low": None, "ci_high": None, "n": None, "marks": []}

    shown = [s["name"] for s in settings]
    for row in [*rows, *external.values()]:
        alls = [row["cells"].get(s, {}).get(ALL) for s in shown]
        row["avg"] = (sum(c["accuracy"] for c in alls) / len(alls)) if alls and all(alls) else None
        row.pop("runs", None)
    groups = []
    for rm_type, label in presets.RM_TYPES:
        ours = sorted((r for r in rows if r["rm_type"] == rm_type),
                      key=lambda r: (-(r["avg"] if r["avg"] is not None else -1), r["name"].lower()))
        theirs = sorted((r for r in external.values() if r["rm_type"] == rm_type), key=lambda r: r["name"].lower())
        if ours or theirs:
            groups.append({"rm_type": rm_type, "label": label, "rows": [*ours, *theirs]})
    return {"benchmark": name, "benchmarks": benchmarks, "settings": settings, "groups": groups, "marks": MARKS}


def _cell(scope: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": scope.get("accuracy"), "ci_low": scope.get("ci_low"), "ci_high": scope.get("ci_high"),
            "n": scope.get("n"), "marks": []}


def _mark(rows: list[dict[str, Any]], domains: list[str]) -> None:
    """Bold, dagger and arrows (see the module docstring) from the per-pair outcomes of `rows`' runs."""
    run_ids = [pk for row in rows for pk in row["runs"].values()]
    if not run_ids:
        return
    outcomes: dict[int, dict[int, tuple[str, bool]]] = defaultdict(dict)
    for run_id, item_id, domain, correct in (PairScore.objects.filter(run_id__in=run_ids)
                                             .values_list("run_id", "item_id", "item__domain", "correct")
                                             .iterator(chunk_size=5000)):
        outcomes[run_id][item_id] = (domain, correct)

    def scoped(run_id: int, domain: str) -> dict[int, bool]:
        return {item: ok for item, (d, ok) in outcomes[run_id].items() if domain == ALL or d == domain}

    for setting in {s for row in rows for s in row["runs"]}:
        for domain in [*domains, ALL]:
            present = [r for r in rows if domain in r["cells"].get(setting, {}) and setting in r["runs"]]
            if not present:
                continue
            best = max(r["cells"][setting][domain]["accuracy"] for r in present)
            for r in present:
                if r["cells"][setting][domain]["accuracy"] == best:
                    r["cells"][setting][domain]["marks"].append("best")
            if len(present) > 1:
                per_run = {r["key"]: scoped(r["runs"][setting], domain) for r in present}
                common = sorted(set.intersection(*(set(v) for v in per_run.values())))
                if common:
                    groups = significance_groups({k: [v[i] for i in common] for k, v in per_run.items()},
                                                 alpha=ALPHA)
                    for r in present:
                        if groups.get(r["key"]) == 1:
                            r["cells"][setting][domain]["marks"].append("top")
            if setting == BASELINE:
                continue
            for r in present:
                if BASELINE not in r["runs"]:
                    continue
                here, base = scoped(r["runs"][setting], domain), scoped(r["runs"][BASELINE], domain)
                common = sorted(set(here) & set(base))
                if not common:
                    continue
                test = paired_comparison([here[i] for i in common], [base[i] for i in common], resamples=200)
                if test["p_value"] is not None and test["p_value"] < ALPHA and test["diff"]:
                    r["cells"][setting][domain]["marks"].append("up" if test["diff"] > 0 else "down")


# --- the three spellings of one table -----------------------------------------------------------

def percent(value: float | None) -> str:
    """A fraction as the table writes it: percent with one decimal ("" for None)."""
    return "" if value is None else f"{100 * value:.1f}"


_pct = percent


def _columns(table: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(setting, domain, heading) of every cell column, in order."""
    return [(s["name"], c["domain"], f"{s['label']}: {c['label']}") for s in table["settings"] for c in s["columns"]]


def _row_name(row: dict[str, Any]) -> str:
    return f"{row['name']} (reported: {row['source']})" if row["reported"] else row["name"]


def table_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The CSV's rows: group, model, reported, source, preset, then per cell column its accuracy,
    CI bounds (percent) and marks, then avg: every figure the LaTeX and Markdown tables show."""
    out = []
    for group in table["groups"]:
        for row in group["rows"]:
            line = {"group": group["label"], "model": row["name"], "reported": "yes" if row["reported"] else "",
                    "source": row["source"], "preset": row["preset"]}
            for setting, domain, _ in _columns(table):
                cell = row["cells"].get(setting, {}).get(domain)
                prefix = f"{setting}:{domain}"
                line[prefix] = _pct(cell["accuracy"]) if cell else ""
                line[f"{prefix}:ci_low"] = _pct(cell["ci_low"]) if cell else ""
                line[f"{prefix}:ci_high"] = _pct(cell["ci_high"]) if cell else ""
                line[f"{prefix}:marks"] = " ".join(cell["marks"]) if cell else ""
            line["avg"] = _pct(row["avg"])
            out.append(line)
    return out


def table_fields(table: dict[str, Any]) -> list[str]:
    fields = ["group", "model", "reported", "source", "preset"]
    for setting, domain, _ in _columns(table):
        prefix = f"{setting}:{domain}"
        fields += [prefix, f"{prefix}:ci_low", f"{prefix}:ci_high", f"{prefix}:marks"]
    return [*fields, "avg"]


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters written as text (so a model name cannot run a command)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _latex_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "--"
    value = _pct(cell["accuracy"])
    if "best" in cell["marks"]:
        value = rf"\textbf{{{value}}}"
    marks = "".join(SYMBOLS[m][1] for m in cell["marks"] if m in SYMBOLS)
    if marks:
        value += rf"$^{{{marks}}}$"
    if cell["ci_low"] is not None and cell["ci_high"] is not None:
        value += rf" {{\scriptsize[{_pct(cell['ci_low'])}, {_pct(cell['ci_high'])}]}}"
    return value


def table_latex(table: dict[str, Any]) -> str:
    """A booktabs table (needs \\usepackage{booktabs}): one column group per setting (cmidrule), a
    midrule and a group heading per RM type; reported rows say so after the name."""
    columns = _columns(table)
    lines = [f"% Personalized RewardBench: {latex_escape(table['benchmark'] or '')}; accuracy (%) with 95% CI",
             r"% \textbf{}: best of the column; $^{\dag}$: top significance group (exact McNemar, Holm, 0.05);",
             r"% $^{\uparrow}$/$^{\downarrow}$: significantly better/worse than without profile (exact McNemar, 0.05)",
             r"\begin{tabular}{l" + "c" * (len(columns) + 1) + "}", r"\toprule"]
    heads, rules, at = ["Model"], [], 2
    for s in table["settings"]:
        span = len(s["columns"])
        heads.append(rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(s['label'])}}}")
        rules.append(rf"\cmidrule(lr){{{at}-{at + span - 1}}}")
        at += span
    heads.append("Avg")
    lines.append(" & ".join(heads) + r" \\")
    if rules:
        lines.append(" ".join(rules))
    lines.append(" & ".join(["", *(latex_escape(c["label"]) for s in table["settings"] for c in s["columns"]), ""])
                 + r" \\")
    for group in table["groups"]:
        lines.append(r"\midrule")
        lines.append(rf"\multicolumn{{{len(columns) + 2}}}{{l}}{{\textit{{{latex_escape(group['label'])}}}}} \\")
        for row in group["rows"]:
            cells = [_latex_cell(row["cells"].get(setting, {}).get(domain)) for setting, domain, _ in columns]
            lines.append(" & ".join([latex_escape(_row_name(row)), *cells, _pct(row["avg"]) or "--"]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _markdown_escape(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def _markdown_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    value = _pct(cell["accuracy"])
    if "best" in cell["marks"]:
        value = f"**{value}**"
    value += "".join(SYMBOLS[m][0] for m in cell["marks"] if m in SYMBOLS)
    if cell["ci_low"] is not None and cell["ci_high"] is not None:
        value += f" [{_pct(cell['ci_low'])}, {_pct(cell['ci_high'])}]"
    return value


def table_markdown(table: dict[str, Any]) -> str:
    """The same table as GitHub Markdown: one heading row (setting: domain), a group row per RM type."""
    columns = _columns(table)
    lines = [f"Personalized RewardBench: {_markdown_escape(table['benchmark'] or '')}. Accuracy (%) with 95% CI. "
             "**bold**: best of the column; †: top significance group (exact McNemar, Holm, 0.05); ▲/▼: "
             "significantly better/worse than without profile (exact McNemar, 0.05).", "",
             "| " + " | ".join(["Model", *(_markdown_escape(h) for _, _, h in columns), "Avg"]) + " |",
             "|" + "---|" * (len(columns) + 2)]
    for group in table["groups"]:
        lines.append("| " + " | ".join([f"*{_markdown_escape(group['label'])}*", *[""] * (len(columns) + 1)]) + " |")
        for row in group["rows"]:
            cells = [_markdown_cell(row["cells"].get(setting, {}).get(domain)) for setting, domain, _ in columns]
            lines.append("| " + " | ".join([_markdown_escape(_row_name(row)), *cells, _pct(row["avg"]) or "–"]) + " |")
    return "\n".join(lines) + "\n"
