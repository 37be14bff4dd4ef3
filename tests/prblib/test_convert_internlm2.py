"""InternLM2 reward checkpoints converted to LlamaForSequenceClassification, against a reference forward pass
written here from InternLM2's definition (plain torch, float64): RMSNorm, rotary embeddings on the fused
grouped wqkv, grouped-query attention, SwiGLU, the v_head on the last token."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from prblib.rewards.base import ModelSpec, PairInput, load_reward_model
from prblib.errors import ModelError
from prblib.rewards.convert_internlm2 import convert_internlm2
from prblib.modelcheck import check_model_folder, inspect_model_folder
from prblib.tiny_models import load_tokenizer

# InternLM2's chat format (ChatML-like), with the tokenizer's BOS first.
INTERNLM2_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                      "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
REWARD_TOKEN = "<|reward|>"


def build_internlm2_rm(folder: Path, *, seed: int = 0, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                       layers: int = 2, intermediate: int = 48, bias: bool = False, rope_theta: float = 1e6,
                       rope_scaling: dict | None = None, max_positions: int = 512, shards: int = 2,
                       extra_tensors: dict | None = None) -> Path:
    """An InternLM2ForRewardModel-shaped checkpoint with random weights (seed `seed`), as the Hub ships them:
    config.json with auto_map, a tokenizer naming InternLM2's own class, its Python files (which must never
    run: they exit), and sharded safetensors with an index."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tokenizer = load_tokenizer(chat_template=INTERNLM2_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    tokenizer.save_pretrained(folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config.update(tokenizer_class="InternLM2Tokenizer", auto_map={
        "AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name in ("modeling_internlm2.py", "configuration_internlm2.py", "tokenization_internlm2.py"):
        (folder / name).write_text('raise SystemExit("the checkpoint\'s own code ran")\n')
    vocab = len(tokenizer)
    config = {"architectures": ["InternLM2ForRewardModel"], "model_type": "internlm2",
              "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config",
                           "AutoModel": "modeling_internlm2.InternLM2ForRewardModel"},
              "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "hidden_act": "silu", "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6,
              "rope_theta": rope_theta, "rope_scaling": rope_scaling, "bias": bias, "torch_dtype": "float32",
              "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "reward_token_id": tokenizer.convert_tokens_to_ids(REWARD_TOKEN),
              "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=generator) * scale

    hd = hidden // heads
    tensors = {"model.tok_embeddings.weight": rand(vocab, hidden, scale=1.0),
               "model.norm.weight": 1 + rand(hidden, scale=0.1), "v_head.weight": rand(1, hidden, scale=0.5)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "attention.wqkv.weight": rand((heads + 2 * kv_heads) * hd, hidden),
                        p + "attention.wo.weight": rand(hidden, heads * hd),
                        p + "feed_forward.w1.weight": rand(intermediate, hidden),
                        p + "feed_forward.w3.weight": rand(intermediate, hidden),
                        p + "feed_forward.w2.weight": rand(hidden, intermediate),
                        p + "attention_norm.weight": 1 + rand(hidden, scale=0.1),
                        p + "ffn_norm.weight": 1 + rand(hidden, scale=0.1),
                        p + "attention.rotary_emb.inv_freq": torch.ones(hd // 2)})
        if bias:
            tensors.update({p + "attention.wqkv.bias": rand((heads + 2 * kv_heads) * hd),
                            p + "attention.wo.bias": rand(hidden)})
    tensors.update(extra_tensors or {})
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        shard = f"shard-{s}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        save_file(part, folder / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def reference_reward(folder: Path, ids: list[int]) -> float:
    """InternLM2ForRewardModel's reward for one unpadded sequence, from the architecture's definition in
    float64: embeddings; per layer x += wo(attention(rope(q), rope(k), v)) with q, k, v read from the fused
    wqkv per key/value group [g queries, key, value]; x += w2(silu(w1 h) * w3 h); final RMSNorm; v_head at the
    last token. Rotary: inv_freq = theta^(-2i/d), angles t * inv_freq on (freqs, freqs), rotate_half;
    linear scaling divides t by the factor; dynamic (when the text is longer than max_position_embeddings)
    replaces theta by theta * (factor * T / max_pos - (factor - 1))^(d / (d - 2))."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    w = {}
    for shard in sorted(folder.glob("*.safetensors")):
        w.update({k: v.double() for k, v in load_file(shard).items()})
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd, groups, eps, T = hidden // heads, heads // kv, config["rms_norm_eps"], len(ids)
    theta, t = config["rope_theta"], torch.arange(T, dtype=torch.float64)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") == "linear":
        t = t / scaling["factor"]
    if scaling.get("type") == "dynamic" and T > config["max_position_embeddings"]:
        factor = scaling["factor"]
        theta = theta * ((factor * T / config["max_position_embeddings"]) - (factor - 1)) ** (hd / (hd - 2))
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.cat([torch.outer(t, inv_freq)] * 2, dim=-1)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rms(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x):  # [T, heads, hd]
        rotated = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)
        return x * cos + rotated * sin

    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = w["model.tok_embeddings.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "attention_norm.weight"])
        qkv = h @ w[p + "attention.wqkv.weight"].T + w.get(p + "attention.wqkv.bias", 0)
        qkv = qkv.view(T, kv, groups + 2, hd)
        q, k, v = rope(qkv[:, :, :groups].reshape(T, heads, hd)), rope(qkv[:, :, -2]), qkv[:, :, -1]
        out = []
        for head in range(heads):
            g = head // groups
            scores = q[:, head] @ k[:, g].T / math.sqrt(hd) + causal
            out.append(torch.softmax(scores, dim=-1) @ v[:, g])
        x = x + torch.cat(out, dim=-1) @ w[p + "attention.wo.weight"].T + w.get(p + "attention.wo.bias", 0)
        h = rms(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "feed_forward.w1.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (h @ w[p + "feed_forward.w3.weight"].T)) @ w[p + "feed_forward.w2.weight"].T
    x = rms(x, w["model.norm.weight"])
    return (x[-1] @ w["v_head.weight"][0]).item()


CASES = {"plain": {}, "bias and linear rope scaling": {"bias": True, "rope_scaling": {"type": "linear", "factor": 2.0}},
         "dynamic rope scaling past the context": {"rope_scaling": {"type": "dynamic", "factor": 2.0},
                                                   "max_positions": 16},
         "multi-query, one key/value head": {"kv_heads": 1, "heads": 4}}


@pytest.mark.parametrize("case", CASES)
def test_converted_scores_equal_the_internlm2_reference_forward(tmp_path, case, one_torch_thread):
    from transformers import AutoModelForSequenceClassification

    source = build_internlm2_rm(tmp_path / "internlm2-rm", seed=len(case), **CASES[case])
    result = convert_internlm2("internlm2-rm", "converted", models_root=tmp_path)
    assert result.folder == (tmp_path / "converted").resolve()
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "converted", dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(7)
    worst = 0.0
    for length in (5, 11, 24):
        ids = torch.randint(1000, 20000, (length,), generator=generator).tolist()
        with torch.no_grad():
            got = model(torch.tensor([ids])).logits[0, 0].item()
        worst = max(worst, abs(got - reference_reward(source, ids)))
    print(f"convert_internlm2 ({case}): max |converted - reference| = {worst:.3g}")
    assert worst < 1e-4


def test_the_converted_folder_is_an_ordinary_scalar_rm_ending_with_the_reward_token(tmp_path, one_torch_thread):
    source = build_internlm2_rm(tmp_path / "internlm2-rm")
    result = convert_internlm2("internlm2-rm", "internlm2-rm-llama", models_root=tmp_path)
    assert result.reward_token == REWARD_TOKEN and result.tensors == 3 + 2 * 9
    with pytest.raises(ModelError, match="auto_map"):  # the source itself stays refused
        check_model_folder(source, models_root=tmp_path)
    info = inspect_model_folder(Path("internlm2-rm-llama"), models_root=tmp_path)
    assert info.architectures == ("LlamaForSequenceClassification",) and info.num_labels == 1
    converted = tmp_path / "internlm2-rm-llama"
    assert not list(converted.glob("*.py"))  # the checkpoint's code is not carried over
    assert "auto_map" not in (converted / "tokenizer_config.json").read_text()

    model = load_reward_model(ModelSpec(kind="scalar", path=str(converted), batch_size=2,
                                        runtime={"models_root": str(tmp_path)}))
    pair = PairInput(id="p", domain="d", question="Which tent for a rainy weekend?",
                     chosen="A double-wall tent with a full-length fly.", rejected="Any tent works.")
    [result] = list(model.score_pairs([pair], setting="no_profile"))
    chosen_text, rejected_text = model.render_inputs(pair, setting="no_profile")
    assert chosen_text == (f"[CLS]<|im_start|>user\n{pair.question}<|im_end|>\n<|im_start|>assistant\n{pair.chosen}"
                           f"<|im_end|>\n{REWARD_TOKEN}")
    tokenizer = load_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    worst = 0.0
    for text, score in ((chosen_text, result.chosen_score), (rejected_text, result.rejected_score)):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.convert_tokens_to_ids(REWARD_TOKEN)
        worst = max(worst, abs(score - reference_reward(source, ids)))
    print(f"convert_internlm2 via the scalar kind: max |score - reference| = {worst:.3g}")
    assert worst < 1e-4


def test_what_is_not_an_internlm2_reward_checkpoint_is_refused_and_nothing_is_left(tmp_path):
    build_internlm2_rm(tmp_path / "lm", extra_tensors={"output.weight": torch.zeros(10, 32)}, shards=1)
    with pytest.raises(ModelError, match="causal LM, not a reward model"):
        convert_internlm2("lm", "out", models_root=tmp_path)
    build_internlm2_rm(tmp_path / "rm", shards=1)
    with pytest.raises(ModelError, match="outside the models folder|without '..'"):
        convert_internlm2("rm", "../escaped", models_root=tmp_path)
    with pytest.raises(ModelError, match="already exists"):
        convert_internlm2("rm", "lm", models_root=tmp_path)
    (tmp_path / "pickled").mkdir()
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        (tmp_path / "pickled" / name).write_bytes((tmp_path / "rm" / name).read_bytes())
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ModelError, match="pickle-only weights refused"):
        convert_internlm2("pickled", "out", models_root=tmp_path)
    config = json.loads((tmp_path / "rm" / "config.json").read_text())
    (tmp_path / "rm" / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    with pytest.raises(ModelError, match="do not divide evenly"):
        convert_internlm2("rm", "out", models_root=tmp_path)
    (tmp_path / "rm" / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    with pytest.raises(ModelError, match="wqkv has shape|has shape"):
        convert_internlm2("rm", "out", models_root=tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "rm" / "config.json").write_text(json.dumps(config))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm", "outside", "pickled", "rm"]  # no partial folder
    with pytest.raises(ModelError, match="outside the models folder"):
        convert_internlm2(tmp_path / "rm", "out", models_root=tmp_path / "outside")
