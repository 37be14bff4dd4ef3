"""Protocol "release" (issue 27): our figures under `options.protocol = "release"` equal the figure the
authors' released rule gives on the same model outputs, worked out here by an independent
implementation written from the rule's description (docs/protocols.md), never by calling our code.

One benchmark, 21 pairs in ONE file whose three domains are interleaved (so a row's place within its
domain differs from its place in the file, as when the release reads each subset file on its own).
The judge is a fake endpoint whose replies we choose per pair: "**Result:** B" whatever is shown,
the right letter behind a decoy inside <think>...</think>, quotes and asterisks around the letter,
no result at all, a "Verdict:" line, a bracketed letter. The scalar RM is a tiny two-label classifier
whose label names make our rule (the label named positive) and the release's (the last label)
disagree. Each end-to-end test prints one line for the closing note:
    PROTOCOL | kind | release rule (independent) X | ours protocol=release X | ours protocol=prbench Y
"""

import io
import json
import random
import re

import pytest
import torch
from django.core.management import CommandError, call_command

from prblib import registry
from prblib.rewards.options import OptionsError, parse_options
from prblib.rewards.protocols import parse_release_verdict, release_position
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import, domain_rows, item_pair_input, rm_score_items, rm_summarize
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import make_row, write_jsonl

DOMAINS = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
N_PAIRS = 21  # 7 reply styles x 3 domains: every style meets every domain once


# -- the benchmark and the judge's replies ---------------------------------------------------------

def rows() -> list[dict]:
    return [make_row(i, id=f"q{i}", category=DOMAINS[i % 3],
                     question=f"QUESTION-{i}: how do I get better at painting landscapes?",
                     chosen=f"CHOSEN-{i}: practise wet-on-wet washes with watercolour{' and care' * (i % 4)}.",
                     rejected=f"REJECTED-{i}: practise painting{' every day' * (i % 5)}.") for i in range(N_PAIRS)]


def reply_for(i: int, chosen_slot: str) -> str:
    """What the fake judge answers for pair i when the chosen answer is shown in `chosen_slot`."""
    other = "B" if chosen_slot == "A" else "A"
    style = i % 7
    if style == 0:
        return f"**Reasoning:** The first one fits.\n**Result:** {chosen_slot}"
    if style == 1:
        return "**Reasoning:** Hard to tell.\n**Result:** B\n(Were I pressed, Result: A.)"  # the first: B, whatever is shown
    if style == 2:  # a decoy inside the think block; the real line after it
        return f"<think>At first **Result:** {other} seemed right.</think>\n**Reasoning:** short.\n**Result:** {chosen_slot}"
    if style == 3:
        return f'**Reasoning:** ok\n**Result:** "**{chosen_slot}**"'
    if style == 4:
        return "No preference stated."  # no result at all
    if style == 5:
        return f"**Reasoning:** ok\nVerdict: {chosen_slot}"  # our own format, not the release's
    return f"**Reasoning:** ok\n**Result:** [{chosen_slot}]"  # a bracket before the letter


def responder(body: dict) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    i = int(re.search(r"QUESTION-(\d+)", user).group(1))
    slot = "A" if user.index(f"CHOSEN-{i}") < user.index(f"REJECTED-{i}") else "B"
    return reply_for(i, slot)


# -- the release's rule, written from its description (docs/protocols.md) ----------------------------

def independent_reading(reply: str) -> str | None:
    """After the last </think>; no double quotes or asterisks; lowercased; the first non-blank
    character after the first "result:", when it is a or b."""
    tail = reply.rsplit("</think>", 1)[-1]
    cleaned = re.sub(r'["*]', "", tail).strip().lower()
    _, found, after = cleaned.partition("result:")
    letter = after.lstrip()[:1] if found else ""
    return {"a": "A", "b": "B"}.get(letter)


def independent_pairwise() -> tuple[float, int, float, dict[str, str]]:
    """(accuracy with an unread reply counted as A, unread replies, strict accuracy, {id: chosen slot})."""
    by_domain: dict[str, list[dict]] = {}
    for row in rows():  # each domain's rows in file order: what one subset file holds
        by_domain.setdefault(row["category"], []).append(row)
    hits = strict_hits = unread = 0
    slots = {}
    for domain_rows_ in by_domain.values():
        rng = random.Random(42)  # one run of the release per subset, seeded 42
        for row in domain_rows_:
            gold = "A" if rng.random() < 0.5 else "B"
            slots[row["id"]] = gold
            letter = independent_reading(reply_for(int(row["id"][1:]), gold))
            unread += letter is None
            strict_hits += letter == gold
            hits += (letter or "A") == gold
    return hits / N_PAIRS, unread, strict_hits / N_PAIRS, slots


# -- the rule's pieces ------------------------------------------------------------------------------

@pytest.mark.parametrize("reply, letter", [
    ("**Result:** B", "B"),
    ("<think>**Result:** A</think>\n**Reasoning:** x\n**Result:** B", "B"),
    ("<think>one</think> <think>**Result:** A</think> Result: b", "B"),
    ('**Result:** "**a**"', "A"),
    ("RESULT:b", "B"),
    ("Result: A\nResult: B", "A"),  # the first result counts
    ("The result: is unclear. Result: B", None),  # what follows the FIRST result: is "is"
    ("Result : A", None),  # a space before the colon
    ("Result: [A]", None),
    ("Result: (B)", None),
    ("Verdict: B", None),
    ("", None),
])
def test_the_release_reading_of_a_reply(reply, letter):
    assert parse_release_verdict(reply) == letter
    assert independent_reading(reply) == letter


def test_the_release_order_is_one_seeded_draw_per_row_of_a_domain():
    rng = random.Random(42)
    expected = ["A" if rng.random() < 0.5 else "B" for _ in range(40)]
    assert [release_position(r) for r in reversed(range(40))][::-1] == expected  # asked in any order
    assert expected[:8] == ["B", "A", "A", "A", "B", "B", "B", "A"]


def test_release_options_say_what_they_refuse():
    with pytest.raises(OptionsError) as exc:
        parse_options("pairwise", {"protocol": "paper"})
    assert str(exc.value) == "option 'protocol': Input should be 'prbench' or 'release'"
    assert exc.value.key == "protocol"
    with pytest.raises(OptionsError) as exc:
        parse_options("pairwise", {"protocol": "release", "both_orders": True})
    assert str(exc.value) == ("options: both_orders true does not go with protocol 'release', which judges one "
                              "order per pair as the authors' script does: leave both_orders unset (or false)")
    with pytest.raises(OptionsError) as exc:
        parse_options("pointwise", {"protocol": "release"})
    assert str(exc.value).startswith("option 'protocol' is not an option of the pointwise kind")
    assert parse_options("scalar", {"protocol": "release"}).setting_refusal("profile") == (
        "protocol 'release' shows the model only the question, as the authors' scripts do (they have no profile "
        "or plan evaluation): run it in the no_profile setting, not profile")
    assert parse_options("scalar", {}).setting_refusal("profile") is None
    assert registry.protocol_of("pairwise", {}) == "prbench" and registry.protocol_of("pgenrm", {}) == "prbench"


# -- end to end: pairwise ---------------------------------------------------------------------------

@pytest.fixture
def benchmark(tmp_path):
    return benchmark_import(path=write_jsonl(tmp_path / "mixed.jsonl", rows()), name="protocols").benchmark


@pytest.fixture
def judge(fake_openai):
    fake_openai.responder = responder
    LLMEndpoint.objects.create(name="fake-judge", base_url=fake_openai.base_url, max_retries=0)
    return fake_openai


def evaluate(*args: str) -> dict:
    out = io.StringIO()
    call_command("evaluate_rm", "--benchmark", "protocols", "--setting", "no_profile", "-v", "0", *args, stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.django_db
def test_pairwise_release_equals_the_release_rule_on_the_same_replies(benchmark, judge):
    expected, unread, strict, slots = independent_pairwise()
    released = evaluate("--kind", "pairwise", "--endpoint", "fake-judge", "--model", "judge-model",
                        "--option", "protocol=release")
    assert len(judge.requests) == N_PAIRS  # one order per pair
    bodies = judge.bodies
    ours = evaluate("--kind", "pairwise", "--endpoint", "fake-judge", "--model", "judge-model")
    print(f"\nPROTOCOL | pairwise | release rule (independent) {expected:.4f} | ours protocol=release "
          f"{released['accuracy']:.4f} | ours protocol=prbench {ours['accuracy']:.4f}")

    assert released["accuracy"] == expected
    assert released["protocol"]["strict_accuracy"] == strict
    assert released["protocol"]["parse_failures"] == unread == 9  # styles 4, 5 and 6 in three domains
    assert released["protocol"]["name"] == "release" and released["manifest"]["protocol"] == "release"
    assert released["manifest"]["templates"] == {"judge": "pairwise-judge-release@v1"}
    assert ours["protocol"]["name"] == "prbench" and ours["manifest"]["protocol"] == "prbench"
    # The three figures tell the rules apart: one order / failure rule / parse rule changed would show.
    # By hand from the draws: styles 0, 2, 3 are right (9 pairs), "B" is right where B holds the chosen answer
    # (2 of 3): 11 strict; of the 9 unread replies, 4 fall where A holds the chosen answer: 15 as released.
    assert (expected, strict) == (15 / 21, 11 / 21)
    assert ours["accuracy"] != expected
    # What the release's prompt holds: the question and the two answers, never the profile.
    for body in bodies:
        text = json.dumps(body["messages"])
        assert "I painted with watercolours" not in text and "Past posts" not in text
        assert "**Result:** <A or B>" in body["messages"][0]["content"]
    shown = {re.search(r"QUESTION-(\d+)", b["messages"][1]["content"]).group(1): b["messages"][1]["content"]
             for b in bodies}
    for pair_id, slot in slots.items():
        user = shown[pair_id[1:]]
        assert (user.index("CHOSEN-") < user.index("REJECTED-")) == (slot == "A"), pair_id


@pytest.mark.django_db
def test_chunks_and_a_resumed_run_keep_each_pair_s_release_order(benchmark, judge):
    _, _, _, slots = independent_pairwise()
    model_spec = parse_options("pairwise", {"protocol": "release"})
    assert model_spec.protocol == "release"
    from prblib.rewards.base import ModelSpec, load_reward_model

    model = load_reward_model(ModelSpec(kind="pairwise", path="judge-model", options={"protocol": "release"},
                                        runtime={"backend": "openai", "base_url": judge.base_url, "max_retries": 0}))
    later = benchmark.items.order_by("position")[13:]  # a resumed run: the first 13 pairs were scored before
    got = {}
    rm_score_items(model=model, items=list(later), setting="no_profile", chunk_size=3,
                   on_chunk=lambda results: got.update({i.source_id: r.details["orders"][0]["chosen_position"]
                                                        for i, r in results}))
    assert got == {pid: slots[pid] for pid in got} and len(got) == N_PAIRS - 13
    rows_ = domain_rows(benchmark.pk)
    first = benchmark.items.order_by("position")[0]
    assert item_pair_input(first, row_in_domain=rows_[first.pk]).row_in_domain == 0


@pytest.mark.django_db
def test_release_runs_only_in_the_no_profile_setting(benchmark, judge):
    with pytest.raises(CommandError) as exc:
        call_command("evaluate_rm", "--benchmark", "protocols", "--setting", "profile", "--kind", "pairwise",
                     "--endpoint", "fake-judge", "--model", "judge-model", "--option", "protocol=release", "-v", "0",
                     stdout=io.StringIO())
    assert str(exc.value) == ("protocol 'release' shows the model only the question, as the authors' scripts do "
                              "(they have no profile or plan evaluation): run it in the no_profile setting, not profile")
    assert judge.requests == []


def test_the_summary_says_where_a_judge_result_has_no_published_counterpart():
    row = ("arts_entertainment", True, False, {"orders": [{"chosen_position": "A", "verdict": "A"}]}, 1.0, 0.0)
    assert rm_summarize([row], kind="pairwise", setting="profile")["protocol"]["note"] == (
        "The authors' release evaluates this kind on the question alone: a result in the profile setting has no "
        "published counterpart.")
    assert "note" not in rm_summarize([row], kind="pairwise", setting="no_profile")["protocol"]
    assert rm_summarize([row[:3] + ({"parse_failures": 0},) + row[4:]], kind="pointwise",
                        setting="no_profile")["protocol"]["note"] == (
        "The authors' release has no evaluation script for this kind: its results have no published counterpart.")


# -- end to end: scalar -----------------------------------------------------------------------------

def independent_scalar(folder) -> float:
    """The release's scalar rule: [user = question, assistant = answer] through the chat template as text,
    tokenized with the tokenizer's defaults, scored as the softmax's last entry; a win is chosen > rejected."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()

    def score(question: str, answer: str) -> float:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question},
                                              {"role": "assistant", "content": answer}], tokenize=False)
        with torch.no_grad():
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
        return torch.softmax(logits, dim=-1)[-1].item()

    wins = sum(score(r["question"], r["chosen"]) > score(r["question"], r["rejected"]) for r in rows())
    return wins / N_PAIRS


@pytest.mark.django_db
def test_scalar_release_equals_the_release_rule_on_the_same_model(benchmark, tmp_path):
    # Label 0 is named "chosen" (ours reads it as the positive class); the release reads the last label.
    folder = build_decoder_rm(tmp_path / "rm", num_labels=2, id2label={0: "chosen", 1: "rejected"}, seed=3)
    expected = independent_scalar(folder)
    released = evaluate("--kind", "scalar", "--model", str(folder), "--option", "protocol=release")
    ours = evaluate("--kind", "scalar", "--model", str(folder))
    print(f"\nPROTOCOL | scalar | release rule (independent) {expected:.4f} | ours protocol=release "
          f"{released['accuracy']:.4f} | ours protocol=prbench {ours['accuracy']:.4f}")
    assert released["accuracy"] == expected
    assert ours["accuracy"] != expected  # the two head readings rank this model's answers differently
    assert released["protocol"] == {
        "name": "release", "label": "release",
        "definition": registry.kind("scalar").protocol_definition("release")}
    assert released["manifest"]["protocol"] == "release"


@pytest.mark.django_db
def test_scalar_release_needs_a_chat_template(benchmark, tmp_path):
    folder = build_decoder_rm(tmp_path / "plain", num_labels=2, chat_template=None)
    with pytest.raises(CommandError) as exc:
        evaluate("--kind", "scalar", "--model", str(folder), "--option", "protocol=release")
    assert str(exc.value) == ("protocol 'release' renders the question and the answer with the tokenizer's chat "
                              "template, as the authors' script does, and this tokenizer has none")
