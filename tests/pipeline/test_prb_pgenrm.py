"""P-GenRM as published, end to end: a synthetic PersonalRewardBench file imports, prototypes are built
(raw histories, inferred personas, refined), and it is evaluated through the fake OpenAI-compatible
server in both chain formats, with strict and the authors' accuracies side by side."""

import json
import re

import pytest
from django.core.management import CommandError, call_command

from prblib.rewards.pgenrm.model import Prototypes
from prblib.rewards.pgenrm.published import END, START
from tests.pipeline.prb_data import write_prb

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("one_torch_thread")]

SHORT, LONG = "keep it simple", "thorough tour"


def taste(text: str) -> str:
    """What the shown history says this user prefers: "short", "long", or "unknown"."""
    picked = re.findall(r"(?:The answer they preferred|Picked): ([^\n]*)", text)
    short = sum(SHORT in p for p in picked)
    long = sum(LONG in p for p in picked)
    return "short" if short > long else "long" if long > short else "unknown"


def fake_judge(body: dict) -> str:
    """A judge that reads the user's earlier picks and scores the answer of that style higher. Questions
    about tea get a tie and questions about jazz an unreadable reply (to exercise the accounting)."""
    system, user = (m["content"] for m in body["messages"])
    text = system + "\n" + user
    published = START in system
    if published:
        first, second = re.search(r"Response 1:\n(.*?)\n\nResponse 2:\n(.*)", user, re.S).groups()
    else:
        first = re.search(r"=== Answer A ===\n(.*?)\n=== End", user, re.S).group(1)
        second = re.search(r"=== Answer B ===\n(.*?)\n=== End", user, re.S).group(1)
    wanted = taste(text)
    question = re.search(r"Tell me about (\w+)", user).group(1)
    if question == "jazz":
        return "I cannot decide."
    good, bad = 8.0, 3.0
    first_wins = (SHORT in first) == (wanted == "short")
    a, b = (good, bad) if first_wins else (bad, good)
    if question == "tea" or wanted == "unknown":
        a = b = 5.0
    persona = f"Wants {'brief, simple' if wanted == 'short' else 'thorough, detailed'} answers."
    if published:
        obj = {"rationale": f"Criteria: style 70%, accuracy 30%. Response 1 = {a}, Response 2 = {b}.",
               "better_response": {"response_1": a, "response_2": b}}
        return f"{persona} Criteria follow from the earlier picks.\n{START}{json.dumps(obj)}{END}"
    obj = {"persona": persona, "criteria": [{"name": "Style", "weight": 100}],
           "scores": {"A": {"Style": a}, "B": {"Style": b}}, "totals": {"A": a, "B": b}}
    return f"Step 1 ...\n```json\n{json.dumps(obj)}\n```"


def evaluate(tmp_path, name, **options):
    out = tmp_path / f"{name}.txt"
    args = [arg for key, value in options.items() for arg in ("--option", f"{key}={json.dumps(value)}")]
    call_command("evaluate_rm", "--benchmark", "prism-synth", "--model", "judge", "--kind", "pgenrm",
                 "--setting", "profile", "--endpoint", "fake", *args, stdout=open(out, "w"), verbosity=0)
    return json.loads(out.read_text().splitlines()[-1])


@pytest.fixture
def imported(tmp_path, fake_openai):
    from pipeline.models import LLMEndpoint

    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=0, max_concurrency=8)
    call_command("import_benchmark", str(write_prb(tmp_path)), "--name", "prism-synth", verbosity=0)


def build(tmp_path, out, *extra):
    path = tmp_path / f"{out}.out"
    call_command("build_prototypes", "--benchmark", "prism-synth", "--out", f"protos/{out}.json", "--k", "2",
                 *extra, stdout=open(path, "w"))
    return json.loads(path.read_text())


def test_the_published_schema_builds_prototypes_and_evaluates_in_both_chain_formats(imported, tmp_path, settings,
                                                                                     fake_openai):
    fake_openai.responder = fake_judge
    refined = build(tmp_path, "refined", "--refine", "--epochs", "2")
    assert refined["users"] == 12 and refined["k"] == 2 and refined["source"] == "histories"
    assert refined["refined"] and len(refined["losses"]) == 2
    personas = build(tmp_path, "personas", "--personas-model", "judge", "--endpoint", "fake",
                     "--option", 'chain_format="published"')
    assert personas["source"] == "personas" and personas["personas"] == {"chains": 60, "failed": 7}
    # Persona prototypes separate the two tastes: each prototype holds one kind of user.
    protos = Prototypes.load(f"{settings.DATA_ROOT}/protos/personas.json")
    assert sorted(sorted(int(u[-2:]) % 2 for u in members) for members in protos.members) == [
        [0] * 6, [1] * 6]
    # The persona chains never saw the row they were judging as history (leave-one-out).
    persona_bodies = [b for b in fake_openai.bodies if START in b["messages"][0]["content"]]
    assert len(persona_bodies) == 60
    for body in persona_bodies:
        system, user = (m["content"] for m in body["messages"])
        query = re.search(r"The user's new query:\n(.*)", user).group(1)
        assert f"Asked: {query}" not in system

    summaries = {}
    for fmt, stage in (("native", "initial"), ("published", "refined")):
        summaries[fmt] = evaluate(tmp_path, fmt, chain_format=fmt, m=2, n=1, prototype_stage=stage,
                                  prototypes="protos/personas.json" if stage == "initial" else "protos/refined.json")
    # The worked example: 24 test pairs; 2 about jazz get no score, 2 about tea tie in every chain, and
    # neighbours of the other taste tie a few more (fewer with the refined prototypes).
    accounts = {fmt: summary["authors_accounting"] for fmt, summary in summaries.items()}
    assert {fmt: summaries[fmt]["accuracy"] for fmt in summaries} == {"native": 15 / 24, "published": 20 / 24}
    assert accounts["native"] == {
        "strict": {"accuracy": 15 / 24, "correct": 15, "counted": 24, "dropped": 0},
        "baseline_rule": {"accuracy": 15 / 16, "correct": 15, "counted": 16, "dropped": 8},
        "scaling_rule": {"accuracy": 17 / 21, "correct": 17, "counted": 21, "dropped": 3}}
    assert accounts["published"] == {
        "strict": {"accuracy": 20 / 24, "correct": 20, "counted": 24, "dropped": 0},
        "baseline_rule": {"accuracy": 1.0, "correct": 20, "counted": 20, "dropped": 4},
        "scaling_rule": {"accuracy": 21 / 22, "correct": 21, "counted": 22, "dropped": 2}}


def test_a_query_user_never_meets_themself_among_neighbours(imported, tmp_path, settings, fake_openai):
    from prblib.rewards.base import ModelSpec, load_reward_model
    from pipeline.models import Benchmark
    from pipeline.services import item_pair_input

    fake_openai.responder = fake_judge
    build(tmp_path, "plain")
    model = load_reward_model(ModelSpec(kind="pgenrm", path="judge", options={
        "m": 1, "n": 3, "prototypes": "protos/plain.json"}, runtime={
        "backend": "openai", "base_url": fake_openai.base_url, "max_retries": 0, "data_root": str(settings.DATA_ROOT)}))
    pairs = {p.id: p for p in map(item_pair_input, Benchmark.objects.get(name="prism-synth").items.all())}
    results = list(model.score_pairs(list(pairs.values()), setting="profile"))
    assert len(results) == 24
    for result in results:
        neighbours = [n["user"] for n in result.details["neighbours"]]
        assert len(neighbours) == 3 and pairs[result.id].user_id not in neighbours


def test_build_prototypes_refuses_empty_histories_and_k_0_in_one_line(tmp_path):
    rows = [{"id": f"h{i}", "user_id": f"u{i}", "question": f"q{i}", "history": [], "category": "PRISM",
             "chosen": "yes", "rejected": "no"} for i in range(3)]
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    call_command("import_benchmark", str(tmp_path / "h.jsonl"), "--name", "empty", verbosity=0)
    with pytest.raises(CommandError) as info:
        call_command("build_prototypes", "--benchmark", "empty", "--out", "p.json")
    assert str(info.value) == ("benchmark 'empty' has no preference signals to build prototypes from: every one of "
                               "its 3 user(s) has an empty history and profile")
    with pytest.raises(CommandError, match=r"^--k must be at least 1, not 0$"):
        call_command("build_prototypes", "--benchmark", "empty", "--out", "p.json", "--k", "0")


def test_refining_prototypes_of_users_without_pairs_is_refused_in_one_line(tmp_path):
    from tests.pipeline.test_formats import SAMPLE

    call_command("import_benchmark", str(SAMPLE), "--name", "sample", verbosity=0)
    with pytest.raises(CommandError, match=r"^cannot refine the prototypes: refinement needs preference pairs"):
        call_command("build_prototypes", "--benchmark", "sample", "--out", "p.json", "--k", "2", "--refine")

