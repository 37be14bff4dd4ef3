"""Request-level input checks shared by every page and API view (the row-level layer is
`prblib.rows`).

- RefuseBadCharactersMiddleware: a NUL character (or a lone surrogate) anywhere in the path or
  the query string is answered 400 with one line (JSON {"detail"} on the API), before any view
  or database sees it: neither PostgreSQL nor SQLite text can hold NUL, so such a lookup would
  otherwise end in a 500.
- query_int, query_choice, query_bool: an integer, one of a list, or a boolean query parameter,
  or a 400 naming it and what it takes (not a ValueError, not a 500, never a silent default).
- LinkField, LinkFormField: a submission's link, on the API and the submit form: an http(s)
  address matching LINK_PATTERN (the OpenAPI schema's `pattern` too).
- JSONBodyParser: every API view's JSON parser (REST_FRAMEWORK's DEFAULT_PARSER_CLASSES, and
  the views that name their parsers): the body is read by `prblib.rows.load_json` (nesting
  at most MAX_JSON_DEPTH, number literals at most MAX_JSON_NUMBER_CHARS characters, no NaN or
  Infinity) and must be a JSON object; anything else is a 400 {"detail": reason}.
- BoundedJSONField: Django's forms.JSONField within the same limits (a form error naming the
  limit), also when the bound form is shown again with the text as typed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django import forms
from django.core.exceptions import ValidationError as FormValidationError
from django.core.validators import RegexValidator
from django.http import HttpResponseBadRequest
from rest_framework import serializers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser, get_encoding

from core.errors import error_answer, is_api
from prblib.rows import (MAX_BIGINT, MAX_INT, JSONSyntaxError, RowError, bad_char_reason, check_text, load_json,
                              type_name)

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
                detail = f"Bad request: the {where} {reason}."
                if is_api(request):
                    return error_answer(request, 400, title="Bad request", detail=detail)
                return HttpResponseBadRequest(f"{detail}\n".encode(), content_type="text/plain; charset=utf-8")
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


_TRUE, _FALSE = {"1", "t", "true", "y", "yes", "on"}, {"0", "f", "false", "n", "no", "off"}


def query_choice(params, name: str, choices: Sequence[str]) -> str | None:
    """The query parameter `name` when it is one of `choices` (None when absent or empty); DRF
    ValidationError (400 {"name": ["Must be one of: a, b."]}) for any other value."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    if raw not in choices:
        raise ValidationError({name: [f"Must be one of: {', '.join(choices)}."]})
    return raw


def query_bool(params, name: str) -> bool:
    """The boolean query parameter `name` (False when absent or empty): true/false, 1/0, yes/no,
    on/off, t/f or y/n in any case; DRF ValidationError (400 naming them) for anything else."""
    raw = params.get(name)
    if raw in (None, ""):
        return False
    if raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    raise ValidationError({name: [f"Expected true or false (or 1 or 0), got {raw[:40]!r}."]})


# A submission's link (shown on the leaderboard, the model page and the API): an http(s) address
# with a dotted host name whose every other character is one RFC 3986 lets a URI hold unescaped,
# so no spaces, quotes, < > { } | \ ^ or `. The form and the API check it with this pattern, and
# the OpenAPI schema documents the same one.
LINK_MAX_LENGTH = 200  # Submission.link's column
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
LINK_PATTERN = (r"^https?://(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}(?::[0-9]{1,5})?"
                rf"(?:/(?:{_URI_CHAR}|/)*)?(?:\?(?:{_URI_CHAR}|[/?])*)?(?:#(?:{_URI_CHAR}|[/?])*)?$")
link_validator = RegexValidator(LINK_PATTERN, "Enter an http:// or https:// address with a host name, and no "
                                              "spaces or any of < > \" { } | \\ ^ ` in it.", code="link")


class LinkField(serializers.CharField):
    """The API's `link`: blank, or an address matching LINK_PATTERN."""

    def __init__(self, **kwargs):
        super().__init__(max_length=LINK_MAX_LENGTH, validators=[link_validator], trim_whitespace=False, **kwargs)


class LinkFormField(forms.URLField):
    """The submit form's `link`: Django's URLField (an address typed without a scheme gets
    https://), checked against LINK_PATTERN alone."""

    default_validators = [link_validator]

    def __init__(self, **kwargs):
        super().__init__(max_length=LINK_MAX_LENGTH, assume_scheme="https", **kwargs)


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
        try:  # a NUL or a lone surrogate (JSON's "\ud800") in any string or key cannot be stored
            check_text(data)
        except RowError as exc:
            raise ParseError(f"Request body{f' field {exc.field}' if exc.field else ''}: {exc.reason}.") from None
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


__all__ = ["LINK_PATTERN", "MAX_ID", "MAX_INT", "BoundedJSONField", "JSONBodyParser", "LinkField", "LinkFormField",
           "RefuseBadCharactersMiddleware", "link_validator", "query_bool", "query_choice", "query_int"]
