"""The dpo kind against a plain computation written here: tiny causal LMs (Llama and GPT-2, fixed seeds,
saved as safetensors), each answer's log-probability summed by hand from one unpadded forward pass."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

from prblib.rewards.base import ModelSpec, PairInput, ScoreInput, load_reward_model
from prblib.errors import ModelError
from prblib.rewards.options import OptionsError, parse_options
from prblib.tiny_models import load_tokenizer

# A template with a generation prompt and an end-of-turn marker: the answer's tokens are "A<|end|>\n".
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
PAIRS = [
    PairInput(id="a", domain="d", question="Which city should I visit in spring?",
              chosen="Kyoto, for the cherry blossoms along the river.", rejected="Any."),
    PairInput(id="b", domain="d", question="How do I keep basil alive indoors?",
              chosen="Give it a sunny window and water when the top soil is dry.",
              rejected="Basil is a plant that some people grow, and it needs light and water and care."),
    PairInput(id="c", domain="d", question="A short one?", chosen="Yes.", rejected="No, a long one after all."),
]


def build_causal_lm(folder: Path, *, arch: str = "llama", seed: int = 0, chat_template: str | None = TEMPLATE) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(chat_template=chat_template)
    if arch == "llama":
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False, initializer_range=0.2)
        model_class = LlamaForCausalLM
    else:
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=512,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            initializer_range=0.2)
        model_class = GPT2LMHeadModel
    torch.manual_seed(seed)
    model = model_class(config).float().eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@functools.lru_cache(maxsize=8)
def _loaded(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def plain_logp(folder: Path, prompt: str, answer: str) -> tuple[float, list[float]]:
    """Sum and per-token log-probs of `answer`'s tokens (+ [SEP], the EOS) after `prompt` (+ [CLS] when the
    prompt does not start with it): one forward pass of the whole unpadded text, float64 log-softmax."""
    tokenizer, model = _loaded(folder)
    cls, sep = tokenizer.convert_tokens_to_ids("[CLS]"), tokenizer.convert_tokens_to_ids("[SEP]")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if prompt_ids[:1] != [cls]:
        prompt_ids = [cls] + prompt_ids
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [sep]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    tokens = [logps[len(prompt_ids) + j - 1, t].item() for j, t in enumerate(answer_ids)]
    return sum(tokens), tokens


def spec(policy: Path, *, root: Path, batch_size: int = 4, **options) -> ModelSpec:
    return ModelSpec(kind="dpo", path=str(policy), batch_size=batch_size, options=options,
                     runtime={"models_root": str(root)})


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dpo-models")
    build_causal_lm(folder / "policy", seed=1)
    build_causal_lm(folder / "reference", seed=2)
    build_causal_lm(folder / "gpt2-policy", arch="gpt2", seed=3, chat_template=None)
    build_causal_lm(folder / "gpt2-reference", arch="gpt2", seed=4, chat_template=None)
    return folder


def test_dpo_rewards_equal_the_policy_minus_reference_log_probs_of_the_answer(root, one_torch_thread):
    model = load_reward_model(spec(root / "policy", root=root, reference="reference", batch_size=4))
    results = {r.id: r for r in model.score_pairs(PAIRS, setting="no_profile")}
    worst = 0.0
    for pair in PAIRS:
        # The template by hand: the prompt ends with the generation prompt, the answer adds "A<|end|>\n".
        prompt = f"[CLS]<|user|>\n{pair.question}<|end|>\n<|assistant|>\n"
        for role, answer in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            policy, _ = plain_logp(root / "policy", prompt, f"{answer}<|end|>\n")
            reference, _ = plain_logp(root / "reference", prompt, f"{answer}<|end|>\n")
            got = getattr(results[pair.id], f"{role}_score")
            worst = max(worst, abs(got - (policy - reference)))
    print(f"dpo (llama, chat template, batch 4): max |reward - plain| = {worst:.3g}")
    assert worst < 1e-4
    assert results["a"].details["tokens"][1] == len(load_tokenizer()("Any.<|end|>\n", add_special_tokens=False)
                                                    ["input_ids"]) + 1
    text, _ = model.render_inputs(PAIRS[0], setting="no_profile")
    assert text == f"[CLS]<|user|>\n{PAIRS[0].question}<|end|>\n<|assistant|>\n{PAIRS[0].chosen}<|end|>\n"


def test_without_a_template_prompt_and_answer_are_concatenated_and_beta_scales(root, one_torch_thread):
    model = load_reward_model(spec(root / "gpt2-policy", root=root, reference="gpt2-reference", beta=0.1,
                                   batch_size=3))
    worst = 0.0
    for result, pair in zip(model.score_pairs(PAIRS, setting="no_profile"), PAIRS):
        for role in ("chosen", "rejected"):
            answer = getattr(pair, role)
            policy, _ = plain_logp(root / "gpt2-policy", pair.question + "\n\n", answer)
            reference, _ = plain_logp(root / "gpt2-reference", pair.question + "\n\n", answer)
            worst = max(worst, abs(getattr(result, f"{role}_score") - 0.1 * (policy - reference)))
    print(f"dpo (gpt2, plain concatenation, beta 0.1): max |reward - plain| = {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("norm", ["avg", "sum", "norm"])
def test_the_reference_free_variant_reduces_the_policy_log_probs(root, one_torch_thread, norm):
    model = load_reward_model(spec(root / "policy", root=root, reference_free=True, reference_free_norm=norm))
    group = ScoreInput(id="g", question=PAIRS[1].question, responses=(PAIRS[1].chosen, PAIRS[1].rejected, "Ok."))
    [(gid, scores)] = list(model.score_groups([group], setting="no_profile"))
    prompt = f"[CLS]<|user|>\n{group.question}<|end|>\n<|assistant|>\n"
    for score, answer in zip(scores, group.responses):
        total, tokens = plain_logp(root / "policy", prompt, f"{answer}<|end|>\n")
        expected = {"avg": total / len(tokens), "sum": total,
                    "norm": -math.sqrt(sum(t * t for t in tokens))}[norm]
        assert score == pytest.approx(expected, abs=1e-5)


def test_folders_and_options_are_refused_with_one_line(root, tmp_path):
    with pytest.raises(OptionsError, match="reference_free needs no reference"):
        parse_options("dpo", {"reference": "reference", "reference_free": True})
    with pytest.raises(OptionsError, match="only with reference_free"):
        parse_options("dpo", {"reference": "reference", "reference_free_norm": "sum"})
    with pytest.raises(OptionsError, match="relative to the models folder"):
        parse_options("dpo", {"reference": "../outside"})
    assert parse_options("dpo", {"reference": "reference"}).model_folders()["reference"][:2] == ("reference",
                                                                                                 "causal-lm")
    with pytest.raises(ModelError, match="outside the models folder"):
        load_reward_model(spec(root / "policy", root=tmp_path, reference="reference"))
    (root / "scalar-like").mkdir(exist_ok=True)
    (root / "scalar-like" / "config.json").write_text('{"model_type": "llama", "architectures": '
                                                     '["LlamaForSequenceClassification"]}')
    with pytest.raises(ModelError, match="not a causal-lm model"):
        load_reward_model(spec(root / "policy", root=root, reference="scalar-like"))
