"""Reasoning reward models' answers (issue 30): RM-R1's <answer>[[A]]</answer>, R3's JSON score per task
format, thinking blocks before either, and what is a parse failure. Every expected value is written here."""

import json

import pytest

from prblib.rewards import presets
from prblib.rewards import reasoning
from prblib.rewards.options import OptionsError, validate_options


@pytest.mark.parametrize("text,expected", [
    ("<type>Chat</type><rubric>r</rubric><eval>e</eval><answer>[[A]]</answer>", "A"),
    ("<answer>[[b]]</answer>", "B"),
    ("<answer> [[ B ]] </answer>\n", "B"),
    ("<answer>A</answer>", "A"),  # a bare letter inside the block
    ("<think>first <answer>[[B]]</answer></think>Then: <answer>[[A]]</answer>", "A"),  # thinking never counts
    ("thinking written by the template...</think><answer>[[B]]</answer>", "B"),
    ("<answer>[[A]]</answer> on reflection <answer>[[B]]</answer>", "B"),  # the last block is the verdict
    ("The better one is [[A]].", None),  # no answer block
    ("<answer>[[A]] or [[B]]</answer>", None),
    ("<answer>tie</answer>", None),
    ("<think>[[A]]</think>", None),
    ("", None), (None, None),
])
def test_rm_r1_verdicts(text, expected):
    assert reasoning.parse_rm_r1(text) == expected


@pytest.mark.parametrize("score,expected", [
    ("Assistant A", "A"), ("Assistant B", "B"), ("A", "A"), ("b", "B"), ("Response 1", "A"), ("Response 2", "B"),
    ("Response A", "A"), (1, "A"), (2, "B"), (2.0, "B"), ("**Response B**", "B"),
    (3, None), (1.5, None), (True, None), ("tie", None), ("A and B", None), (None, None), ([1], None),
])
def test_r3_pairwise_scores(score, expected):
    answer = "<think>weigh them</think>" + json.dumps({"explanation": "x {not json}", "score": score})
    assert reasoning.parse_r3_pairwise(answer) == expected


@pytest.mark.parametrize("text,expected", [
    ('{"explanation": "fine", "score": 4}', 4.0),
    ('```json\n{"explanation": "fine", "score": "3"}\n```', 3.0),
    ('Notes {"a": 1} then {"explanation": "e", "score": 5}', 5.0),  # the object with a score
    ('{"explanation": "e", "score": 2} revised: {"explanation": "e", "score": 1}', 1.0),  # the last one
    ('{"explanation": "e", "score": 6}', None),  # off the 1-5 scale
    ('{"explanation": "e", "score": NaN}', None),
    ('{"explanation": "e", "score": true}', None),
    ('{"explanation": "e"}', None),
    ("Score: 4", None),
    ('{"explanation": "cut short", "score": 4', None),
])
def test_r3_pointwise_scores(text, expected):
    assert reasoning.parse_r3_pointwise(text) == expected


@pytest.mark.parametrize("score,expected", [(True, 1.0), (False, 0.0), ("true", 1.0), ("False", 0.0), ("yes", 1.0),
                                            ("no", 0.0), (1, None), ("maybe", None)])
def test_r3_binary_scores(score, expected):
    assert reasoning.parse_r3_binary(json.dumps({"explanation": "e", "score": score})) == expected


def test_a_deeply_nested_reply_is_a_parse_failure_not_a_crash():
    assert reasoning.parse_r3_pairwise("[" * 100_000 + '{"score": "A"}') is None


def test_the_formats_are_our_words_with_the_families_structure():
    [system, user] = reasoning.pairwise_messages("rm-r1", context="Q?", question="Q?", first="one", second="two")
    assert "<rubric>" in system["content"] and "<answer>[[A]]</answer>" in system["content"]
    assert "=== Answer A ===\none" in user["content"] and "=== Answer B ===\ntwo" in user["content"]
    [message] = reasoning.pairwise_messages("r3", context="Q?", question="Q?", first="one", second="two")
    content = message["content"]
    for heading in ("### Task", "### Input\nQ?", "### Response A\none", "### Response B\ntwo", "### Evaluation rubric",
                    "### Output format"):
        assert heading in content
    [binary] = reasoning.pointwise_messages("r3-binary", context="Q?", question="Q?", response="one")
    assert '"score": <true or false>' in binary["content"]


def test_an_operator_template_replaces_the_words_in_the_sandbox(tmp_path):
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"system": "", "user": "Q: {{ question }}|A: {{ response_a }}|B: {{ response_b }}",
                                "syntax": "jinja2"}), encoding="utf-8")
    template = reasoning.OperatorTemplate(path, reasoning.PAIRWISE_VARIABLES)
    assert reasoning.pairwise_messages("r3", context="c", question="q", first="1", second="2", template=template) == [
        {"role": "user", "content": "Q: q|A: 1|B: 2"}]
    path.write_text(json.dumps({"user": "{{ secret }}", "syntax": "jinja2"}), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown variables"):
        reasoning.OperatorTemplate(path, reasoning.PAIRWISE_VARIABLES)
    with pytest.raises(ValueError, match="outside the data folder"):
        reasoning.resolve_data_file("../x.json", str(tmp_path / "data"))


def test_every_preset_validates_against_its_kind_and_expands_under_explicit_options():
    for entry in presets.PRESETS:
        kind, options = presets.expand(entry.name, None, {})
        assert kind == entry.kind and validate_options(kind, options)["model_preset"] == entry.name
    assert presets.expand("rm-r1-distilled", "pairwise", {"max_tokens": 100})[1]["max_tokens"] == 100
    with pytest.raises(presets.UnknownPreset, match="runs as the pairwise kind, not scalar"):
        presets.expand("r3-pairwise", "scalar", {})
    with pytest.raises(OptionsError, match="protocol 'release' sends the release's own prompt"):
        validate_options("pairwise", {"protocol": "release", "prompt_format": "rm-r1"})
    assert presets.rm_type_of("pairwise", {}) == "generative"
    assert presets.rm_type_of("pairwise", {"model_preset": "r3-pairwise"}) == "fine_tuned"
