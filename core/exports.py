"""One writer for every file export (CSV or JSON lines), and the DRF renderers that let API
export endpoints take the documented `?format=csv|jsonl`.

CSV cells a spreadsheet would run as a formula (a leading `=`, `+`, `-`, `@`, `|`, `%`, tab or
carriage return) are neutralised by prefixing an apostrophe: defusedcsv does it for the first
six (and leaves numbers, including negative ones, as numbers); tab and carriage return are
added here. JSON lines are strict JSON (no NaN or Infinity tokens).

DRF reserves the `format` query parameter for choosing a renderer and answers 404 when none has
that format; export views therefore list CSVRenderer and JSONLinesRenderer, then read the
chosen format from `request.accepted_renderer.format`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from defusedcsv import csv
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response

FORMATS = ("csv", "jsonl")
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
_EXTRA_FORMULA_STARTS = ("\t", "\r")


class _Echo:
    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_EXTRA_FORMULA_STARTS):
        return "'" + value
    return value


def csv_lines(rows: Iterable[dict[str, Any]], fields: Sequence[str]) -> Iterator[str]:
    """The header line, then one line per row (missing keys empty), formula-safe."""
    writer = csv.writer(_Echo())
    yield writer.writerow(fields)
    for row in rows:
        yield writer.writerow([_cell(row.get(name, "")) for name in fields])


def jsonl_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One strict JSON object per line (ValueError on a NaN or infinity rather than a bad token)."""
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"


def export_response(rows: Iterable[dict[str, Any]], *, fields: Sequence[str], fmt: str,
                    filename: str) -> StreamingHttpResponse:
    """A streamed download of `rows` as `<filename>.<fmt>` (fmt: "csv" or "jsonl")."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    body = csv_lines(rows, fields) if fmt == "csv" else jsonl_lines(rows)
    response = StreamingHttpResponse(body, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    return response


class _ExportRenderer(BaseRenderer):
    """Selected by `?format=` (or the Accept header); the view streams the body itself, and
    errors are rendered as JSON (JSONErrorsMixin), so this renders nothing of its own."""

    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return (json.dumps(data, ensure_ascii=False, allow_nan=False, default=str) + "\n").encode()


class JSONErrorsMixin:
    """For API views with export renderers: an error answer (status >= 400, a DRF Response) is
    rendered as JSON, `application/json` with {"detail": reason} or {field: [reasons]}, whatever
    format the request asked for, so a client reads every API error the same way."""

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


class CSVRenderer(_ExportRenderer):
    media_type = "text/csv"
    format = "csv"


class JSONLinesRenderer(_ExportRenderer):
    media_type = "application/x-ndjson"
    format = "jsonl"


EXPORT_RENDERERS = (JSONLinesRenderer, CSVRenderer)


# What an export endpoint answers, for the OpenAPI schema.
EXPORT_SCHEMA_RESPONSES = {
    (200, "application/x-ndjson"): OpenApiResponse(str, description="One JSON object per line (format=jsonl)."),
    (200, "text/csv"): OpenApiResponse(str, description="A header line, then one row per line (format=csv)."),
    # Errors are JSON whatever the format asked for (JSONErrorsMixin).
    400: OpenApiResponse(description="A query parameter is malformed; the body names it."),
    403: OpenApiResponse(description="Not signed in, or not allowed to read this export."),
    404: OpenApiResponse(description="No such object, or a format other than csv or jsonl."),
}
