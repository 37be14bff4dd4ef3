"""Request-level input checks shared by every page and API view (the row-level layer is
`pipeline.ml.rows`).

- RefuseBadCharactersMiddleware: a NUL character (or a lone surrogate) anywhere in the path or
  the query string is answered 400 with one line, before any view or database sees it: neither
  PostgreSQL nor SQLite text can hold NUL, so such a lookup would otherwise end in a 500.
- query_int: an integer query parameter, or a 400 naming it (not a ValueError, not a 500).
- JSONBodyParser: every API view's JSON parser (REST_FRAMEWORK's DEFAULT_PARSER_CLASSES, and
  the views that name their parsers): the body is read by `pipeline.ml.rows.load_json` (nesting
  at most MAX_JSON_DEPTH, number literals at most MAX_JSON_NUMBER_CHARS characters, no NaN or
  Infinity) and must be a JSON object; anything else is a 400 {"detail": reason}.
- BoundedJSONField: Django's forms.JSONField within the same limits (a form error naming the
  limit), also when the bound form is shown again with the text as typed.
"""

from __future__ import annotations

import json

from django import forms
from django.core.exceptions import ValidationError as FormValidationError
from django.http import HttpResponseBadRequest
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser, get_encoding

from pipeline.ml.rows import MAX_BIGINT, MAX_INT, JSONSyntaxError, RowError, bad_char_reason, load_json, type_name

# Ids are BigAutoField: anything longer cannot be one.
MAX_ID = MAX_BIGINT


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


class JSONBodyParser(JSONParser):
    """DRF's JSON parser with the limits of `load_json`; a body that is not a JSON object is
    refused too (every endpoint takes an object), so no view meets a list or a number."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})  # text codecs only (a 400 for bz2_codec and the like)
        try:
            text = stream.read().decode(encoding)
        except UnicodeDecodeError:
            raise ParseError(f"Request body: not valid {encoding} text.") from None
        try:
            data = load_json(text)
        except RowError as exc:
            raise ParseError(f"Request body: {exc.reason}.") from None
        if not isinstance(data, dict):
            raise ParseError(f"Request body: must be a JSON object, not {type_name(data)}.")
        return data


class BoundedJSONDecoder(json.JSONDecoder):
    """A json.JSONDecoder with `load_json`'s limits: past them, a JSONDecodeError whose msg is the reason."""

    def decode(self, s, _w=None):
        try:
            return load_json(s)
        except RowError as exc:
            raise json.JSONDecodeError(exc.reason, s, 0) from None


class BoundedJSONField(forms.JSONField):
    """forms.JSONField read by `load_json`: JSON past a limit is a form error that names it;
    text that is not JSON keeps Django's own message."""

    def __init__(self, **kwargs):
        if kwargs.get("decoder") is None:  # a model's JSONField passes decoder=None
            kwargs["decoder"] = BoundedJSONDecoder
        super().__init__(**kwargs)

    def to_python(self, value):
        if isinstance(value, str) and value not in self.empty_values and not self.disabled:
            try:
                load_json(value)
            except JSONSyntaxError:
                pass  # "Enter a valid JSON."
            except RowError as exc:
                raise FormValidationError(f"{exc.reason[:1].upper()}{exc.reason[1:]}.", code="invalid") from None
        return super().to_python(value)


__all__ = ["MAX_ID", "MAX_INT", "BoundedJSONField", "JSONBodyParser", "RefuseBadCharactersMiddleware",
           "query_int"]


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
