"""Request-level input checks shared by every page and API view (the row-level layer is
`pipeline.ml.rows`).

- RefuseBadCharactersMiddleware: a NUL character (or a lone surrogate) anywhere in the path or
  the query string is answered 400 with one line, before any view or database sees it: neither
  PostgreSQL nor SQLite text can hold NUL, so such a lookup would otherwise end in a 500.
- query_int: an integer query parameter, or a 400 naming it (not a ValueError, not a 500).
"""

from __future__ import annotations

from django.http import HttpResponseBadRequest
from rest_framework.exceptions import ValidationError

from pipeline.ml.rows import MAX_INT, bad_char_reason

# Ids are BigAutoField: anything longer cannot be one.
MAX_ID = 2**63 - 1


class RefuseBadCharactersMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        for where, value in (("path", request.path), *(
                (f"query parameter '{key}'", text) for key, values in request.GET.lists()
                for text in (key, *values))):
            reason = bad_char_reason(value)
            if reason:
                return HttpResponseBadRequest(f"Bad request: the {where} {reason}.\n".encode(),
                                              content_type="text/plain; charset=utf-8")
        return self.get_response(request)


def query_int(params, name: str, *, required: bool = False, low: int = 0, high: int = MAX_ID) -> int | None:
    """The integer query parameter `name` (None when absent and not required); DRF ValidationError
    (400 {"name": [reason]}) when missing, not a whole number, or outside [low, high]."""
    raw = params.get(name)
    if raw in (None, ""):
        if required:
            raise ValidationError({name: ["This query parameter is required."]})
        return None
    text = raw.strip()
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 20:
        raise ValidationError({name: [f"Expected a whole number, got {raw[:40]!r}."]})
    value = int(text)
    if not low <= value <= high:
        raise ValidationError({name: [f"Must be between {low} and {high}."]})
    return value


__all__ = ["MAX_ID", "MAX_INT", "RefuseBadCharactersMiddleware", "query_int"]


ERROR_RESPONSES = {
    "400": "Malformed input: the body names the field or parameter and the reason.",
    "401": "No valid credentials (send `Authorization: Token KEY`).",
    "403": "Signed in without the role this needs.",
    "404": "No such object, or not visible to you.",
}


def document_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: every operation documents the 400/401/403/404 answers
    any request can get (malformed input, the NUL guard, authentication, permissions, lookups),
    with a JSON body {"detail": reason} or {field: [reasons]}, unless it documents its own."""
    error = {"type": "object", "additionalProperties": True,
             "properties": {"detail": {"type": "string"}, "field": {"type": "string"}}}
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = error
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            for code, description in ERROR_RESPONSES.items():
                responses.setdefault(code, {"description": description, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
    return result
