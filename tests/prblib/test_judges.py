"""Generative judges against a fake OpenAI-compatible server, and on a tiny random local LM."""

import json
import re

import pytest

from prblib.rewards.base import ModelSpec, PairInput, load_reward_model
from prblib.errors import ModelError
from prblib.rewards.judges import PairwiseJudge, PointwiseJudge, parse_score, parse_verdict
from prblib.llm.client import BACKEND_OPTIONS, messages_as_text
from prblib.stats.metrics import judge_order_stats, summarize
from tests.prblib.fake_openai import status
from tests.prblib.test_llm import tiny_lm_folder  # noqa: F401

# What the benchmark knows about each item but a reward model must never see.
ANSWER_KEY = {
    "p1": {"narrative": "SENTINEL-NARRATIVE-7f3a: a retired sailor who distrusts apps",
           "rubric": ["SENTINEL-RUBRIC-91c2: mention paper charts"]},
    "p2": {"narrative": "SENTINEL-NARRATIVE-0b5d: a student on a tight budget",
           "rubric": ["SENTINEL-RUBRIC-44e8: suggest free options"]},
    "p3": {"narrative": "SENTINEL-NARRATIVE-c1d9: a night-shift nurse",
           "rubric": ["SENTINEL-RUBRIC-6a0f: respect daytime sleep"]},
}


def make_pair(i: int, domain: str = "Lifestyle") -> PairInput:
    return PairInput(
        id=f"p{i}", domain=domain, question=f"QUESTION-{i}: how should I plan my week?",
        chosen=f"CHOSEN-{i} answer tailored to the person", rejected=f"REJECTED-{i} generic answer",
        profile=(f"POST-{i}-1 about sailing", f"POST-{i}-2 about tea", f"POST-{i}-3 about maps"),
        plan=(f"PLAN-{i}: practical, low-tech advice",),
    )


PAIRS = [make_pair(1), make_pair(2, "Arts"), make_pair(3)]


def judge_spec(server, kind="pairwise", **options):
    """Judge options as a researcher sets them; connection settings as the platform does (runtime)."""
    runtime = {"backend": "openai", "base_url": server.base_url, "max_retries": 0, "timeout": 5,
               **{k: options.pop(k) for k in list(options) if k in BACKEND_OPTIONS}}
    return ModelSpec(kind=kind, path="judge-model", options=options, runtime=runtime)


def block(user: str, label: str) -> str:
    match = re.search(rf"=== {label} ===\n(.*?)\n=== End of {label.lower()} ===", user, re.S)
    assert match, f"no {label} block in the prompt"
    return match.group(1)


def user_message(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def picks_the_chosen(body: dict) -> str:
    """A perfect judge: names the slot holding the CHOSEN answer, with some reasoning first."""
    user = user_message(body)
    letter = "A" if "CHOSEN-" in block(user, "Answer A") else "B"
    return f"The person cares about practical advice.\n\n**Verdict:** {letter}"


# -- parsing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("output, verdict", [
    ("Verdict: A", "A"),
    ("Some reasoning.\n\nVerdict: B", "B"),
    ("verdict: b", "B"),
    ("**Verdict:** A", "A"),
    ("**Verdict: B**", "B"),
    ("Verdict: [A]", "A"),
    ("Verdict: (B).", "B"),
    ('Verdict: "A"', "A"),
    ("Final verdict: Answer B", "B"),
    ("## Verdict\nA", "A"),
    ("Verdict: A\n...\nVerdict: A", "A"),
    # A revised verdict: the last well-formed verdict line counts (issue 10, case 7).
    ("Verdict: A\nOn reflection...\nVerdict: B", "B"),
    ("Verdict: B\nWait, re-reading answer A...\nFinal verdict: A", "A"),
    ("Verdict: A\nVerdict: both", "A"),
    ("B", "B"),
    ("**A**", "A"),
    ("(a)", "A"),
])
def test_well_formed_verdicts_are_read(output, verdict):
    assert parse_verdict(output) == verdict


@pytest.mark.parametrize("output", [
    "", "   ", "Both answers are good.", "Neither.", "Verdict: both", "Verdict: neither", "Verdict: tie",
    "Verdict: A or B", "Verdict: A and B", "A B",
    "I prefer A.", "Answer A is better", "Verdict: C", "Verdict:", "Verdict: A (but B is close)",
])
def test_anything_else_is_a_parse_failure_never_a_default(output):
    assert parse_verdict(output) is None


@pytest.mark.parametrize("output, score", [
    ("Score: 7", 7.0), ("reasoning\nScore: 8.5", 8.5), ("**Score:** 10", 10.0), ("score: 1", 1.0),
    ("Score: 6/10", 6.0), ("Score: [9]", 9.0), ("Final score: 3 out of 10", 3.0), ("4", 4.0),
    ("Score: 5\nScore: 5", 5.0),
    # A revised score: the last well-formed score line counts (issue 10, case 7).
    ("Score: 6\nOn reflection the answer misses nothing.\nFinal score: 9", 9.0), ("Score: 7\nScore: 8", 8.0),
    ("Score: 7\nScore: 11", 7.0),
])
def test_well_formed_scores_are_read(output, score):
    assert parse_score(output) == score


@pytest.mark.parametrize("output", [
    "", "Score: 11", "Score: 0", "Score: 0.5", "Score: -3", "Score: 7-8", "Score: seven",
    "It deserves a 7.", "Score: 7 or 8", "Score: NaN",
])
def test_malformed_or_out_of_range_scores_are_failures(output):
    assert parse_score(output) is None


# -- pairwise judge ----------------------------------------------------------------------------

def test_truncated_and_refused_verdicts_are_failures_with_their_reason_never_parsed(fake_openai):
    from pipeline.services import rm_summarize
    from tests.prblib.fake_openai import text, truncated

    def respond(body):
        user = user_message(body)
        chosen_first = "CHOSEN-" in block(user, "Answer A")
        if "CHOSEN-1" in user:  # pair 1: the first order is cut off mid-verdict, twice
            return truncated("Verdict: A and") if chosen_first else text(picks_the_chosen(body))
        if "CHOSEN-2" in user and not chosen_first:  # pair 2: the second order is refused, twice
            return text("I'm sorry, but I can't help with judging this.")
        return text(picks_the_chosen(body))

    fake_openai.responder = respond
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    results = {r.id: r for r in judge.score_pairs(PAIRS[:2], setting="profile")}
    first, second = results["p1"].details, results["p2"].details
    assert [o.get("failure") for o in first["orders"]] == ["truncated", None]
    assert first["orders"][0]["verdict"] is None  # "Verdict: A and" is never read as A
    assert first["failures"] == {"truncated": 1} and second["failures"] == {"refused": 1}
    assert not results["p1"].correct and not results["p2"].correct  # a 1-1 split is a tie
    summary = rm_summarize([("Arts", r.correct, r.chosen_score == r.rejected_score, r.details, r.chosen_score,
                             r.rejected_score) for r in results.values()], kind="pairwise")
    assert summary["judge"]["failures_by_reason"] == {"truncated": 1, "refused": 1}
    assert summary["judge"]["parse_failures"] == 2


def test_the_registry_builds_a_pairwise_judge(fake_openai):
    judge = load_reward_model(judge_spec(fake_openai))
    assert isinstance(judge, PairwiseJudge) and judge.both_orders and judge.temperature == 0


def test_a_judge_that_picks_the_chosen_answer_gets_every_pair_right(fake_openai):
    fake_openai.responder = picks_the_chosen
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    calls = []
    results = {r.id: r for r in judge.score_pairs(PAIRS, setting="profile", progress=calls.append)}
    assert calls == [1, 1, 1]
    assert set(results) == {"p1", "p2", "p3"}
    for result in results.values():
        assert result.correct and (result.chosen_score, result.rejected_score) == (2.0, 0.0)
        assert [o["chosen_position"] for o in result.details["orders"]] == ["A", "B"]
        assert [o["verdict"] for o in result.details["orders"]] == ["A", "B"]
        assert result.details["parse_failures"] == 0
        assert result.details["orders"][0]["raw"].endswith("**Verdict:** A")
    assert len(fake_openai.requests) == 6
    body = fake_openai.bodies[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["seed"] == 0


def test_both_orders_are_sent_chosen_as_a_then_as_b(fake_openai):
    fake_openai.responder = picks_the_chosen
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    list(judge.score_pairs([PAIRS[0]], setting="no_profile"))
    first, second = fake_openai.user_messages()
    assert block(first, "Answer A") == PAIRS[0].chosen and block(first, "Answer B") == PAIRS[0].rejected
    assert block(second, "Answer A") == PAIRS[0].rejected and block(second, "Answer B") == PAIRS[0].chosen


def test_a_judge_that_always_says_a_is_caught_by_the_order_numbers(fake_openai):
    fake_openai.responder = lambda body: "Verdict: A"
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    results = list(judge.score_pairs(PAIRS, setting="profile"))
    # Chosen wins as A, loses as B: every pair a 1-1 tie, wrong under the paper's rule.
    assert all(r.tie and not r.correct and (r.chosen_score, r.rejected_score) == (1.0, 1.0) for r in results)
    stats = judge_order_stats([r.details for r in results])
    assert stats["judgments"] == 6 and stats["pairs"] == 3
    assert stats["accuracy"] == 0.5
    assert stats["accuracy_chosen_first"] == 1.0 and stats["accuracy_chosen_second"] == 0.0
    assert stats["position_bias"] == 1.0
    assert stats["order_consistency"] == 0.0
    assert stats["parse_failure_rate"] == 0.0
    report = summarize([(p.domain, r.correct, r.tie) for p, r in zip(PAIRS, results)])
    assert report["accuracy"] == 0.0 and report["accuracy_ties_half"] == 0.5 == stats["accuracy"]


def test_malformed_outputs_are_counted_as_failures_and_never_defaulted(fake_openai):
    # Pairs run one at a time (concurrency 1), each pair's two orders in sequence.
    fake_openai.script(
        "Both answers are fine.", "Verdict: A or B",          # p1: two failures
        "Verdict: A", "I cannot decide.",                     # p2: chosen picked once, then a failure
        "Verdict: A\nWait, no.\nVerdict: B", "Verdict: B",    # p3: revised to B (rejected), then chosen picked
    )
    judge = PairwiseJudge.load(judge_spec(fake_openai, concurrency=1))
    results = {r.id: r for r in judge.score_pairs(PAIRS, setting="profile")}
    p1, p2, p3 = results["p1"], results["p2"], results["p3"]
    assert (p1.chosen_score, p1.rejected_score, p1.details["parse_failures"]) == (0.0, 2.0, 2)
    assert (p2.chosen_score, p2.rejected_score, p2.details["parse_failures"]) == (1.0, 1.0, 1)
    assert (p3.chosen_score, p3.rejected_score, p3.details["parse_failures"]) == (1.0, 1.0, 0)
    assert not any(r.correct for r in results.values())
    assert [o["verdict"] for o in p1.details["orders"]] == [None, None]
    stats = judge_order_stats([r.details for r in results.values()])
    assert stats["parse_failures"] == 3 and stats["parse_failure_rate"] == 3 / 6
    assert stats["order_consistency"] == 0.0  # p1, p2 have a failure; p3 said "B" in both orders
    assert stats["accuracy"] == 2 / 6


def test_one_order_places_chosen_by_the_pair_id_and_sends_one_request(fake_openai):
    fake_openai.responder = picks_the_chosen
    judge = PairwiseJudge.load(judge_spec(fake_openai, both_orders=False))
    pairs = [make_pair(i) for i in range(1, 21)]
    results = list(judge.score_pairs(pairs, setting="no_profile"))
    assert len(fake_openai.requests) == 20
    assert all(r.correct and (r.chosen_score, r.rejected_score) == (1.0, 0.0) for r in results)
    positions = [r.details["orders"][0]["chosen_position"] for r in results]
    assert set(positions) == {"A", "B"}  # not always in the same slot
    rerun = PairwiseJudge.load(judge_spec(fake_openai, both_orders=False))
    again = list(rerun.score_pairs(pairs, setting="no_profile"))
    assert {r.id: r.details["orders"][0]["chosen_position"] for r in again} == \
        {r.id: r.details["orders"][0]["chosen_position"] for r in results}


@pytest.mark.parametrize("setting", ["no_profile", "profile", "plan"])
def test_the_prompt_holds_the_question_and_the_setting_context_and_never_the_answer_key(fake_openai, setting):
    fake_openai.responder = picks_the_chosen
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    list(judge.score_pairs(PAIRS, setting=setting))
    sent = [json.dumps(body) for body in fake_openai.bodies]
    assert len(sent) == 6
    for pair in PAIRS:
        prompts = [u for u in fake_openai.user_messages() if pair.question in u]
        assert len(prompts) == 2
        for prompt in prompts:
            assert (all(post in prompt for post in pair.profile)) == (setting == "profile")
            assert (pair.plan[0] in prompt) == (setting == "plan")
    for secret in ANSWER_KEY.values():
        for sentinel in [secret["narrative"], *secret["rubric"]]:
            assert not any(sentinel.split(":")[0] in body for body in sent)  # not even the tag


def test_the_profile_is_cut_to_profile_k_posts(fake_openai):
    fake_openai.responder = picks_the_chosen
    spec = ModelSpec(kind="pairwise", path="judge-model", profile_k=2,
                     runtime={"base_url": fake_openai.base_url, "max_retries": 0})
    list(PairwiseJudge.load(spec).score_pairs([PAIRS[0]], setting="profile"))
    prompt = fake_openai.user_messages()[0]
    assert PAIRS[0].profile[0] in prompt and PAIRS[0].profile[1] in prompt and PAIRS[0].profile[2] not in prompt


def test_render_inputs_are_exactly_the_prompts_sent(fake_openai):
    fake_openai.responder = picks_the_chosen
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    list(judge.score_pairs([PAIRS[1]], setting="profile"))
    order1, order2 = judge.render_inputs(PAIRS[1], setting="profile")
    assert order1 == messages_as_text(fake_openai.bodies[0]["messages"])
    assert order2 == messages_as_text(fake_openai.bodies[1]["messages"])
    assert PAIRS[1].question in order1 and PAIRS[1].profile[0] in order2


def test_the_plan_setting_without_a_plan_is_refused_before_any_request(fake_openai):
    judge = PairwiseJudge.load(judge_spec(fake_openai))
    no_plan = PairInput(id="x", domain="Arts", question="q", chosen="c", rejected="r")
    with pytest.raises(ModelError, match="planner"):
        list(judge.score_pairs([PAIRS[0], no_plan], setting="plan"))
    assert fake_openai.requests == []


def test_an_endpoint_failure_stops_the_evaluation_with_the_reason(fake_openai):
    fake_openai.responder = lambda body: status(500)
    judge = PairwiseJudge.load(judge_spec(fake_openai, max_retries=1, backoff_base=0.001))
    with pytest.raises(ModelError, match="answered 500 after 2 attempts"):
        list(judge.score_pairs(PAIRS, setting="profile"))


def test_the_cache_dir_option_makes_a_rerun_free(fake_openai, tmp_path):
    fake_openai.responder = picks_the_chosen
    spec = judge_spec(fake_openai, cache_dir=str(tmp_path / "judge-cache"))
    first = sorted((r.id, r.chosen_score) for r in PairwiseJudge.load(spec).score_pairs(PAIRS, setting="profile"))
    assert len(fake_openai.requests) == 6
    second = sorted((r.id, r.chosen_score) for r in PairwiseJudge.load(spec).score_pairs(PAIRS, setting="profile"))
    assert second == first and len(fake_openai.requests) == 6


@pytest.mark.parametrize("options, message", [
    ({"both_orders": "yes"}, "option 'both_orders': Input should be a valid boolean"),
    ({"temperature": -1}, "option 'temperature': Input should be greater than or equal to 0"),
    ({"max_tokens": 0}, "option 'max_tokens': Input should be greater than or equal to 1"),
    ({"shuffle": True}, "option 'shuffle' is not an option of the pairwise kind"),
    ({"api_key": "sk-oops"}, "option 'api_key' is not an option of the pairwise kind"),
])
def test_bad_judge_options_are_refused(fake_openai, options, message):
    spec = ModelSpec(kind="pairwise", path="judge-model", options=options,
                     runtime={"base_url": fake_openai.base_url, "max_retries": 0})
    with pytest.raises(ModelError, match=re.escape(message)):
        PairwiseJudge.load(spec)


@pytest.mark.parametrize("key, value", [("base_url", "http://127.0.0.1:9/v1"), ("api_key_env", "DATABASE_URL"),
                                        ("backend", "openai"), ("cache_dir", "/tmp/x"), ("models_root", "/"),
                                        ("timeout", 1)])
def test_connection_settings_in_a_submissions_options_are_refused_before_any_request(fake_openai, key, value):
    spec = ModelSpec(kind="pairwise", path="judge-model", options={key: value},
                     runtime={"base_url": fake_openai.base_url, "max_retries": 0})
    with pytest.raises(ModelError, match=re.escape(f"option '{key}' is not an option of the pairwise kind")):
        PairwiseJudge.load(spec)
    assert fake_openai.requests == []


# -- pointwise judge ---------------------------------------------------------------------------

def rates_chosen_high(body: dict) -> str:
    answer = block(user_message(body), "Answer")
    return "Fits well.\nScore: 8" if answer.startswith("CHOSEN-") else "Generic.\nScore: 3.5"


def test_a_pointwise_judge_rates_each_answer_alone(fake_openai):
    fake_openai.responder = rates_chosen_high
    judge = load_reward_model(judge_spec(fake_openai, kind="pointwise"))
    assert isinstance(judge, PointwiseJudge)
    calls = []
    results = list(judge.score_pairs(PAIRS, setting="profile", progress=calls.append))
    assert calls == [1, 1, 1] and len(fake_openai.requests) == 6
    assert all(r.correct and (r.chosen_score, r.rejected_score) == (8.0, 3.5) for r in results)
    assert all(r.details["parse_failures"] == 0 for r in results)
    for user in fake_openai.user_messages():
        answer = block(user, "Answer")
        assert ("CHOSEN-" in user) != ("REJECTED-" in user)  # one response per request
        assert answer in user and "Score: N" in user
    chosen_prompt, rejected_prompt = judge.render_inputs(PAIRS[0], setting="profile")
    assert PAIRS[0].chosen in chosen_prompt and PAIRS[0].rejected not in chosen_prompt
    assert PAIRS[0].rejected in rejected_prompt


def test_pointwise_failures_leave_the_score_empty_and_the_pair_wrong(fake_openai):
    fake_openai.script("Score: 11", "Score: 2",    # p1: chosen out of range
                       "Score: 9", "no idea",      # p2: rejected unparseable
                       "Score: 6", "Score: 6")     # p3: a tie
    judge = PointwiseJudge.load(judge_spec(fake_openai, kind="pointwise", concurrency=1))
    results = {r.id: r for r in judge.score_pairs(PAIRS, setting="no_profile")}
    assert (results["p1"].chosen_score, results["p1"].rejected_score) == (None, 2.0)
    assert (results["p2"].chosen_score, results["p2"].rejected_score) == (9.0, None)
    assert results["p1"].details["parse_failures"] == 1 and results["p2"].details["parse_failures"] == 1
    assert results["p1"].details["raw"]["chosen"] == "Score: 11"
    assert results["p3"].tie
    assert not any(r.correct for r in results.values())


def test_pointwise_judges_take_no_order_option(fake_openai):
    with pytest.raises(ModelError, match=re.escape("option 'both_orders' is not an option of the pointwise kind "
                                                   "(allowed: temperature, max_tokens, seed, prompt_template, "
                                                   "prompt_format, answer_parser, model_preset)")):
        PointwiseJudge.load(judge_spec(fake_openai, kind="pointwise", both_orders=True))


# -- a tiny random local LM --------------------------------------------------------------------

def test_a_random_local_model_gives_parse_failures_and_every_pair_is_wrong(tiny_lm_folder):  # noqa: F811
    spec = ModelSpec(kind="pairwise", path=str(tiny_lm_folder), options={"max_tokens": 8},
                     runtime={"backend": "local"})
    judge = load_reward_model(spec)
    try:
        results = list(judge.score_pairs(PAIRS[:2], setting="profile"))
    finally:
        judge.close()
    assert len(results) == 2
    for result in results:
        assert result.details["parse_failures"] == 2
        assert [o["verdict"] for o in result.details["orders"]] == [None, None]
        assert all(o["raw"] for o in result.details["orders"])  # it did say something
        # 8 tokens, then 16, with no end-of-sequence token: truncated twice, never parsed as a verdict
        assert [o["failure"] for o in result.details["orders"]] == ["truncated", "truncated"]
        assert result.details["failures"] == {"truncated": 2}
        assert (result.chosen_score, result.rejected_score) == (0.0, 2.0) and not result.correct
    stats = judge_order_stats([r.details for r in results])
    assert stats["parse_failure_rate"] == 1.0 and stats["accuracy"] == 0.0
