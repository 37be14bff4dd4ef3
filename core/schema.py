"""The OpenAPI document (/api/schema/, drf-spectacular) as the API behaves, for every role:
tests/test_api_fuzz.py checks generated requests against it with schemathesis, and
tests/test_schema_truth.py pins each rule below.

- AutoSchema (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS): a view with throttles documents its 429
  (JSON {"detail"}, the wait in Retry-After); a writable text field (DRF's CharField) documents
  that it refuses NUL characters and, where it refuses a blank value after trimming whitespace,
  that it needs a character that is not whitespace (besides the minLength 1 that
  COMPONENT_SPLIT_REQUEST gives request fields).
- document_error_responses (a postprocessing hook): every operation documents the 400, 401, 403
  and 404 any request can get (malformed input and the NUL guard, credentials, roles, lookups),
  and the 415 of a body in a media type it does not read,
  every error response has the JSON body {"detail": reason} or {field: [reasons]}, optional
  query parameters allow an empty value (`?name=` is read as absent), and text parameters
  refuse NUL (core.validation.RefuseBadCharactersMiddleware).
"""

from __future__ import annotations

import sys

from drf_spectacular import openapi
from rest_framework import serializers

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA = {"type": "object", "additionalProperties": True,
                "properties": {"detail": {"type": "string"}, "field": {"type": "string"}}}
ERROR_RESPONSES = {
    "400": "Malformed input: the body names the field or parameter and the reason.",
    "401": "No valid credentials (send `Authorization: Token KEY`).",
    "403": "Signed in without the role this needs.",
    "404": "No such object, or not visible to you.",
}
THROTTLED_RESPONSE = {
    "description": "Too many attempts: `detail` and Retry-After say how many seconds to wait.",
    "headers": {"Retry-After": {"description": "Seconds to wait before the next attempt.", "required": True,
                                "schema": {"type": "integer", "minimum": 1}}},
    "content": {"application/json": {"schema": ERROR_REF}},
}
# The characters str.strip() removes (str.isspace), as one ECMA-262 character class: DRF's
# CharField strips them before its blank check, so a value made of them only is refused.
def _character_class(codes: list[int]) -> str:
    runs: list[list[int]] = []
    for code in codes:
        if runs and code == runs[-1][1] + 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs)


_WHITESPACE = _character_class([c for c in range(sys.maxunicode + 1) if chr(c).isspace()])
# DRF's CharField refuses NUL characters, and so does the NUL guard in every path and query value.
NO_NUL = "^[^\\u0000]*$"
NO_NUL_NOT_ONLY_WHITESPACE = f"^[^\\u0000]*[^\\u0000{_WHITESPACE}][^\\u0000]*$"


class AutoSchema(openapi.AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if self.view.get_throttles():
            responses.setdefault("429", THROTTLED_RESPONSE)
        return responses

    def _insert_field_validators(self, field, schema):
        super()._insert_field_validators(field, schema)
        if (isinstance(field, serializers.CharField) and not field.read_only and schema.get("type") == "string"
                and not {"pattern", "format", "enum"} & set(schema)):
            blank_refused = not field.allow_blank and field.trim_whitespace and schema.get("minLength") == 1
            schema["pattern"] = NO_NUL_NOT_ONLY_WHITESPACE if blank_refused else NO_NUL


def document_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: the error answers and empty query values above."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            for code, description in ERROR_RESPONSES.items():
                responses.setdefault(code, {"description": description})
            if "requestBody" in operation:
                responses.setdefault("415", {"description": "A body in a media type this operation does not read "
                                                            "(requestBody lists those it reads)."})
            for code, response in responses.items():
                if str(code)[:1] in "45":
                    response.setdefault("content", {"application/json": {"schema": ERROR_REF}})
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query" and not parameter.get("required"):
                    parameter["allowEmptyValue"] = True
                schema = parameter.get("schema", {})
                if schema.get("type") == "string" and not {"pattern", "format", "enum"} & set(schema):
                    schema["pattern"] = NO_NUL
    return result
