"""P-GenRM as published: the released checkpoints' chain format, the paper preset, options in one model,
the query user excluded from their neighbours, and the authors' accounting beside ours."""

import json

import pytest

from prblib.errors import ModelError
from prblib.rewards.options import PAPER_PRESET, parse_options
from prblib.rewards.pgenrm.model import ParseFailure, PGenRM, authors_accuracy, parse_published_chain, shared_position
from prblib.rewards.pgenrm.published import END, START, Template
from tests.prblib.test_pgenrm import make_pair, neighbour_model, spec_for


def published_reply(r1, r2, *, analysis="The user likes low-tech, hands-on advice.", end=True, extra=None):
    obj = {"rationale": "Criteria: fit 70%, quality 30%. Response 1: fit 9, quality 8 ...",
           "better_response": {"response_1": r1, "response_2": r2}, **(extra or {})}
    return f"{analysis}\n{START}\n{json.dumps(obj)}\n" + (END if end else "")


def published_prefers_chosen(body) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    chosen_first = user.index("CHOSEN-") < user.index("REJECTED-")
    return published_reply(8.6, 3.1) if chosen_first else published_reply("3.1", "8.6")


# -- parsing --------------------------------------------------------------------------------

def test_a_published_reply_gives_both_final_scores_and_keeps_the_analysis_as_persona():
    chain = parse_published_chain(published_reply(8.6, "3.1"))
    assert chain.totals == {"A": 8.6, "B": 3.1}
    assert chain.persona == "The user likes low-tech, hands-on advice."


@pytest.mark.parametrize("text, reason", [
    ("just prose, no markers", "no_json"),
    (published_reply(8, 3, end=False), "malformed_json"),  # cut before the end marker
    (f"a {START} {{not json}} {END}", "malformed_json"),
    (f"a {START} [1, 2] {END}", "malformed_json"),
    (f"a {START} {json.dumps({'rationale': 'r'})} {END}", "bad_totals"),
    (published_reply("high", 3), "bad_totals"),
    (published_reply(True, 3), "bad_totals"),
    (published_reply(float("nan"), 3), "bad_totals"),
    (f"a {START} {json.dumps({'better_response': {'response_1': 1, 'response_3': 2}})} {END}", "bad_totals"),
])
def test_published_replies_that_cannot_be_read_fail_with_a_reason(text, reason):
    failure = parse_published_chain(text)
    assert isinstance(failure, ParseFailure) and failure.reason == reason


def test_our_native_parser_refuses_what_the_released_checkpoints_write():
    from prblib.rewards.pgenrm.model import parse_chain

    assert parse_chain(published_reply(8, 3)).reason == "missing_persona"


# -- options --------------------------------------------------------------------------------

def test_the_paper_preset_sets_m_n_temperature_and_a_budget_and_explicit_values_win():
    assert parse_options("pgenrm", {"preset": "paper"}).resolved() == PAPER_PRESET == {
        "m": 16, "n": 8, "temperature": 1.0, "max_tokens": 8192}
    assert parse_options("pgenrm", {"preset": "paper", "n": 0, "m": 2}).resolved() == {
        "m": 2, "n": 0, "temperature": 1.0, "max_tokens": 8192}
    assert parse_options("pgenrm", {}).resolved() == {"m": 4, "n": 0, "temperature": 0.7, "max_tokens": 1024}


@pytest.mark.parametrize("options, message", [
    ({"chain_format": "xml"}, "option 'chain_format': Input should be 'native' or 'published'"),
    ({"preset": "fast"}, "option 'preset'"),
    ({"include_self_neighbours": "yes"}, "option 'include_self_neighbours'"),
    ({"prototype_stage": "final"}, "option 'prototype_stage'"),
    ({"preset": "paper"}, "n > 0 needs option prototypes"),
    ({"template_file": "t.json"}, "option 'template_file' is not an option of the pgenrm kind"),  # operators only
])
def test_bad_new_options_are_refused_in_one_line(fake_openai, options, message):
    with pytest.raises(ModelError, match=message):
        PGenRM.load(spec_for(fake_openai, **options))


def test_an_operator_template_must_exist_inside_the_data_folder_and_suit_the_format(fake_openai, tmp_path):
    for options, runtime, message in (
            ({"chain_format": "published"}, {"pgenrm_template": "missing.json"}, "does not exist"),
            ({"chain_format": "published"}, {"pgenrm_template": "../t.json"}, "outside the data folder"),
            ({}, {"pgenrm_template": "t.json"}, "applies to chain_format published only")):
        spec = spec_for(fake_openai, **options)
        spec.runtime.update(runtime, data_root=str(tmp_path))
        with pytest.raises(ModelError, match=message):
            PGenRM.load(spec)


# -- the published format end to end ----------------------------------------------------------

def test_published_chains_share_one_order_per_pair_and_score_through_the_fake_server(fake_openai):
    fake_openai.responder = published_prefers_chosen
    model = PGenRM.load(spec_for(fake_openai, chain_format="published", m=4, max_tokens=4000))
    pairs = [make_pair(i) for i in range(6)]
    results = {r.id: r for r in model.score_pairs(pairs, setting="profile")}
    assert all(r.correct for r in results.values())
    assert results["p1"].chosen_score == pytest.approx(8.6)
    for pair in pairs:
        positions = {c["chosen_position"] for c in results[pair.id].details["chains"]}
        assert positions == {shared_position(pair.id, 0)}  # one order for all m chains
    assert {shared_position(p.id, 0) for p in pairs} == {"A", "B"}  # the order varies between pairs
    system = fake_openai.bodies[0]["messages"][0]["content"]
    assert START in system and END in system and "better_response" in system
    assert fake_openai.bodies[0]["max_tokens"] == 4000


def first_prompt_with_template(fake_openai, tmp_path, template: dict) -> tuple[str, str]:
    """(system, user) of the first chain request when P-GenRM reads `template` from t.json."""
    (tmp_path / "t.json").write_text(json.dumps(template))
    fake_openai.responder = published_prefers_chosen
    spec = spec_for(fake_openai, chain_format="published", m=1)
    spec.runtime.update(pgenrm_template="t.json", data_root=str(tmp_path))
    model = PGenRM.load(spec)
    next(iter(model.score_pairs([make_pair(1, profile=("POST-X",))], setting="profile")))
    system, user = (m["content"] for m in fake_openai.bodies[0]["messages"])
    return system, user


def test_an_operator_template_replaces_the_wording(fake_openai, tmp_path):
    system, user = first_prompt_with_template(fake_openai, tmp_path, {
        "system": "SYS {few_shots} literal {{braces}}", "user": "Q={user_input} 1={response_1} 2={response_2}"})
    assert system.startswith("SYS ") and "POST-X" in system and system.endswith("literal {braces}")
    assert user.startswith("Q=QUESTION-1")
    with pytest.raises(ValueError, match=r"unknown variables \{\{ persona \}\}"):
        Template("{{ persona }}", "{{ query }}")


def test_an_operator_template_in_jinja2_syntax_is_rendered_in_the_sandbox(fake_openai, tmp_path):
    system, user = first_prompt_with_template(fake_openai, tmp_path, {
        "syntax": "jinja2", "system": "SYS {{ few_shots }} literal {braces}",
        "user": "Q={{ user_input|upper }} 1={{ response_1 }} 2={{ response_2 }}"})
    path = tmp_path / "t.json"
    assert system.startswith("SYS ") and "POST-X" in system and system.endswith("literal {braces}")
    assert user.startswith("Q=QUESTION-1")
    path.write_text(json.dumps({"syntax": "mustache", "system": "s", "user": "u"}))
    with pytest.raises(ValueError, match="syntax must be"):
        Template.from_file(path)
    path.write_text(json.dumps({"system": "{history.__class__}", "user": "{query}"}))
    with pytest.raises(ValueError, match=r"placeholder \{history.__class__\}"):
        Template.from_file(path)


# -- neighbours exclude the query user --------------------------------------------------------

def test_the_query_user_is_not_their_own_neighbour_by_user_id_unless_asked(fake_openai, tmp_path):
    from tests.prblib.test_pgenrm import prefers_chosen

    fake_openai.responder = prefers_chosen
    # The pair's signals differ from sailor-a's stored ones, but it is sailor-a asking.
    pair = make_pair(1, profile=("sailing again today",), user_id="sailor-a")
    model = neighbour_model(fake_openai, tmp_path, m=1, n=1)
    result = next(iter(model.score_pairs([pair], setting="profile")))
    assert [n["user"] for n in result.details["neighbours"]] == ["sailor-b"]
    model = neighbour_model(fake_openai, tmp_path, m=1, n=1, include_self_neighbours=True)
    result = next(iter(model.score_pairs([pair], setting="profile")))
    assert [n["user"] for n in result.details["neighbours"]] == ["sailor-a"]


# -- accounting -------------------------------------------------------------------------------

def chains_of(chosen, rejected):
    return [{"chosen_total": chosen, "rejected_total": rejected}]


def test_strict_and_the_authors_two_rules_side_by_side():
    details = [
        {"chains": chains_of(9, 3), "first_shown": "chosen"},  # right
        {"chains": chains_of(3, 9), "first_shown": "chosen"},  # wrong
        {"chains": chains_of(5, 5), "first_shown": "chosen"},  # tie, chosen shown first
        {"chains": chains_of(5, 5), "first_shown": "rejected"},  # tie, rejected shown first
        {"chains": chains_of(None, None), "first_shown": "chosen"},  # unparsed
    ]
    got = authors_accuracy(details)
    assert got["strict"] == {"accuracy": 0.2, "correct": 1, "counted": 5, "dropped": 0}
    assert got["baseline_rule"] == {"accuracy": 0.5, "correct": 1, "counted": 2, "dropped": 3}
    assert got["scaling_rule"] == {"accuracy": 0.5, "correct": 2, "counted": 4, "dropped": 1}
