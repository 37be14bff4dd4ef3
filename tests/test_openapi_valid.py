"""The API document is valid OpenAPI 3.0.3 (`manage.py spectacular --validate`): the reward-model
kinds' option schemas are exported in 3.0.3's dialect."""

import re

import pytest
import yaml
from django.core.management import call_command

from prblib.rewards.options import _openapi30, options_json_schema


@pytest.mark.django_db
def test_spectacular_validate_passes(tmp_path):
    out = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))  # raises when invalid
    document = yaml.safe_load(out.read_text())
    assert document["openapi"].startswith("3.0")
    assert not re.search(r"^\s*const:", out.read_text(), flags=re.M)  # JSON Schema 2020's, not 3.0.3's


def test_the_pgenrm_preset_is_a_one_value_enum():
    preset = options_json_schema("pgenrm")["properties"]["preset"]
    assert (preset["enum"], preset["nullable"], preset["type"]) == (["paper"], True, "string")
    assert "const" not in preset


def test_json_schema_2020_words_become_openapi_30_words():
    assert _openapi30({"const": 3}) == {"enum": [3]}
    assert _openapi30({"type": "number", "exclusiveMinimum": 0}) == {"type": "number", "minimum": 0,
                                                                     "exclusiveMinimum": True}
    assert _openapi30({"type": "array", "items": {"const": "a"}}) == {"type": "array", "items": {"enum": ["a"]}}
    assert _openapi30({"anyOf": [{"const": "x"}, {"type": "integer", "exclusiveMaximum": 9}]}) == {
        "anyOf": [{"enum": ["x"]}, {"type": "integer", "maximum": 9, "exclusiveMaximum": True}]}
