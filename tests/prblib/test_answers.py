"""The answer rules shared by every LLM caller: the refusal rule and the structured-answer parser."""

import pytest
from pydantic import BaseModel

from prblib.llm.answers import Answer, AnswerError, is_refusal, parse_structured


@pytest.mark.parametrize("text", [
    "I'm sorry, but I can't help with that request.",
    "I cannot assist with this.",
    "As an AI language model, I am unable to provide personal advice about this person.",
    "Sorry \u2014 I won\u2019t be able to answer that.",
    "I must decline to write this answer.",
    "Unfortunately, I'm not able to help with that request. Please ask something else.",
    "I apologize, but I cannot fulfill this request.",
    "<think>This looks private.</think>\nI can't provide that.",
    "Hmm.\nWe cannot comply with this request.",
])
def test_refusals_in_many_phrasings_are_recognised(text):
    assert is_refusal(text) is True


@pytest.mark.parametrize("text", [
    "I'm sorry to hear about your knee. Here is a gentle plan: walk 10 minutes a day.",
    "You can't go wrong with a Fender for a first guitar.",
    "If you cannot practise daily, try three longer sessions a week.",
    "I can't help but recommend starting with scales.",
    "Start with scales. Then learn three chords. I can't stress enough how much that helps.",
    "",
    "Verdict: A",
])
def test_answers_that_merely_sound_negative_are_not_refusals(text):
    assert is_refusal(text) is False


def test_only_the_opening_counts_for_the_refusal_rule():
    long_answer = "Practise daily. Keep a log. Later you may find that I can't help with tuning."
    assert is_refusal(long_answer) is False


def test_an_answer_reports_truncation_from_its_finish_reason():
    assert Answer("cut", finish_reason="length").truncated is True
    assert Answer("done", finish_reason="stop").truncated is False
    assert Answer("unknown").truncated is False


class Plan(BaseModel):
    aspects: list[str]


@pytest.mark.parametrize("text", [
    '{"aspects": ["quiet practice", "budget under $200"]}',
    '```json\n{"aspects": ["quiet practice", "budget under $200"]}\n```',
    'Here you go:\n```\n{"aspects": ["quiet practice", "budget under $200"]}\n```\nHope it helps.',
    'Sure! {"aspects": ["quiet practice", "budget under $200"]} Anything else?',
    '<think>{"aspects": ["wrong"]}</think>{"aspects": ["quiet practice", "budget under $200"]}',
])
def test_fenced_and_bare_json_parse_to_the_same_validated_value(text):
    assert parse_structured(text, Plan) == Plan(aspects=["quiet practice", "budget under $200"])


def test_a_bare_list_validates_against_a_list_schema():
    assert parse_structured('```json\n["a", "b"]\n```', list[str]) == ["a", "b"]


@pytest.mark.parametrize("text, message", [
    ("no json at all", "has no JSON value"),
    ('{"aspects": "one string"}', "invalid at aspects: Input should be a valid list"),
    ('{"aspect": ["typo"]}', "invalid at aspects: Field required"),
    ('```json\n{"aspects": ["cut', "not closed"),
])
def test_bad_structured_answers_are_unparseable_with_the_field_named(text, message):
    with pytest.raises(AnswerError, match=message) as error:
        parse_structured(text, Plan)
    assert error.value.reason == "unparseable"
