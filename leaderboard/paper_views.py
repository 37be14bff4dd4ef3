"""The paper's table (`/paper/`, downloads as LaTeX, Markdown and CSV). A public page: it shows what the
viewer may see of the leaderboard (published results; their own and, for staff, all), aggregates only."""

from __future__ import annotations

from django.http import Http404, HttpResponse
from django.shortcuts import render

from core import exports

from . import paper as paper_service

CONTENT_TYPES = {"tex": "application/x-tex; charset=utf-8", "md": "text/markdown; charset=utf-8"}


def _table(request) -> dict:
    return paper_service.paper_table(benchmark=request.GET.get("benchmark") or None, viewer=request.user)


def paper(request):
    """The table on a page: CIs beneath each figure, marks explained under the table."""
    table = _table(request)
    columns = [(s["name"], c["domain"]) for s in table["settings"] for c in s["columns"]]
    for group in table["groups"]:
        for row in group["rows"]:
            row["cell_list"] = [row["cells"].get(setting, {}).get(domain) for setting, domain in columns]
            row["avg_text"] = paper_service.percent(row["avg"])
            for cell in row["cell_list"]:
                if cell is not None:
                    cell.update(text=paper_service.percent(cell["accuracy"]),
                                ci_low_text=paper_service.percent(cell["ci_low"]),
                                ci_high_text=paper_service.percent(cell["ci_high"]))
                    cell["symbols"] = "".join(paper_service.SYMBOLS[m][0] for m in cell["marks"]
                                              if m in paper_service.SYMBOLS)
    return render(request, "leaderboard/paper.html", {
        "table": table, "column_count": len(columns) + 2, "latex": paper_service.table_latex(table),
        "query": request.GET.urlencode()})


def paper_export(request, fmt: str):
    """The same table as LaTeX (booktabs), Markdown or CSV (formula-safe)."""
    table = _table(request)
    name = f"paper-table-{table['benchmark'] or 'none'}"
    if fmt == "csv":
        return exports.export_response(paper_service.table_rows(table), fields=paper_service.table_fields(table),
                                       fmt="csv", filename=name)
    if fmt not in CONTENT_TYPES:
        raise Http404("unknown format")
    body = paper_service.table_latex(table) if fmt == "tex" else paper_service.table_markdown(table)
    response = HttpResponse(body, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response
