"""The scoring engine and rotary embeddings that depend on the sequence length of the call.

transformers recomputes the RoPE frequencies of "longrope" (short factors up to
original_max_position_embeddings, long ones beyond) and "dynamic" (NTK scaling beyond
max_position_embeddings) models from the largest position id of each forward call. A shared
prefix pass or a batch with a longer neighbour then changes a text's score, so for such
models the engine scores every sequence alone.
"""

from __future__ import annotations

import copy
import logging
import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from prblib.rewards.engine import ScoringEngine, Unit, length_dependent_rope

TOLERANCE = 1e-5
THRESHOLD = 32  # longrope's original_max_position_embeddings, dynamic NTK's max_position_embeddings
VOCAB = 97
PAD = 0


def tiny_longrope_phi3(seed: int = 0) -> nn.Module:
    from transformers import Phi3Config, Phi3ForSequenceClassification

    head_dim = 32 // 4
    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4 * THRESHOLD, original_max_position_embeddings=THRESHOLD,
        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.1, num_labels=1,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0 + 0.1 * i for i in range(head_dim // 2)],
                         "long_factor": [1.0 + 3.0 * i for i in range(head_dim // 2)]})
    return _build(Phi3ForSequenceClassification, config, seed)


def tiny_llama(seed: int = 0, rope_parameters: dict | None = None) -> nn.Module:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=THRESHOLD, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2, initializer_range=0.1, num_labels=1, rope_parameters=rope_parameters)
    return _build(LlamaForSequenceClassification, config, seed)


def tiny_dynamic_llama(seed: int = 0) -> nn.Module:
    return tiny_llama(seed, {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})


def _build(model_class, config, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return model_class(config).eval()


MODELS = {"longrope phi3": tiny_longrope_phi3, "dynamic ntk llama": tiny_dynamic_llama}


def straddling_units(seed: int = 0) -> list[Unit]:
    """Prompts of 10-30 tokens with responses whose full texts end on both sides of THRESHOLD."""
    rng = random.Random(seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, VOCAB) for _ in range(n))

    shapes = [(25, (3, 20)), (28, (2, 5, 40)), (10, (12, 50)), (30, (1, 1 + THRESHOLD)), (12, (4, 6))]
    units = []
    for key, (prompt_len, response_lens) in enumerate(shapes):
        prompt = (1,) + tokens(prompt_len - 1)
        seqs = tuple(prompt + tokens(n) for n in response_lens)
        units.append(Unit(key=key, sequences=seqs, positions=tuple(len(s) - 1 for s in seqs)))
    assert any(len(s) <= THRESHOLD for u in units for s in u.sequences)
    assert any(len(s) > THRESHOLD for u in units for s in u.sequences)
    return units


def scores_alone(pristine: nn.Module, units: list[Unit]) -> dict[int, list[float]]:
    """Each text through the model's own forward, alone, in a fresh copy (no RoPE state left by other calls)."""
    out = {}
    with torch.inference_mode():
        for unit in units:
            out[unit.key] = [float(copy.deepcopy(pristine)(input_ids=torch.tensor([seq])).logits[0, 0])
                             for seq in unit.sequences]
    return out


def assert_scores_match(got: dict[int, list[float]], expected: dict[int, list[float]]) -> None:
    assert set(got) == set(expected)
    for key, ref in expected.items():
        assert got[key] == pytest.approx(ref, abs=TOLERANCE), f"unit {key}"


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_whose_rope_depends_on_the_call_length_is_recognised(name):
    assert length_dependent_rope(MODELS[name]()) in {"longrope", "dynamic"}


def test_an_ordinary_llama_is_not_taken_for_a_length_dependent_rope():
    assert length_dependent_rope(tiny_llama()) is None
    assert length_dependent_rope(tiny_llama(rope_parameters={"rope_type": "linear", "factor": 2.0})) is None


def test_a_length_dependent_rope_type_for_one_layer_type_is_recognised():
    model = nn.Module()
    model.config = SimpleNamespace(layer_types=["full_attention", "sliding_attention"], rope_parameters={
        "full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "dynamic", "factor": 2.0}})
    assert length_dependent_rope(model) == "dynamic"
    model.config = SimpleNamespace(rope_parameters=None, rope_scaling={"type": "longrope"})
    assert length_dependent_rope(model) == "longrope"


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("batch_size", [3, 8])
def test_a_length_dependent_rope_model_scores_each_text_as_it_would_alone_without_the_prefix_cache(
        name, batch_size):
    model = MODELS[name]()
    pristine = copy.deepcopy(model)
    units = straddling_units(seed=batch_size)
    engine = ScoringEngine(model, pad_id=PAD, batch_size=batch_size)
    assert engine.mode == "full"
    assert engine.scores_alone
    expected = scores_alone(pristine, units)
    assert_scores_match(dict(engine.score(units)), expected)
    assert engine.mode == "full"
    assert_scores_match(dict(engine.score(list(reversed(units)))), expected)  # no RoPE state kept between calls


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("mode", ["full", "logits", "prefix"])
def test_every_mode_scores_a_length_dependent_rope_model_text_by_text(name, mode):
    model = MODELS[name]()
    pristine = copy.deepcopy(model)
    units = straddling_units(seed=7)
    engine = ScoringEngine(model, pad_id=PAD, batch_size=4, mode=mode)
    assert engine.mode != "prefix"
    assert_scores_match(dict(engine.score(units)), scores_alone(pristine, units))


@pytest.mark.parametrize("name", list(MODELS))
def test_the_self_check_says_why_a_length_dependent_rope_model_is_scored_alone(name, caplog):
    model = MODELS[name]()
    pristine = copy.deepcopy(model)
    units = straddling_units(seed=3)
    with caplog.at_level(logging.WARNING, logger="prblib.rewards.engine"):
        engine = ScoringEngine(model, pad_id=PAD, batch_size=4)
        note = engine.check_prefix_mode(units, tolerance=TOLERANCE, shipped_pad_id=PAD)
        scores = dict(engine.score(units))
    assert note and "alone" in note and length_dependent_rope(model) in note
    assert engine.mode == "full"
    assert sum("alone" in r.getMessage() for r in caplog.records) == 1  # logged once, not per batch
    assert_scores_match(scores, scores_alone(pristine, units))


def test_an_ordinary_llama_still_uses_the_prefix_cache_and_batches():
    model = tiny_llama()
    units = straddling_units(seed=1)
    engine = ScoringEngine(model, pad_id=PAD, batch_size=4)
    assert engine.mode == "prefix" and not engine.scores_alone
    assert engine.check_prefix_mode(units, tolerance=1e-4, shipped_pad_id=PAD) is None
    assert engine.mode == "prefix"
    calls = []
    handle = model.model.register_forward_hook(lambda module, args, kwargs_out: calls.append(1))
    try:
        got = dict(engine.score(units))
    finally:
        handle.remove()
    assert len(calls) < sum(len(u.sequences) for u in units)  # batched, not one forward per text
    expected = scores_alone(copy.deepcopy(model), units)
    assert set(got) == set(expected)
    for key, ref in expected.items():
        assert got[key] == pytest.approx(ref, abs=1e-4)
