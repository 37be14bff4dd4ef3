"""The answer shapes real servers send (vLLM, TGI, hosted APIs), each sent raw by the fake
server and pinned with its outcome: the answer stored and shown, the reasoning kept apart, the
failure reason, whether the cache kept it, and the bill."""

from pathlib import Path

import pytest

from prblib.llm.answers import END_OF_SEQUENCE, END_OF_TURN, AnswerError, clean_answer, message_parts
from prblib.errors import ModelError
from prblib.rewards.judges import parse_score, parse_verdict
from prblib.llm.client import CachedBackend, OpenAIChatBackend, ask
from tests.prblib.fake_openai import choice, completion, raw
from tests.pipeline.test_build import answer, lamp_folder  # noqa: F401 (a fixture)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Judge it."}]


def backend_for(server, **kwargs):
    kwargs = {"timeout": 2.0, "max_retries": 2, "backoff_base": 0.001, "backoff_max": 0.01, **kwargs}
    return OpenAIChatBackend(server.base_url, "fake-model", **kwargs)


def cached(server, tmp_path, **kwargs):
    return CachedBackend(backend_for(server, **kwargs), tmp_path / "cache")


def entries(tmp_path: Path) -> int:
    folder = tmp_path / "cache"
    return len(list(folder.rglob("*.json"))) if folder.exists() else 0


def get(backend, **kwargs):
    params = {"temperature": 0.0, "max_tokens": 16, "seed": 0, **kwargs}
    return ask(backend, MESSAGES, **params)


# -- where the text is ----------------------------------------------------------------------------

def test_a_plain_string_content_is_the_answer_and_is_cached(fake_openai, tmp_path):
    fake_openai.script(raw(completion(choice("Verdict: A"))))
    backend = cached(fake_openai, tmp_path)
    [answer] = get(backend)
    assert (answer.text, answer.reasoning, answer.finish_reason) == ("Verdict: A", "", "stop")
    assert entries(tmp_path) == 1
    [again] = get(backend)
    assert again.text == "Verdict: A" and len(fake_openai.requests) == 1


def test_content_as_chunks_thinking_apart_from_text(fake_openai, tmp_path):
    fake_openai.script(raw(completion(choice([{"type": "thinking", "thinking": "Answer B is generic. Verdict: B?"},
                                              {"type": "text", "text": "Verdict: A"}]))))
    backend = cached(fake_openai, tmp_path)
    [answer] = get(backend)
    assert answer.text == "Verdict: A"
    assert answer.reasoning == "Answer B is generic. Verdict: B?"
    assert parse_verdict(answer.text) == "A"
    [again] = get(backend)  # the reasoning is kept in the cache too
    assert (again.text, again.reasoning) == ("Verdict: A", "Answer B is generic. Verdict: B?")
    assert len(fake_openai.requests) == 1


def test_nested_mistral_thinking_chunks_and_bare_strings(fake_openai):
    fake_openai.script(raw(completion(choice([
        {"type": "thinking", "thinking": [{"type": "text", "text": "first "}, {"type": "text", "text": "second"}]},
        "Score: ", {"type": "output_text", "text": "8"}, {"type": "image_url", "image_url": {"url": "x"}}]))))
    [answer] = get(backend_for(fake_openai))
    assert (answer.text, answer.reasoning) == ("Score: 8", "first second")
    assert parse_score(answer.text) == 8.0


def test_a_refusal_chunk_is_a_refusal(fake_openai):
    fake_openai.script(raw(completion(choice([{"type": "refusal", "refusal": "I won't judge this."}]))),
                       raw(completion(choice([{"type": "refusal", "refusal": "I won't judge this."}]))))
    with pytest.raises(AnswerError) as caught:
        get(backend_for(fake_openai))
    assert caught.value.reason == "refused"
    assert len(fake_openai.requests) == 2  # asked once more with the next seed


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_field_beside_content_is_kept_apart(fake_openai, field):
    fake_openai.script(raw(completion(choice("Verdict: B", **{field: "A ignores the person. Verdict: A"}))))
    [answer] = get(backend_for(fake_openai))
    assert (answer.text, answer.reasoning) == ("Verdict: B", "A ignores the person. Verdict: A")
    assert parse_verdict(answer.text) == "B"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_content_null_with_only_reasoning_is_no_answer_and_never_cached(fake_openai, tmp_path, field):
    reasoning_only = raw(completion(choice(None, **{field: "Thinking... Verdict: A"})))
    fake_openai.script(reasoning_only)
    backend = cached(fake_openai, tmp_path)
    with pytest.raises(AnswerError) as caught:
        get(backend)
    assert caught.value.reason == "no_answer"
    assert str(caught.value) == "the model gave an empty answer (the endpoint sent only reasoning)"
    assert caught.value.reasoning == "Thinking... Verdict: A" and caught.value.text == ""
    assert entries(tmp_path) == 0
    # The server is fixed: the rerun sends a request instead of reading an empty answer from disk.
    fake_openai.script(raw(completion(choice("Verdict: A", **{field: "Thinking..."}))))
    [answer] = get(backend)
    assert answer.text == "Verdict: A" and len(fake_openai.requests) == 2 and entries(tmp_path) == 1


@pytest.mark.parametrize("content", ["", "   ", None, [], "<|eot_id|>", "<think>all of it is reasoning"])
def test_an_empty_final_answer_is_no_answer_and_never_cached(fake_openai, tmp_path, content):
    fake_openai.script(raw(completion(choice(content))))
    backend = cached(fake_openai, tmp_path)
    with pytest.raises(AnswerError, match="^the model gave an empty answer") as caught:
        get(backend)
    assert caught.value.reason == "no_answer" and entries(tmp_path) == 0


def test_a_policy_keeps_its_empty_sample_but_the_cache_does_not(fake_openai, tmp_path):
    fake_openai.script(raw(completion(choice("one"), choice(""))))
    backend = cached(fake_openai, tmp_path)
    answers = ask(backend, MESSAGES, temperature=0.8, max_tokens=16, seed=1, n=2, refusals="keep")
    assert [a.text for a in answers] == ["one", ""]
    assert entries(tmp_path) == 0


def test_a_think_block_in_the_content_is_reasoning(fake_openai):
    fake_openai.script(raw(completion(choice("<think>\nVerdict: B at first.\n</think>\n\nVerdict: A"))),
                       raw(completion(choice("The template opened it. Verdict: B</think>Verdict: A"))))
    backend = backend_for(fake_openai)
    [first] = get(backend)
    [second] = get(backend, seed=1)
    assert (first.text, first.reasoning) == ("Verdict: A", "Verdict: B at first.")
    assert (second.text, second.reasoning) == ("Verdict: A", "The template opened it. Verdict: B")


# -- end-of-turn and special tokens -----------------------------------------------------------------

@pytest.mark.parametrize("token", END_OF_TURN + END_OF_SEQUENCE)
def test_every_end_token_spelling_is_stripped(fake_openai, tmp_path, token):
    fake_openai.script(raw(completion(choice(f"Verdict: A{token}"))), raw(completion(choice(f"Score: 8{token}\n"))))
    backend = cached(fake_openai, tmp_path)
    [verdict] = get(backend)
    [score] = get(backend, seed=1)
    assert (verdict.text, score.text) == ("Verdict: A", "Score: 8")
    assert (parse_verdict(verdict.text), parse_score(score.text)) == ("A", 8.0)
    [stored] = get(backend)  # stored clean
    assert stored.text == "Verdict: A" and len(fake_openai.requests) == 2


def test_text_after_an_end_of_turn_token_is_not_the_answer():
    assert clean_answer("Verdict: A<|eot_id|>assistant\n\nVerdict: B") == "Verdict: A"
    assert clean_answer("Verdict: B<|im_end|>\n<|im_start|>user\nmore") == "Verdict: B"
    assert clean_answer("Use <s>old</s> markup.</s></s>") == "Use <s>old</s> markup."  # only where it ends


def test_a_tokenizers_special_tokens_are_stripped_where_one_is_known():
    special = ["[CLS]", "[SEP]", "[PAD]", "</s>"]
    assert clean_answer("[CLS] Score: 7 [SEP][PAD][PAD]", special) == "Score: 7"
    assert clean_answer("a </s> b</s>", special) == "a </s> b"


def test_old_cache_entries_are_normalised_as_they_are_read(fake_openai, tmp_path):
    import json

    backend = cached(fake_openai, tmp_path)
    key = backend.key(MESSAGES, temperature=0.0, max_tokens=16, seed=0, n=1)
    (tmp_path / "cache").mkdir(parents=True, exist_ok=True)
    backend._files.write(key, lambda fh: fh.write(json.dumps({"key": key, "model": "fake-model", "completions": [
        {"text": "<think>hm</think>Verdict: A<|eot_id|>", "prompt_tokens": 3, "completion_tokens": 4,
         "finish_reason": "stop", "refused": False}]}).encode()))
    [answer] = get(backend)
    assert (answer.text, answer.reasoning) == ("Verdict: A", "hm") and fake_openai.requests == []


def test_an_old_cache_entry_holding_an_empty_answer_is_asked_again(fake_openai, tmp_path):
    import json

    backend = cached(fake_openai, tmp_path)
    key = backend.key(MESSAGES, temperature=0.0, max_tokens=16, seed=0, n=1)
    backend._files.write(key, lambda fh: fh.write(json.dumps({"key": key, "model": "fake-model", "completions": [
        {"text": "", "prompt_tokens": 3, "completion_tokens": 0, "finish_reason": "stop"}]}).encode()))
    fake_openai.script(raw(completion(choice("Verdict: B"))))
    [answer] = get(backend)
    assert answer.text == "Verdict: B" and len(fake_openai.requests) == 1


# -- finish reasons ------------------------------------------------------------------------------------

@pytest.mark.parametrize("finish", ["stop", "eos_token", "stop_sequence", "eos", "end_turn"])
def test_complete_finish_reasons(fake_openai, finish):
    fake_openai.script(raw(completion(choice("Verdict: A", finish_reason=finish))))
    [answer] = get(backend_for(fake_openai))
    assert (answer.text, answer.finish_reason, answer.truncated) == ("Verdict: A", finish, False)


@pytest.mark.parametrize("finish", [None, ...])
def test_a_missing_finish_reason_counts_as_complete_and_is_counted(fake_openai, finish):
    fake_openai.script(raw(completion(choice("Verdict: A", finish_reason=finish))))
    backend = backend_for(fake_openai)
    [answer] = get(backend)
    assert (answer.text, answer.finish_reason) == ("Verdict: A", None)
    assert backend.usage()["events"] == {"finish_reason_missing": 1}


@pytest.mark.parametrize("finish", ["length", "model_length", "max_tokens"])
def test_cut_finish_reasons_are_asked_again_with_twice_the_budget(fake_openai, finish):
    fake_openai.script(raw(completion(choice("The answer is", finish_reason=finish))),
                       raw(completion(choice("The answer is A.", finish_reason="stop"))))
    [answer] = get(backend_for(fake_openai))
    assert answer.text == "The answer is A."
    assert [b["max_tokens"] for b in fake_openai.bodies] == [16, 32]


@pytest.mark.parametrize("finish", ["abort", "error"])
def test_an_aborted_answer_is_sent_again_and_the_partial_one_never_kept(fake_openai, tmp_path, finish):
    fake_openai.script(raw(completion(choice("The chosen answer is half a sen", finish_reason=finish))),
                       raw(completion(choice("The chosen answer is whole."))))
    backend = cached(fake_openai, tmp_path)
    [answer] = get(backend)
    assert answer.text == "The chosen answer is whole."
    assert len(fake_openai.requests) == 2 and entries(tmp_path) == 1
    assert backend.usage()["events"] == {"aborted_retried": 1}


def test_an_answer_aborted_every_time_fails_with_that_reason_and_is_not_cached(fake_openai, tmp_path):
    fake_openai.responder = lambda body: raw(completion(choice("Verdict: A (provisio", finish_reason="abort")))
    backend = cached(fake_openai, tmp_path, max_retries=2)
    with pytest.raises(AnswerError) as caught:
        get(backend)
    assert caught.value.reason == "aborted"
    assert str(caught.value) == (f"endpoint {fake_openai.base_url} stopped the answer (finish reason 'abort') "
                                 "(3 attempts)")
    assert caught.value.text == "Verdict: A (provisio"
    assert len(fake_openai.requests) == 3 and entries(tmp_path) == 0
    # The server is fixed: the rerun sends a request.
    fake_openai.responder = None
    fake_openai.script(raw(completion(choice("Verdict: A"))))
    assert get(backend)[0].text == "Verdict: A" and len(fake_openai.requests) == 4


@pytest.mark.parametrize("finish,reason,words", [
    ("content_filter", "filtered", "stopped the answer with its content filter (finish reason 'content_filter')"),
    ("tool_calls", "unfinished", "did not finish the answer (finish reason 'tool_calls')"),
    ("function_call", "unfinished", "did not finish the answer (finish reason 'function_call')"),
    ("recitation", "unfinished", "did not finish the answer (finish reason 'recitation')"),
    ("SAFETY", "unfinished", "did not finish the answer (finish reason 'SAFETY')"),
])
def test_other_finish_reasons_are_failures_with_that_reason_never_answers(fake_openai, tmp_path, finish, reason,
                                                                          words):
    fake_openai.script(raw(completion(choice("Verdict: A, provisi", finish_reason=finish))))
    backend = cached(fake_openai, tmp_path)
    with pytest.raises(AnswerError) as caught:
        get(backend)
    assert caught.value.reason == reason
    assert str(caught.value) == f"endpoint {fake_openai.base_url} {words}"
    assert len(fake_openai.requests) == 1 and entries(tmp_path) == 0  # not retried, not kept


def test_one_aborted_choice_among_n_fails_the_request_not_only_that_sample(fake_openai):
    fake_openai.script(raw(completion(choice("one"), choice("tw", finish_reason="abort"))),
                       raw(completion(choice("one"), choice("two"))))
    answers = ask(backend_for(fake_openai), MESSAGES, temperature=0.7, max_tokens=16, seed=3, n=2)
    assert [a.text for a in answers] == ["one", "two"] and len(fake_openai.requests) == 2


# -- usage ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("usage", [None, ..., {}, {"total_tokens": 30}, {"prompt_tokens": 10},
                                   {"prompt_tokens": None, "completion_tokens": None}])
def test_unknown_usage_is_unknown_not_zero(fake_openai, usage):
    fake_openai.script(raw(completion(choice("Verdict: A"), usage=usage)), raw(completion(choice("Verdict: B"))))
    backend = backend_for(fake_openai, price_prompt_per_1k=1.0, price_completion_per_1k=2.0)
    get(backend)
    spent = backend.usage()
    assert (spent["cost"], spent["requests_without_usage"], spent["successes"]) == (None, 1, 1)
    get(backend, seed=1)  # a later request with usage does not make the bill known
    spent = backend.usage()
    assert (spent["cost"], spent["requests_without_usage"], spent["prompt_tokens"]) == (None, 1, 10)


def test_known_usage_is_billed(fake_openai):
    fake_openai.script(raw(completion(choice("Verdict: A"), usage={"prompt_tokens": 1000, "completion_tokens": 500})))
    backend = backend_for(fake_openai, price_prompt_per_1k=1.0, price_completion_per_1k=2.0)
    get(backend)
    assert (backend.usage()["cost"], backend.usage()["requests_without_usage"]) == (2.0, 0)


def test_a_judges_bill_is_unknown_when_a_request_had_no_usage(fake_openai):
    from prblib.rewards.base import PairInput
    from prblib.rewards.judges import PairwiseJudge

    fake_openai.script(raw(completion(choice("Verdict: A"), usage=None)), raw(completion(choice("Verdict: B"))))
    judge = PairwiseJudge(backend_for(fake_openai, price_prompt_per_1k=1.0, price_completion_per_1k=1.0))
    pair = PairInput(id="p1", question="Which?", chosen="a", rejected="b", domain="d")
    list(judge.score_pairs([pair], setting="no_profile"))
    used = judge.usage()
    assert (used["cost"], used["requests_without_usage"], used["requests"]) == (None, 1, 2)


# -- choices and error bodies ------------------------------------------------------------------------

@pytest.mark.parametrize("index", [None, ...])
def test_choices_without_index_keep_the_order_received(fake_openai, index):
    kwargs = {} if index is ... else {"index": index}
    fake_openai.script(raw(completion(*(choice(t, **kwargs) for t in ("third", "first", "second")), indexed=False)))
    answers = ask(backend_for(fake_openai), MESSAGES, temperature=0.8, max_tokens=16, seed=0, n=3)
    assert [a.text for a in answers] == ["third", "first", "second"]
    assert [a.completion_tokens for a in answers] == [5, 0, 0]


def test_choices_with_index_are_put_in_index_order(fake_openai):
    fake_openai.script(raw(completion(choice("b", index=1), choice("c", index=2), choice("a", index=0))))
    answers = ask(backend_for(fake_openai), MESSAGES, temperature=0.8, max_tokens=16, seed=0, n=3)
    assert [a.text for a in answers] == ["a", "b", "c"]


@pytest.mark.parametrize("body,message", [
    ({"error": {"message": "The model is sleeping; wake it first.", "type": "ServiceUnavailable", "code": 503}},
     "The model is sleeping; wake it first. (503)"),
    ({"error": "engine dead: CUDA error: an illegal memory access"}, "engine dead: CUDA error: an illegal memory access"),
    ({"object": "error", "message": "KV cache is full", "type": "BadRequestError", "param": None, "code": 400},
     "KV cache is full"),
    ({"detail": "Not Found"}, "Not Found"),
])
def test_a_200_with_an_error_body_keeps_the_servers_message(fake_openai, tmp_path, body, message):
    fake_openai.script(raw(body))
    backend = cached(fake_openai, tmp_path)
    with pytest.raises(AnswerError) as caught:
        get(backend)
    assert caught.value.reason == "endpoint_error"
    assert str(caught.value) == f"endpoint {fake_openai.base_url} answered with an error: {message}"
    assert entries(tmp_path) == 0


@pytest.mark.parametrize("body,message", [
    ("<html>502 Bad Gateway</html>", "gave an unusable answer: not JSON ('<html>502 Bad Gateway</html>')"),
    ([1, 2], "gave an unusable answer: not a JSON object"),
    ({"choices": []}, "answered with no choices"),
    ({"choices": "Verdict: A"}, "gave an unusable answer: choices is not a list of objects"),
])
def test_unusable_bodies_are_one_clear_line(fake_openai, body, message):
    fake_openai.script(raw(body))
    with pytest.raises(ModelError) as caught:
        get(backend_for(fake_openai))
    assert str(caught.value) == f"endpoint {fake_openai.base_url} {message}"


def test_message_parts_of_what_is_not_a_message():
    assert message_parts(None) == ("", "", "")
    assert message_parts({"content": 42}) == ("", "", "")


# -- a build against such an endpoint ----------------------------------------------------------------

@pytest.mark.django_db
def test_a_build_never_stores_a_partial_or_reasoning_only_answer(staff_user, fake_openai, lamp_folder):  # noqa: F811
    """Per LaMP-QA item: lamp-0's chosen is always aborted; lamp-1's chosen has only reasoning;
    lamp-10's rejected is stopped by a content filter; lamp-11's answers end in <|eot_id|> (kept,
    cleaned); lamp-20 aborts once, then answers; lamp-21 plans through an error body (HTTP 200)."""
    import re

    from pipeline.build import build_create, build_execute
    from pipeline.models import BuildStatus, LLMEndpoint

    seen: dict = {}

    def respond(body):
        user = body["messages"][-1]["content"]
        number = int(re.search(r"landscapes\? \((\d+)\)", user).group(1))
        side = "planner" if "ASPECT-" not in user else ("chosen" if "for this person in particular" in user
                                                        else "rejected")
        nth = seen[(number, side)] = seen.get((number, side), 0) + 1
        if side == "planner":
            if number == 21:
                return raw({"error": {"message": "planner model unloaded", "code": 503}})
            return "- Practical, low-cost steps\n- Builds on the watercolour lessons"
        if number == 0 and side == "chosen":
            return raw(completion(choice("Paint small studies outdo", finish_reason="abort")))
        if number == 1 and side == "chosen":
            return raw(completion(choice(None, reasoning_content="They like landscapes, so...")))
        if number == 10 and side == "rejected":
            return raw(completion(choice("Paint small", finish_reason="content_filter")))
        if number == 11:
            return raw(completion(choice(answer(body) + "<|eot_id|>assistant\n\nMore text.")))
        if number == 20 and nth == 1:
            return raw(completion(choice("Paint sm", finish_reason="abort")))
        return answer(body)

    fake_openai.responder = respond
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=1)
    build = build_create(user=staff_user, name="shapes-v1", source_path="lamp-qa", split="test", generator="fake",
                         generator_model="gen-model", planner="fake", planner_model="plan-model", temperature=0.0)
    assert build_execute(build_id=build.pk) == BuildStatus.FAILED
    build.refresh_from_db()
    reasons = dict(build.items.exclude(error="").values_list("source_id", "error_reason"))
    assert reasons == {"lamp-0": "aborted", "lamp-1": "no_answer", "lamp-10": "filtered", "lamp-21": "endpoint_error"}
    errors = dict(build.items.exclude(error="").values_list("source_id", "error"))
    assert errors["lamp-21"] == (f"endpoint {fake_openai.base_url} answered with an error: "
                                 "planner model unloaded (503)")
    assert errors["lamp-1"] == "the model gave an empty chosen answer (the endpoint sent only reasoning)"
    kept = {i.source_id: i for i in build.items.filter(error="")}
    assert sorted(kept) == ["lamp-11", "lamp-20"]
    for item in kept.values():  # whole answers, cleaned: nothing past the end of turn
        assert re.fullmatch(r"(Paint small studies outdoors and compare them\. ){17}Variant \d+\.", item.chosen)
        assert re.fullmatch(r"(Paint small studies outdoors and compare them\. ){17}Variant \d+\.", item.rejected)
    failed = build.items.get(source_id="lamp-0")
    assert (failed.chosen, failed.rejected) == ("", "")
    generator = build.tokens["generator"]
    # lamp-0 once (max_retries 1), lamp-20 once per side
    assert (generator["events"]["aborted"], generator["events"]["aborted_retried"]) == (1, 3)
    assert generator["requests_without_usage"] == 0


# -- judges read the final answer; the reasoning is shown, never parsed -------------------------------

def judge_pair():
    from prblib.rewards.base import PairInput

    return PairInput(id="p1", question="Which?", chosen="a", rejected="b", domain="d")


def test_a_pairwise_judge_reads_the_answer_and_shows_the_reasoning_apart(fake_openai, tmp_path):
    from prblib.rewards.judges import PairwiseJudge

    fake_openai.script(
        raw(completion(choice(None, reasoning_content="Answer A fits. Verdict: A"))),  # chosen shown as A
        raw(completion(choice([{"type": "thinking", "thinking": "Verdict: A, surely"},
                               {"type": "text", "text": "Verdict: B<|eot_id|>"}]))))  # chosen shown as B
    judge = PairwiseJudge(cached(fake_openai, tmp_path))
    [result] = judge.score_pairs([judge_pair()], setting="no_profile")
    first, second = result.details["orders"]
    assert first == {"chosen_position": "A", "verdict": None, "raw": "", "reasoning": "Answer A fits. Verdict: A",
                     "failure": "no_answer"}
    assert second == {"chosen_position": "B", "verdict": "B", "raw": "Verdict: B", "reasoning": "Verdict: A, surely"}
    assert (result.chosen_score, result.rejected_score) == (1.0, 1.0)
    assert result.details["failures"] == {"no_answer": 1} and entries(tmp_path) == 1  # only the answer is kept
    # Once the server is fixed, the order that failed is asked again; the other comes from disk.
    fake_openai.script(raw(completion(choice("Verdict: A", reasoning_content="Answer A fits."))))
    [again] = PairwiseJudge(cached(fake_openai, tmp_path)).score_pairs([judge_pair()], setting="no_profile")
    assert [o["verdict"] for o in again.details["orders"]] == ["A", "B"] and len(fake_openai.requests) == 3


def test_a_pointwise_judge_keeps_each_responses_reasoning(fake_openai):
    from prblib.rewards.judges import PointwiseJudge

    fake_openai.script(raw(completion(choice("Score: 8<|im_end|>", reasoning="Fits them. Score: 2"))),
                       raw(completion(choice("Score: 3", finish_reason="content_filter"))))
    [result] = PointwiseJudge(backend_for(fake_openai)).score_pairs([judge_pair()], setting="no_profile")
    assert (result.chosen_score, result.rejected_score) == (8.0, None)
    assert result.details["raw"] == {"chosen": "Score: 8", "rejected": "Score: 3"}
    assert result.details["reasoning"] == {"chosen": "Fits them. Score: 2", "rejected": ""}
    assert result.details["failures"] == {"filtered": 1}


# -- degenerate sampling: one n=16 request answered with 16 copies ------------------------------------

def policy_item(i: int) -> dict:
    return {"id": f"q{i}", "question": f"How do I start painting? ({i})", "profile_texts": ["I like hills."]}


def seed_of(body) -> str:
    return f"sample with seed {body.get('seed')}"


def test_identical_samples_are_asked_again_one_per_request(fake_openai, tmp_path):
    from prblib.downstream.bon import SamplingReport, derived_seed, is_degenerate, sample_responses

    # The n=16 request gets 16 copies (the vLLM fault); single requests sample properly.
    fake_openai.responder = lambda body: seed_of(body) if body["n"] == 1 else raw(completion(
        *[choice("the same sample")] * body["n"]))
    report = SamplingReport()
    [(item_id, texts)] = list(sample_responses(cached(fake_openai, tmp_path), [policy_item(0)], n=16, seed=5,
                                               report=report))
    assert item_id == "q0" and len(texts) == 16 and not is_degenerate(texts)
    assert texts == ["the same sample"] + [f"sample with seed {derived_seed(5, j)}" for j in range(1, 16)]
    assert (report.retried, report.degenerate) == (1, [])
    assert [b["n"] for b in fake_openai.bodies] == [16] + [1] * 15


def test_samples_that_stay_identical_are_reported(fake_openai):
    from prblib.downstream.bon import SamplingReport, sample_responses

    fake_openai.responder = lambda body: raw(completion(*[choice("always this")] * body["n"]))
    report = SamplingReport()
    outcome = dict(sample_responses(backend_for(fake_openai), [policy_item(0), policy_item(1)], n=4, seed=0,
                                    report=report))
    assert outcome == {"q0": ["always this"] * 4, "q1": ["always this"] * 4}
    assert (report.retried, sorted(report.degenerate)) == (2, ["q0", "q1"])


def test_greedy_samples_may_be_identical(fake_openai):
    from prblib.downstream.bon import SamplingReport, sample_responses

    fake_openai.responder = lambda body: raw(completion(*[choice("greedy")] * body["n"]))
    report = SamplingReport()
    assert dict(sample_responses(backend_for(fake_openai), [policy_item(0)], n=4, temperature=0.0,
                                 report=report)) == {"q0": ["greedy"] * 4}
    assert (report.retried, report.degenerate, len(fake_openai.requests)) == (0, [], 1)


def test_the_degenerate_rule():
    from prblib.downstream.bon import is_degenerate

    assert is_degenerate(["a", "a"]) and is_degenerate(["a", "a ", "b", "b"])
    assert not is_degenerate(["a", "b"]) and not is_degenerate(["a", "a", "b", "c"]) and not is_degenerate(["a"])


@pytest.mark.django_db
@pytest.mark.parametrize("stuck,status", [(4, "FAILED"), (1, "SUCCEEDED")])
def test_a_sample_set_whose_items_stay_degenerate(researcher, fake_openai, tmp_path, stuck, status):
    """6 items; `stuck` of them get identical samples however they are asked."""
    import re

    from pipeline.downstream import samples_generate
    from pipeline.models import Benchmark, LLMEndpoint, PolicySample, PolicySampleSet
    from pipeline.services import benchmark_import
    from tests.pipeline.test_formats import make_row, write_jsonl

    benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [make_row(i) for i in range(6)]), name="tiny")
    questions = [item.question for item in Benchmark.objects.get(name="tiny").items.order_by("position")]
    broken = set(questions[:stuck])

    def respond(body):
        user = body["messages"][-1]["content"]
        same = any(q in user for q in broken)
        n = body["n"]
        return raw(completion(*[choice("one answer for all" if same else f"answer {i} seed {body['seed']}")
                                for i in range(n)], usage=None if n == 1 else {"prompt_tokens": 10,
                                                                                 "completion_tokens": 40}))

    fake_openai.responder = respond
    endpoint = LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=0)
    sample_set = PolicySampleSet.objects.create(benchmark=Benchmark.objects.get(name="tiny"), policy="p",
                                                endpoint=endpoint, model="m", n=4)
    assert samples_generate(sample_set=sample_set) == status
    sample_set.refresh_from_db()
    kept_items = PolicySample.objects.filter(sample_set=sample_set).values("item").distinct().count()
    usage = sample_set.usage
    assert usage["degenerate_retried"] == stuck
    assert (usage["requests"], usage["requests_without_usage"], usage["cost"]) == (6 + 3 * stuck, 3 * stuck, None)
    if status == "FAILED":
        assert sample_set.error == ("the samples of 4 of 6 items are degenerate (at most half of an item's 4 samples "
                                    "distinct, also when asked one sample per request): the endpoint does not sample "
                                    "each answer on its own (check that it honours temperature and seed); none of "
                                    "them was kept; run again to retry them")
        assert kept_items == 2 and "degenerate_items" not in usage
    else:
        assert kept_items == 6 and usage["degenerate_items"] == 1 and sample_set.error == ""
    assert not re.search(r"Traceback", sample_set.error)


# -- endpoint capabilities: parameters a server refuses, learned once from its 400 ----------------------

def refusing(name: str, message: str, *, param: str | None = None, status: int = 400):
    """A server that answers `status` naming `name` whenever a request carries it."""
    def respond(body):
        if name in body:
            return raw({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                  "code": "unsupported_parameter"}}, status=status)
        return raw(completion(*[choice(f"answer {i}") for i in range(body.get("n") or 1)]))
    return respond


@pytest.mark.parametrize("name,message,param,learned,event", [
    ("max_tokens", "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                   "'max_completion_tokens' instead.", "max_tokens",
     {"token_parameter": "max_completion_tokens"}, "max_tokens_refused"),
    ("temperature", "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) "
                    "value is supported.", "temperature", {"accepts_temperature": False}, "temperature_refused"),
    ("seed", "Unrecognized request argument supplied: seed", None, {"accepts_seed": False}, "seed_refused"),
    ("reasoning_effort", "reasoning_effort is not supported by this model", None, {"reasoning_effort": ""},
     "reasoning_effort_refused"),
])
def test_a_refused_parameter_is_learned_once_and_the_request_sent_again(fake_openai, name, message, param, learned,
                                                                       event):
    fake_openai.responder = refusing(name, message, param=param)
    backend = backend_for(fake_openai, reasoning_effort="low")
    assert [a.text for a in get(backend)] == ["answer 0"]
    assert [a.text for a in get(backend, seed=1)] == ["answer 0"]
    assert [name in b for b in fake_openai.bodies] == [True, False, False]  # refused once, then never sent
    assert {k: v for k, v in backend.capabilities().items() if k in learned} == learned
    assert backend.usage()["events"] == {event: 1}


def test_max_completion_tokens_carries_the_budget_once_learned(fake_openai):
    fake_openai.responder = refusing("max_tokens", "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens'.")
    get(backend_for(fake_openai), max_tokens=48)
    assert [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in fake_openai.bodies] == [(48, None), (None, 48)]


def test_a_server_refusing_max_completion_tokens_gets_max_tokens(fake_openai):
    fake_openai.responder = refusing("max_completion_tokens", "extra inputs are not permitted: max_completion_tokens",
                                     status=422)
    backend = backend_for(fake_openai, token_parameter="max_completion_tokens")
    get(backend)
    assert backend.token_parameter == "max_tokens" and "max_tokens" in fake_openai.bodies[-1]


def test_a_server_refusing_n_is_asked_one_request_per_answer(fake_openai):
    fake_openai.responder = refusing("n", "n must be 1 when using this model", param=None)
    backend = backend_for(fake_openai)
    answers = ask(backend, MESSAGES, temperature=0.8, max_tokens=16, seed=7, n=3)
    assert [a.text for a in answers] == ["answer 0"] * 3
    assert backend.accepts_n is False and [b.get("n") for b in fake_openai.bodies] == [3, None, None, None]
    from prblib.llm.client import sample_seed
    assert [b.get("seed") for b in fake_openai.bodies[1:]] == [7, sample_seed(7, 1), sample_seed(7, 2)]


@pytest.mark.parametrize("message", ["max_tokens is too large: 100000. This model's maximum context length is 8192",
                                     "Invalid 'messages': empty array", "temperature must be between 0 and 2"])
def test_a_400_that_refuses_no_parameter_by_name_is_not_learned(fake_openai, message):
    fake_openai.script(raw({"error": {"message": message, "type": "invalid_request_error"}}, status=400))
    backend = backend_for(fake_openai)
    with pytest.raises(ModelError) as caught:
        get(backend)
    assert str(caught.value) == f"endpoint {fake_openai.base_url} answered 400 for model 'fake-model': {message}"
    assert len(fake_openai.requests) == 1 and backend.capabilities() == {
        "response_format": "json_schema", "token_parameter": "max_tokens", "accepts_temperature": True,
        "accepts_seed": True, "accepts_n": True, "reasoning_effort": ""}


def test_configured_capabilities_shape_the_request(fake_openai):
    backend = backend_for(fake_openai, token_parameter="max_completion_tokens", accepts_temperature=False,
                          accepts_seed=False, reasoning_effort="high")
    get(backend, max_tokens=64)
    [body] = fake_openai.bodies
    assert (body["max_completion_tokens"], body["reasoning_effort"]) == (64, "high")
    assert not {"max_tokens", "temperature", "seed"} & set(body)


@pytest.mark.django_db
def test_what_a_server_refused_is_stored_on_the_endpoint_and_never_sent_again(fake_openai, tmp_path):
    from pipeline.downstream import samples_generate
    from pipeline.models import Benchmark, LLMEndpoint, PolicySampleSet
    from pipeline.services import benchmark_import
    from tests.pipeline.test_formats import make_row, write_jsonl

    def respond(body):
        if "max_tokens" in body:
            return raw({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                                             "Use 'max_completion_tokens' instead.", "param": "max_tokens"}}, status=400)
        if "seed" in body:
            return raw({"error": {"message": "Unsupported parameter: 'seed'", "param": "seed"}}, status=400)
        return raw(completion(*[choice(f"answer {i} of {len(json.dumps(body))}") for i in range(body["n"])]))

    import json

    fake_openai.responder = respond
    benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [make_row(i) for i in range(3)]), name="tiny")
    endpoint = LLMEndpoint.objects.create(name="hosted", base_url=fake_openai.base_url, max_retries=0,
                                          max_concurrency=1)
    first = PolicySampleSet.objects.create(benchmark=Benchmark.objects.get(name="tiny"), policy="p",
                                           endpoint=endpoint, model="m", n=2)
    assert samples_generate(sample_set=first) == "SUCCEEDED"
    endpoint.refresh_from_db()
    assert (endpoint.token_parameter, endpoint.accepts_seed, endpoint.accepts_temperature) == (
        "max_completion_tokens", False, True)
    first.refresh_from_db()
    assert first.usage["requests"] == 5  # 2 refusals, then 3 answers
    sent = len(fake_openai.requests)
    second = PolicySampleSet.objects.create(benchmark=Benchmark.objects.get(name="tiny"), policy="p",
                                            endpoint=endpoint, model="m", n=2, seed=1)
    assert samples_generate(sample_set=second) == "SUCCEEDED"
    later = fake_openai.bodies[sent:]
    assert len(later) == 3 and not any("max_tokens" in b or "seed" in b for b in later)


@pytest.mark.django_db
def test_llm_endpoint_add_sets_the_capabilities(capsys):
    import json

    from django.core.management import CommandError, call_command

    call_command("llm_endpoint", "add", "hosted", "--base-url", "https://api.example.com/v1", "--api-key-env", "KEY",
                 "--token-parameter", "max_completion_tokens", "--no-temperature", "--no-seed", "--no-n",
                 "--reasoning-effort", "low")
    capsys.readouterr()
    call_command("llm_endpoint", "list", "--format", "json")
    [row] = json.loads(capsys.readouterr().out)
    assert {k: row[k] for k in ("token_parameter", "accepts_temperature", "accepts_seed", "accepts_n",
                                "reasoning_effort")} == {
        "token_parameter": "max_completion_tokens", "accepts_temperature": False, "accepts_seed": False,
        "accepts_n": False, "reasoning_effort": "low"}
    call_command("llm_endpoint", "list")
    assert capsys.readouterr().out.strip().endswith(
        "tokens=max_completion_tokens not-sent=temperature,seed,n reasoning_effort=low")
    from pipeline.endpoints import endpoint_runtime
    from pipeline.models import LLMEndpoint

    runtime = endpoint_runtime(LLMEndpoint.objects.get(name="hosted"), model="gpt-x")
    assert {k: runtime[k] for k in ("token_parameter", "accepts_temperature", "accepts_seed", "accepts_n",
                                    "reasoning_effort")} == {
        "token_parameter": "max_completion_tokens", "accepts_temperature": False, "accepts_seed": False,
        "accepts_n": False, "reasoning_effort": "low"}
    with pytest.raises(CommandError, match="invalid choice: 'max_output_tokens'"):
        call_command("llm_endpoint", "add", "bad", "--base-url", "http://x/v1", "--token-parameter",
                     "max_output_tokens")
