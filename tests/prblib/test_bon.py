"""Best-of-N: sampling (fake endpoint and a tiny local policy), group scoring with a tiny scalar
RM against plain forward passes, selection, rubric judging and outcome aggregation."""

from __future__ import annotations

import random

import pytest
import torch

from prblib.rewards.base import ModelSpec, PairInput, ScoreInput, load_reward_model
from prblib.errors import ModelError
from prblib.downstream.bon import (
    KS, JudgeRequest, as_policy_item, best_of_k, derived_seed, judge_answers, judge_prompt, outcomes,
    parse_rubric_scores, policy_messages, random_baseline, sample_responses, score_samples, select_all,
)
from prblib.llm.client import CachedBackend, LocalCausalLMBackend, OpenAIChatBackend
from prblib.stats.metrics import bootstrap_ci
from tests.prblib.fake_openai import Reply, status, text
from tests.prblib.test_llm import save_tiny_causal_lm
from prblib.tiny_models import build_decoder_rm

SENTINELS = ("SENTINEL-NARRATIVE-5e1b", "SENTINEL-RUBRIC-8d2c", "SENTINEL-EVIDENCE-03aa")


def lamp_row(i: int, question: str | None = None) -> dict:
    """A LaMP-QA-like row: what the policy may see, and the answer key it must not."""
    return {
        "id": f"q{i}",
        "question": question or f"QUESTION-{i}: how do I get back into drawing after years away?",
        "profile_texts": [f"POST-{i}-1 about watercolour", f"POST-{i}-2 about night shifts"],
        "narrative": f"{SENTINELS[0]} a nurse who paints on days off",
        "rubric_aspects": [{"aspect": f"{SENTINELS[1]} short sessions", "evidence": SENTINELS[2], "reason": "x"}],
        "category": "Arts",
    }


def endpoint(server) -> OpenAIChatBackend:
    return OpenAIChatBackend(server.base_url, "fake-model", timeout=5.0, max_retries=0)


def numbered_samples(body: dict) -> Reply:
    n = int(body.get("n") or 1)
    return Reply(text=[f"sample {j} (seed {body.get('seed')})" for j in range(n)])


# -- selection ---------------------------------------------------------------------------------

def test_best_of_k_picks_the_highest_of_the_first_k_and_the_earliest_of_a_tie():
    scores = [0.1, 0.5, 0.5, -1.0, 3.0, 3.0]
    assert best_of_k(scores, 1) == 0
    assert best_of_k(scores, 2) == 1
    assert best_of_k(scores, 3) == 1  # tie with index 2: the earliest wins
    assert best_of_k(scores, 4) == 1
    assert best_of_k(scores, 6) == 4
    assert best_of_k([2.0, 2.0, 2.0], 3) == 0
    assert best_of_k([-5.0], 1) == 0


def test_best_of_k_refuses_k_outside_the_scores_and_non_finite_scores():
    with pytest.raises(ValueError):
        best_of_k([1.0, 2.0], 3)
    with pytest.raises(ValueError):
        best_of_k([1.0, 2.0], 0)
    with pytest.raises(ValueError):
        best_of_k([1.0, float("nan")], 2)


def test_select_all_gives_every_item_its_pick_per_k():
    scores = {"a": [0.0, 1.0, 0.5, 2.0] + [0.0] * 12, "b": [3.0] + [1.0] * 14 + [9.0]}
    assert select_all(scores) == {"a": {1: 0, 2: 1, 4: 3, 8: 3, 16: 3}, "b": {1: 0, 2: 0, 4: 0, 8: 0, 16: 15}}
    assert select_all({"a": [1.0, 2.0]}, ks=(1, 2)) == {"a": {1: 0, 2: 1}}
    with pytest.raises(ValueError):
        select_all({"short": [1.0, 2.0]})  # k = 4 needs four samples


def test_the_random_baseline_is_reproducible_and_uniform_over_the_first_k():
    first = random_baseline(200, KS, seed=3)
    assert first == random_baseline(200, KS, seed=3)
    assert first != random_baseline(200, KS, seed=4)
    assert random_baseline(5, KS, seed=3) == first[:5]  # an item's draws don't depend on later items
    assert all(pick[1] == 0 for pick in first)
    for k in KS:
        picks = [pick[k] for pick in first]
        assert all(0 <= p < k for p in picks)
        assert len(set(picks)) == k or k == 16  # 200 draws cover every index of small k
    assert len({pick[16] for pick in first}) >= 12


# -- sampling ----------------------------------------------------------------------------------

def test_the_policy_sees_question_and_profile_but_never_rubric_or_narrative(fake_openai):
    fake_openai.responder = numbered_samples
    rows = [lamp_row(1), lamp_row(2)]
    results = dict(sample_responses(endpoint(fake_openai), rows, n=16, temperature=0.8, max_tokens=64, seed=5))
    assert results == {"q1": [f"sample {j} (seed 5)" for j in range(16)],
                       "q2": [f"sample {j} (seed 5)" for j in range(16)]}
    assert len(fake_openai.bodies) == 2  # one n-sampling request per item
    for body in fake_openai.bodies:
        assert body["n"] == 16 and body["seed"] == 5 and body["temperature"] == 0.8 and body["max_tokens"] == 64
        sent = repr(body["messages"])
        assert not any(s in sent for s in SENTINELS)
        i = 1 if "QUESTION-1" in sent else 2
        assert f"QUESTION-{i}:" in sent and f"POST-{i}-1 about watercolour" in sent and f"POST-{i}-2" in sent


def test_policy_messages_list_posts_in_rank_order_and_cut_to_profile_k():
    item = as_policy_item({"id": 7, "question": "Q?", "profile": [{"text": "first"}, {"text": "second"}, "third"]},
                          profile_k=2)
    assert item.id == "7" and item.profile_texts == ("first", "second")
    user = policy_messages(item)[-1]["content"]
    assert user.index("1. first") < user.index("2. second") < user.index("Q?") and "third" not in user
    bare = policy_messages(as_policy_item({"id": "x", "question": "Only the question?"}))
    assert "Only the question?" in bare[-1]["content"] and "Earlier posts" not in bare[-1]["content"]


def test_a_failing_item_is_reported_and_the_others_are_sampled(fake_openai):
    fake_openai.responder = lambda body: status(400) if "BROKEN" in repr(body["messages"]) else numbered_samples(body)
    rows = [lamp_row(1), lamp_row(2, question="BROKEN question?"), lamp_row(3)]
    results = dict(sample_responses(endpoint(fake_openai), rows, n=4))
    assert isinstance(results["q2"], Exception)
    assert results["q1"] == results["q3"] == [f"sample {j} (seed 0)" for j in range(4)]


def test_bad_items_are_refused_before_any_request(fake_openai):
    with pytest.raises(ModelError, match="twice"):
        list(sample_responses(endpoint(fake_openai), [lamp_row(1), lamp_row(1)]))
    with pytest.raises(ModelError, match="no question"):
        list(sample_responses(endpoint(fake_openai), [{"id": "x", "question": " "}]))
    assert fake_openai.requests == []


def test_an_endpoint_that_ignores_n_is_topped_up_with_seeded_single_requests(fake_openai):
    fake_openai.responder = lambda body: Reply(text=[f"one sample (seed {body.get('seed')})"])
    [(item_id, samples)] = list(sample_responses(endpoint(fake_openai), [lamp_row(1)], n=16, seed=2))
    assert item_id == "q1" and len(samples) == 16
    assert samples[0] == "one sample (seed 2)"
    assert samples[1:] == [f"one sample (seed {derived_seed(2, j)})" for j in range(1, 16)]
    assert len(set(samples)) == 16
    assert [b["n"] for b in fake_openai.bodies] == [16] + [1] * 15


def test_seeded_samples_are_answered_from_the_cache_on_a_rerun(fake_openai, tmp_path):
    fake_openai.responder = numbered_samples
    backend = CachedBackend(endpoint(fake_openai), tmp_path / "cache")
    first = dict(sample_responses(backend, [lamp_row(1), lamp_row(2)], n=16))
    second = dict(sample_responses(backend, [lamp_row(1), lamp_row(2)], n=16))
    assert first == second and len(fake_openai.requests) == 2 and backend.hits == 2


def test_a_tiny_local_policy_returns_16_reproducible_samples_per_item(tmp_path):
    # Every third token id ends a sample: a random model's samples would otherwise all be truncated.
    policy = LocalCausalLMBackend(save_tiny_causal_lm(tmp_path / "policy", end_every=3))
    rows = [lamp_row(1), lamp_row(2)]
    first = dict(sample_responses(policy, rows, n=16, max_tokens=6, seed=11))
    again = dict(sample_responses(policy, rows, n=16, max_tokens=6, seed=11))
    other = dict(sample_responses(policy, rows, n=16, max_tokens=6, seed=12))
    assert set(first) == {"q1", "q2"}
    assert all(isinstance(s, list) and len(s) == 16 and all(isinstance(t, str) for t in s) for s in first.values())
    assert first == again
    assert first != other
    assert len(set(first["q1"])) > 1  # sampled, not 16 copies of one answer


@pytest.mark.parametrize("n, ks", [(16, (1, 2, 4, 8, 16)), (12, (1, 2, 4, 8, 12)), (1, (1,)), (2, (1, 2)),
                                   (5, (1, 2, 4, 5))])
def test_the_k_grid_always_ends_with_n_so_no_sample_goes_unused(n, ks):
    from prblib.downstream.bon import k_grid

    assert k_grid(n) == ks


def test_a_sample_cut_at_the_token_cap_is_asked_again_and_never_used(fake_openai):
    from prblib.llm.answers import AnswerError
    from prblib.llm.client import OpenAIChatBackend
    from tests.prblib.fake_openai import truncated

    whole = [f"whole {i}" for i in range(4)]
    fake_openai.script(truncated(["cut"] * 4), text(whole), truncated(["cut"] * 4), truncated(["cut"] * 4))
    backend = OpenAIChatBackend(fake_openai.base_url, "policy", max_retries=0, concurrency=1)
    outcomes = dict(sample_responses(backend, [lamp_row(1), lamp_row(2)], n=4, max_tokens=32, seed=0))
    assert outcomes["q1"] == whole
    assert isinstance(outcomes["q2"], AnswerError) and outcomes["q2"].reason == "truncated"
    assert [b["max_tokens"] for b in fake_openai.bodies] == [32, 64, 32, 64]


# -- scoring -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scalar_rm(tmp_path_factory):
    folder = build_decoder_rm(tmp_path_factory.mktemp("bon-rm") / "rm")
    rm = load_reward_model(ModelSpec(kind="scalar", path=str(folder)))
    from transformers import AutoModelForSequenceClassification

    reference = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True,
                                                                   use_safetensors=True).eval()
    yield rm, reference
    rm.close()


def plain_score(rm, reference, group: ScoreInput, response: str, setting: str) -> float:
    """One (question, sample) text alone, through transformers' own full forward pass."""
    text, _ = rm.render_inputs(PairInput(id=group.id, domain="", question=group.question, chosen=response,
                                         rejected="unused", profile=group.profile, plan=group.plan), setting=setting)
    ids = rm.tokenizer(text, add_special_tokens=rm.add_special_tokens)["input_ids"]
    with torch.no_grad():
        return float(reference(torch.tensor([ids])).logits[0, 0])


@pytest.mark.parametrize("setting", ["no_profile", "profile"])
def test_group_scores_equal_scoring_each_sample_alone(scalar_rm, setting):
    rm, reference = scalar_rm
    rng = random.Random(0)
    words = "brush canvas sketch colour light paper pencil habit morning ten minutes shift".split()
    samples = {f"q{i}": [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(16)]
               for i in (1, 2, 3)}
    groups = [ScoreInput(id=row["id"], question=row["question"], responses=tuple(samples[row["id"]]),
                         profile=tuple(row["profile_texts"])) for row in map(lamp_row, (1, 2, 3))]
    scores = score_samples(rm, groups, setting=setting)
    assert set(scores) == {"q1", "q2", "q3"}
    for group in groups:
        expected = [plain_score(rm, reference, group, s, setting) for s in group.responses]
        assert scores[group.id] == pytest.approx(expected, abs=1e-4)
    picks = select_all(scores)
    assert all(picks[g][16] == max(range(16), key=lambda i: scores[g][i]) for g in scores)


def test_an_rm_without_group_scoring_needs_reference_answers():
    class PairsOnly:
        kind = "pairwise"
        scores_groups = False

        def score_pairs(self, pairs, *, setting, progress=None):
            raise AssertionError("must not be called")

    groups = [ScoreInput(id="q1", question="Q?", responses=("a", "b"))]
    with pytest.raises(ModelError, match="give reference answers"):
        score_samples(PairsOnly(), groups, setting="no_profile")


def test_judges_score_each_sample_by_its_margin_over_the_reference():
    from prblib.rewards.base import PairResult
    from prblib.downstream.bon import FAILED_JUDGEMENT

    class Judge:
        kind = "pointwise"
        scores_groups = False

        def score_pairs(self, pairs, *, setting, progress=None):
            for p in pairs:
                assert p.rejected == "reference answer" and p.question == "Q?"
                value = {"great": 9.0, "fine": 6.0}.get(p.chosen)
                yield PairResult(p.id, value, 5.0)

    groups = [ScoreInput(id="q1", question="Q?", responses=("fine", "unparseable", "great"))]
    scores = score_samples(Judge(), groups, setting="profile", references={"q1": "reference answer"})
    assert scores == {"q1": [1.0, FAILED_JUDGEMENT, 4.0]}
    assert best_of_k(scores["q1"], 3) == 2 and best_of_k(scores["q1"], 2) == 0


# -- rubric judging ----------------------------------------------------------------------------

def test_the_judge_prompt_numbers_the_aspects_and_shows_question_and_answer():
    messages = judge_prompt("How do I restart drawing?",
                            [{"aspect": "short sessions", "evidence": SENTINELS[2]}, "cheap materials"],
                            "Draw ten minutes a day with a pencil.")
    user = messages[-1]["content"]
    assert "How do I restart drawing?" in user and "Draw ten minutes a day with a pencil." in user
    assert "Aspect 1: short sessions" in user and "Aspect 2: cheap materials" in user
    assert SENTINELS[2] not in user  # only the aspect text, not its evidence
    assert "0, 1 or 2" in user
    with pytest.raises(ModelError):
        judge_prompt("Q?", [], "A.")


@pytest.mark.parametrize("text,n,expected", [
    ("Aspect 1: 2\nAspect 2: 0\nAspect 3: 1", 3, [2, 0, 1]),
    ("Here are the grades.\n\n**Aspect 1:** 2\n- Aspect 2: **1**\n* aspect 3 - 0 (not addressed)\nDone.", 3,
     [2, 1, 0]),
    ("Aspect 1:2/2\n  Aspect 2 :  1 .", 2, [2, 1]),
    ("| Aspect | Score |\n|---|---|\n| Aspect 1 | 2 |\n| Aspect 2 | 1 |", 2, [2, 1]),
    ("Aspect 1 (short sessions): 2\nAspect 2: cheap materials: 0", 2, [2, 0]),
    ("Aspect 1:\n2\nAspect 2:\n\n1", 2, [2, 1]),
    ("Aspect 2: 1\nAspect 1: 2", 2, [2, 1]),  # order of lines does not matter
    ("Aspect 1: 2\nAspect 1: 2\nAspect 2: 1", 2, [2, 1]),  # a repeat that agrees
])
def test_rubric_scores_are_read_from_well_formed_and_decorated_outputs(text, n, expected):
    assert parse_rubric_scores(text, n) == expected


@pytest.mark.parametrize("text,n", [
    ("", 1),
    ("The answer is good.", 1),
    ("Aspect 1: 2", 2),  # aspect 2 missing
    ("Aspect 1: 2\nAspect 2: 3", 2),  # out of range
    ("Aspect 1: 2\nAspect 2: -1", 2),
    ("Aspect 1: 1.5\nAspect 2: 1", 2),  # not a 0/1/2 score
    ("Aspect 1: 2/3\nAspect 2: 1", 2),
    ("Aspect 1: two\nAspect 2: 1", 2),
    ("Aspect 1: 2\nAspect 1: 0\nAspect 2: 1", 2),  # contradicting lines
    ("Aspect 1: 2\nAspect 2: 1\nAspect 3: 2", 2),  # an aspect that does not exist
    ("Aspect N: 0|1|2", 1),  # the instruction echoed back
])
def test_malformed_rubric_outputs_are_parse_failures_not_defaults(text, n):
    assert parse_rubric_scores(text, n) is None


def test_judging_reports_scores_parse_failures_and_request_failures(fake_openai):
    def judge(body):
        user = body["messages"][-1]["content"]
        if "ANSWER-GOOD" in user:
            return "Aspect 1: 2\nAspect 2: 1"
        if "ANSWER-RAMBLING" in user:
            return "This answer is quite nice overall."
        return status(400)

    fake_openai.responder = judge
    aspects = ({"aspect": "short sessions"}, "cheap materials")
    requests = [JudgeRequest(("q1", 1), "Q1?", aspects, "ANSWER-GOOD"),
                {"key": ("q2", 1), "question": "Q2?", "aspects": aspects, "answer": "ANSWER-RAMBLING"},
                JudgeRequest(("q3", 1), "Q3?", aspects, "ANSWER-ERROR")]
    results = {key: (score, raw) for key, score, raw in judge_answers(endpoint(fake_openai), requests)}
    assert results[("q1", 1)] == (1.5, "Aspect 1: 2\nAspect 2: 1")
    assert results[("q2", 1)] == (None, "This answer is quite nice overall.")
    assert results[("q3", 1)][0] is None and isinstance(results[("q3", 1)][1], Exception)
    assert all(b["temperature"] == 0 and b["n"] == 1 and b["seed"] == 0 for b in fake_openai.bodies)


def test_judge_requests_without_aspects_are_refused_before_any_call(fake_openai):
    with pytest.raises(ModelError, match="no rubric aspects"):
        list(judge_answers(endpoint(fake_openai), [JudgeRequest("k", "Q?", (), "A.")]))
    assert fake_openai.requests == []


# -- outcomes ----------------------------------------------------------------------------------

def test_outcomes_average_per_k_and_domain_excluding_and_counting_failures():
    domains = {"a": "Arts", "b": "Arts", "c": "Society", "d": "Society"}
    judged = {("a", 1): 1.0, ("b", 1): 2.0, ("c", 1): None, ("d", 1): 0.5,
              ("a", 4): 2.0, ("b", 4): 2.0, ("c", 4): 1.5, ("d", 4): 1.0}
    result = outcomes(judged, domains, seed=0)
    assert list(result) == [1, 4]
    k1 = result[1]
    assert k1["mean"] == pytest.approx(3.5 / 3) and k1["n"] == 3 and k1["failures"] == 1
    assert (k1["ci_low"], k1["ci_high"]) == bootstrap_ci([1.0, 2.0, 0.5], seed=0)
    assert k1["ci_low"] <= k1["mean"] <= k1["ci_high"]
    assert k1["by_domain"]["Arts"]["mean"] == 1.5 and k1["by_domain"]["Arts"]["n"] == 2
    society = k1["by_domain"]["Society"]
    assert (society["mean"], society["n"], society["failures"]) == (0.5, 1, 1)
    assert (society["ci_low"], society["ci_high"]) == (None, None)  # one score: not enough data
    k4 = result[4]
    assert k4["mean"] == pytest.approx(6.5 / 4) and k4["n"] == 4 and k4["failures"] == 0
    # Two equal scores: every resample gives 2.0, so no interval rather than [2.0, 2.0].
    assert k4["by_domain"]["Arts"] == {"mean": 2.0, "ci_low": None, "ci_high": None, "n": 2, "failures": 0}
    assert outcomes(judged, domains, seed=0) == result  # seeded bootstrap


def test_outcomes_with_only_failures_have_no_mean_and_unknown_items_are_refused():
    result = outcomes({("a", 1): None}, {"a": "Arts"})
    assert result[1]["mean"] is None and result[1]["ci_low"] is None and result[1]["failures"] == 1
    with pytest.raises(ValueError, match="no domain"):
        outcomes({("zzz", 1): 1.0}, {"a": "Arts"})
