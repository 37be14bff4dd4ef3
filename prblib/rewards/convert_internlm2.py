"""InternLM2 reward models without their code: a checkpoint of `InternLM2ForRewardModel` rewritten as
transformers' built-in `LlamaForSequenceClassification` (one label), so it runs as an ordinary scalar RM.

Why this is exact. InternLM2 (the checkpoint's own modeling_internlm2.py, read for its definition only)
is the Llama architecture under other names: RMSNorm before attention and before the MLP, rotary
embeddings with rotate_half (theta `rope_theta`, optional linear or dynamic scaling), grouped-query
attention, a SwiGLU MLP w2(silu(w1 x) * w3 x), a final RMSNorm. The one difference in layout is the
fused query/key/value projection `wqkv`, whose output rows are grouped per key/value head: for each of
the num_key_value_heads groups, its g = num_attention_heads / num_key_value_heads query heads, then
its key head, then its value head, each head_dim = hidden_size / num_attention_heads rows
(`rearrange(qkv, "b q (h gs d) -> b q h gs d", gs=g + 2)` there). Query head h * g + j of InternLM2
is query head h * g + j of Llama, which Llama pairs with key/value head (h * g + j) // g = h, as
InternLM2 does. The reward model puts a linear `v_head` (hidden_size -> 1, no bias) on the last
token's final hidden state, which is Llama's sequence-classification `score` read at the last
non-padding token. Its `get_score` appends the reward token (`config.reward_token_id`) after the chat
template's text; the converted chat template writes that token after a conversation that does not
ask for a generation prompt, so the scalar kind's input ends with it too.

Tensor names (InternLM2 -> Llama):
    model.tok_embeddings.weight                  -> model.embed_tokens.weight
    model.layers.N.attention.wqkv.{weight,bias}  -> model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}
    model.layers.N.attention.wo.{weight,bias}    -> model.layers.N.self_attn.o_proj.{weight,bias}
    model.layers.N.feed_forward.w1 / w3 / w2     -> model.layers.N.mlp.gate_proj / up_proj / down_proj
    model.layers.N.attention_norm.weight         -> model.layers.N.input_layernorm.weight
    model.layers.N.ffn_norm.weight               -> model.layers.N.post_attention_layernorm.weight
    model.norm.weight                            -> model.norm.weight
    v_head.weight                                -> score.weight
Rotary `inv_freq` buffers are dropped (recomputed from the config); a language-model head
(`output.weight`) means a causal LM, not a reward model, and is refused, as is any other name.

What is read: config.json, the tokenizer files (tokenizer.model, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, added_tokens.json, chat_template.jinja/json) and
the safetensors tensors. Nothing else is opened: the checkpoint's Python files are never imported,
executed or copied, and pickled weights are refused. Every file read must resolve inside the models
root, as the model-folder check requires (`modelcheck`). The result is written to a new folder
under the same root (a partial folder renamed into place once complete), then checked as a scalar
RM folder is checked on submission.

The tokenizer: tokenizer_config.json loses `auto_map` and names a built-in class:
PreTrainedTokenizerFast when the checkpoint has tokenizer.json, else LlamaTokenizer over its
sentencepiece tokenizer.model (InternLM2's tokenizer is a sentencepiece BPE; transformers needs the
`sentencepiece` package to read one). Plain Python (torch, safetensors, transformers' LlamaConfig);
no Django.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from prblib.errors import ModelError
from prblib.modelcheck import (_read_json_object, _read_text, _safetensors_files, check_model_folder,
                                    ensure_inside_root)

ARCHITECTURE = "InternLM2ForRewardModel"
TOKENIZER_COPIED = ("tokenizer.model", "tokenizer.json", "special_tokens_map.json", "added_tokens.json")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "attention.wo.weight": "self_attn.o_proj.weight", "attention.wo.bias": "self_attn.o_proj.bias",
    "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {"model.tok_embeddings.weight": "model.embed_tokens.weight", "model.norm.weight": "model.norm.weight",
              "v_head.weight": "score.weight"}


@dataclass(frozen=True)
class Shape:
    """The dimensions the conversion needs, from the InternLM2 config."""

    hidden: int
    heads: int
    kv_heads: int
    layers: int
    intermediate: int
    vocab: int
    bias: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


@dataclass
class Conversion:
    """What a conversion did: the new folder, tensors written (Llama names), the reward token placed."""

    folder: Path
    tensors: int = 0
    parameters: int = 0
    reward_token: str | None = None
    notes: list[str] = field(default_factory=list)


def split_wqkv(wqkv: Any, shape: Shape) -> tuple[Any, Any, Any]:
    """(q, k, v) of a fused InternLM2 projection, weight [(heads + 2 kv_heads) * head_dim, hidden] or bias
    [(heads + 2 kv_heads) * head_dim], in Llama's order: q [heads * head_dim, ...], k and v
    [kv_heads * head_dim, ...] (the grouped layout of the module docstring). ModelError on a wrong size."""
    rows = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    if wqkv.shape[0] != rows or (wqkv.dim() == 2 and wqkv.shape[1] != shape.hidden) or wqkv.dim() not in (1, 2):
        raise ModelError(f"wqkv has shape {list(wqkv.shape)}; the config's heads ({shape.heads} query, "
                         f"{shape.kv_heads} key/value, head_dim {shape.head_dim}) need [{rows}, {shape.hidden}]")
    rest = tuple(wqkv.shape[1:])
    grouped = wqkv.reshape(shape.kv_heads, shape.groups + 2, shape.head_dim, *rest)
    q = grouped[:, :shape.groups].reshape(shape.heads * shape.head_dim, *rest)
    k = grouped[:, -2].reshape(shape.kv_heads * shape.head_dim, *rest)
    v = grouped[:, -1].reshape(shape.kv_heads * shape.head_dim, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def llama_name(name: str) -> str | None:
    """The Llama name of an InternLM2 tensor (wqkv: its prefix, "...self_attn.qkv" + suffix, split
    later); None for buffers that are dropped; ModelError for a name this conversion does not know."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _LAYER.match(name)
    if match:
        index, rest = match.groups()
        if rest.endswith("rotary_emb.inv_freq"):
            return None
        if rest in ("attention.wqkv.weight", "attention.wqkv.bias"):
            return f"model.layers.{index}.self_attn.qkv.{rest.rsplit('.', 1)[1]}"
        if rest in _LAYER_NAMES:
            return f"model.layers.{index}.{_LAYER_NAMES[rest]}"
    if name == "output.weight":
        raise ModelError("the checkpoint has a language-model head (output.weight): it is an InternLM2 causal LM, "
                         "not a reward model (which has v_head.weight)")
    raise ModelError(f"tensor {name!r} is not part of an InternLM2 reward model; refused rather than dropped")


def _positive_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"config.json: {key} must be a positive integer, not {value!r}")
    return value


def read_shape(config: dict[str, Any]) -> Shape:
    """The dimensions of an InternLM2 reward config; ModelError naming what does not fit."""
    if config.get("model_type") != "internlm2":
        raise ModelError(f"config.json has model_type {config.get('model_type')!r}, not 'internlm2'")
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise ModelError(f"config.json names {architectures or 'no architecture'}, not {ARCHITECTURE}: only InternLM2 "
                         "reward models are converted")
    heads = _positive_int(config, "num_attention_heads")
    shape = Shape(hidden=_positive_int(config, "hidden_size"), heads=heads,
                  kv_heads=_positive_int(config, "num_key_value_heads", heads),
                  layers=_positive_int(config, "num_hidden_layers"),
                  intermediate=_positive_int(config, "intermediate_size"), vocab=_positive_int(config, "vocab_size"),
                  bias=bool(config.get("bias", True)))
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ModelError(f"config.json: hidden_size {shape.hidden}, num_attention_heads {shape.heads} and "
                         f"num_key_value_heads {shape.kv_heads} do not divide evenly")
    if config.get("hidden_act", "silu") != "silu":
        raise ModelError(f"config.json: hidden_act {config.get('hidden_act')!r}; InternLM2's SwiGLU uses silu")
    return shape


def llama_config(config: dict[str, Any], shape: Shape) -> Any:
    """transformers' LlamaConfig equal to the InternLM2 config, with one label (the reward)."""
    from transformers import LlamaConfig

    scaling = config.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("type") or scaling.get("rope_type") if isinstance(scaling, dict) else None
        if kind not in ("linear", "dynamic") or not isinstance(scaling.get("factor"), (int, float)):
            raise ModelError(f"config.json: rope_scaling {scaling!r}; InternLM2 defines linear and dynamic scaling "
                             "with a factor")
        scaling = {"rope_type": kind, "factor": float(scaling["factor"])}
    extra = {"rope_scaling": scaling} if scaling else {}
    dtype = config.get("torch_dtype") or config.get("dtype")
    return LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, hidden_act="silu",
        max_position_embeddings=_positive_int(config, "max_position_embeddings", 2048),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(config.get("rope_theta", 10000.0)),
        attention_bias=shape.bias, mlp_bias=False, tie_word_embeddings=False, num_labels=1,
        pad_token_id=config.get("pad_token_id"), bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id"), architectures=["LlamaForSequenceClassification"],
        **({"dtype": dtype} if isinstance(dtype, str) else {}), **extra)


def _inside_root(root: Path, name: str | Path, what: str) -> Path:
    """`name` (relative to `root`, or absolute inside it) resolved; ModelError when it leaves the root."""
    given = Path(name)
    if "\x00" in str(given) or (not given.is_absolute() and ".." in PurePosixPath(str(given).replace("\\", "/")).parts):
        raise ModelError(f"{what} {name} must be a folder inside the models folder, without '..'")
    path = (given if given.is_absolute() else root / given).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ModelError(f"{what} {name} is outside the models folder")
    return path


def _tokenizer_files(source: Path, root: Path, reward_token_id: Any) -> tuple[dict[str, bytes], str | None]:
    """{file name: bytes to write} of the converted tokenizer, and the reward token's text (None
    when the config names no reward token)."""
    out: dict[str, bytes] = {}
    for name in TOKENIZER_COPIED:
        file = source / name
        if file.exists() or file.is_symlink():
            if name.endswith(".json"):
                _read_json_object(source, name, root=root, required=True)  # bounded, inside the root
            real = file.resolve()
            if not real.is_relative_to(root) or not real.is_file():
                raise ModelError(f"{name} in the model folder is not a regular file inside the models folder")
            with open(real, "rb") as fh:
                out[name] = fh.read()
    if "tokenizer.model" not in out and "tokenizer.json" not in out:
        raise ModelError("no tokenizer in the model folder (expected tokenizer.model or tokenizer.json)")
    tokenizer_config = _read_json_object(source, "tokenizer_config.json", root=root, required=False) or {}
    tokenizer_config = {k: v for k, v in tokenizer_config.items() if k != "auto_map"}
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast" if "tokenizer.json" in out else "LlamaTokenizer"

    template = tokenizer_config.get("chat_template")
    if (source / "chat_template.jinja").is_file():
        template = _read_text(_inside_file(source, "chat_template.jinja", root), "chat_template.jinja")
    elif (source / "chat_template.json").is_file():
        template = (_read_json_object(source, "chat_template.json", root=root, required=True) or {}).get(
            "chat_template")
    if not isinstance(template, str) or not template.strip():
        raise ModelError("no chat template in the tokenizer files: InternLM2 reward models score the chat template's "
                         "text followed by the reward token")

    reward = None
    if reward_token_id is not None:
        reward = _token_text(reward_token_id, tokenizer_config, out.get("tokenizer.json"))
        if any(c in reward for c in "{}%#"):
            raise ModelError(f"the reward token {reward!r} cannot be written into a chat template")
        template = f"{template}{{% if not add_generation_prompt %}}{reward}{{% endif %}}"
    tokenizer_config["chat_template"] = template
    out["tokenizer_config.json"] = json.dumps(tokenizer_config, ensure_ascii=False, indent=2).encode()
    return out, reward


def _inside_file(folder: Path, name: str, root: Path) -> Path:
    real = (folder / name).resolve()
    if not real.is_relative_to(root) or not real.is_file():
        raise ModelError(f"{name} in the model folder is not a regular file inside the models folder")
    return real


def _token_text(token_id: Any, tokenizer_config: dict[str, Any], tokenizer_json: bytes | None) -> str:
    """The text of added token `token_id`, from tokenizer_config.json's added_tokens_decoder or
    tokenizer.json's added_tokens; ModelError when neither has it."""
    if isinstance(token_id, bool) or not isinstance(token_id, int):
        raise ModelError(f"config.json: reward_token_id must be an integer, not {token_id!r}")
    entry = (tokenizer_config.get("added_tokens_decoder") or {}).get(str(token_id))
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    if tokenizer_json is not None:
        from prblib.rows import load_json

        for token in (load_json(tokenizer_json.decode("utf-8")) or {}).get("added_tokens") or []:
            if isinstance(token, dict) and token.get("id") == token_id and isinstance(token.get("content"), str):
                return token["content"]
    raise ModelError(f"config.json: reward_token_id {token_id} names no added token in the tokenizer files")


def convert_internlm2(source: str | Path, dest: str | Path, *, models_root: str | Path) -> Conversion:
    """Convert the InternLM2 reward checkpoint in `source` into a LlamaForSequenceClassification folder
    `dest` (both relative to `models_root`, or absolute inside it; `dest` must not exist). Returns what
    was written; ModelError (one line, naming files by their place in the folder) for anything refused,
    and nothing is left behind then. Shards are converted one at a time (memory: the largest shard)."""
    import torch  # noqa: F401 (safetensors' torch frames)
    from safetensors import safe_open
    from safetensors.torch import save_file

    root = Path(models_root).resolve()
    folder = _inside_root(root, source, "source")
    target = _inside_root(root, dest, "destination")
    if not folder.is_dir():
        raise ModelError(f"source {source} does not exist or is not a folder")
    if target.exists() or target.is_symlink():
        raise ModelError(f"destination {dest} already exists; choose a new folder name")
    if target.is_relative_to(folder):
        raise ModelError(f"destination {dest} is inside the source folder")
    ensure_inside_root(folder, root)
    config = _read_json_object(folder, "config.json", root=root, required=True)
    shape = read_shape(config)
    new_config = llama_config(config, shape)
    weights = _safetensors_files(folder, root=root)
    tokenizer, reward = _tokenizer_files(folder, root, config.get("reward_token_id"))

    # Every name and shape is checked from the headers before anything is written.
    plan: list[list[tuple[str, str | None]]] = []
    produced: set[str] = set()
    for file in weights:
        with safe_open(str(file.resolve()), framework="pt") as fh:
            names = [(name, llama_name(name)) for name in fh.keys()]
        plan.append(names)
        for _, new in names:
            if new is None:
                continue
            if new.endswith((".qkv.weight", ".qkv.bias")):
                base, kind = new.rsplit(".qkv.", 1)
                produced.update(f"{base}.{p}_proj.{kind}" for p in "qkv")
            else:
                produced.add(new)
    expected = {"model.embed_tokens.weight", "model.norm.weight", "score.weight"}
    for i in range(shape.layers):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                     "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):
            expected.add(f"model.layers.{i}.{part}.weight")
        if shape.bias:
            expected.update(f"model.layers.{i}.self_attn.{p}_proj.bias" for p in "qkvo")
    if produced != expected:
        missing, unexpected = sorted(expected - produced), sorted(produced - expected)
        if "score.weight" in missing:
            raise ModelError("the checkpoint has no reward head (v_head.weight)")
        raise ModelError(f"the tensors do not match the config ({shape.layers} layers, bias {shape.bias}): "
                         + (f"missing {len(missing)} (e.g. {missing[0]})" if missing else "")
                         + ("; " if missing and unexpected else "")
                         + (f"unexpected {len(unexpected)} (e.g. {unexpected[0]})" if unexpected else ""))

    result = Conversion(folder=target, reward_token=reward)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        shard_names = ([f"model-{i + 1:05d}-of-{len(weights):05d}.safetensors" for i in range(len(weights))]
                       if len(weights) > 1 else ["model.safetensors"])
        weight_map = {}
        for file, names, out_name in zip(weights, plan, shard_names):
            tensors = {}
            with safe_open(str(file.resolve()), framework="pt") as fh:
                for name, new in names:
                    if new is None:
                        continue
                    tensor = fh.get_tensor(name)
                    if new.endswith((".qkv.weight", ".qkv.bias")):
                        base, kind = new.rsplit(".qkv.", 1)
                        for part, value in zip("qkv", split_wqkv(tensor, shape)):
                            tensors[f"{base}.{part}_proj.{kind}"] = value
                    else:
                        tensors[new] = tensor.contiguous()
            _check_shapes(tensors, shape)
            save_file(tensors, str(partial / out_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, out_name))
            result.tensors += len(tensors)
            result.parameters += sum(t.numel() for t in tensors.values())
        if len(weights) > 1:
            (partial / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
        new_config.to_json_file(str(partial / "config.json"))
        for name, data in tokenizer.items():
            (partial / name).write_bytes(data)
        (partial / "conversion.json").write_text(json.dumps({
            "converted_from": {"architecture": ARCHITECTURE, "model_type": "internlm2", "folder": str(source)},
            "by": "manage.py convert_internlm2 (prblib/rewards/convert_internlm2.py)",
            "reward_token": reward}, indent=2))
        if reward is None:
            result.notes.append("config.json names no reward_token_id: the chat template was kept as it is")
        check_model_folder(partial, task="sequence-classification", models_root=root)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return result


def _check_shapes(tensors: dict[str, Any], shape: Shape) -> None:
    """ModelError for a tensor whose shape does not fit the config (so nothing loads half-random)."""
    hd = shape.head_dim
    want = {"model.embed_tokens.weight": [shape.vocab, shape.hidden], "model.norm.weight": [shape.hidden],
            "score.weight": [1, shape.hidden]}
    per_layer = {"self_attn.q_proj.weight": [shape.heads * hd, shape.hidden],
                 "self_attn.k_proj.weight": [shape.kv_heads * hd, shape.hidden],
                 "self_attn.v_proj.weight": [shape.kv_heads * hd, shape.hidden],
                 "self_attn.o_proj.weight": [shape.hidden, shape.heads * hd],
                 "mlp.gate_proj.weight": [shape.intermediate, shape.hidden],
                 "mlp.up_proj.weight": [shape.intermediate, shape.hidden],
                 "mlp.down_proj.weight": [shape.hidden, shape.intermediate],
                 "input_layernorm.weight": [shape.hidden], "post_attention_layernorm.weight": [shape.hidden]}
    for name, tensor in tensors.items():
        match = _LAYER.match(name)
        expected = per_layer.get(match.group(2)) if match else want.get(name)
        if expected is not None and list(tensor.shape) != expected:
            raise ModelError(f"tensor {name} has shape {list(tensor.shape)}, the config needs {expected}"
                             + (" (the reward head must have one output)" if name == "score.weight" else ""))
