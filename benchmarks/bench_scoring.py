"""Scalar-RM scoring speed: the engine (prefix cache, length buckets) against a plain forward pass.

Builds a small decoder reward model with random weights (Llama layout, hidden 256, 4 layers,
float32, CPU, fixed seed) and a real WordPiece tokenizer, then scores
  (a) 48 pairs whose prompt is a ~1000-token profile plus question and whose responses are
      ~130 tokens, and
  (b) 4 Best-of-16 groups of the same shape,
with ScalarRewardModel (rendering and tokenizing included) and with the plain
baseline: every response on its own, batches of 8 in dataset order, right padded, through
the model's own forward. Prints responses per second, the speed-up and the largest score
difference between the two.

    .venv/bin/python benchmarks/bench_scoring.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from pipeline.ml.base import ModelSpec, PairInput, ScoreInput, render_context  # noqa: E402
from pipeline.ml.scalar import ScalarRewardModel  # noqa: E402
from tests.pipeline.ml.tiny_models import build_decoder_rm, load_tokenizer  # noqa: E402

SEED = 0
BATCH = 8
PAIRS = 48
GROUPS, GROUP_SIZE = 4, 16
POSTS, POST_WORDS = 10, 96  # ~1000 prompt tokens with the question and the template
RESPONSE_WORDS = (110, 150)
RUNS = 3  # best of, alternating engine and baseline


def word_list() -> list[str]:
    """Whole lowercase words of the tokenizer's vocabulary: one token each."""
    vocab = load_tokenizer().get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2)


def make_data(rng: random.Random, words: list[str]) -> tuple[list[PairInput], list[ScoreInput]]:
    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)) + "."

    def prompt() -> tuple[str, tuple[str, ...]]:
        return text(rng.randint(12, 24)) + "?", tuple(text(rng.randint(POST_WORDS - 8, POST_WORDS + 8))
                                                      for _ in range(POSTS))

    pairs = []
    for i in range(PAIRS):
        question, profile = prompt()
        pairs.append(PairInput(id=f"p{i}", domain="bench", question=question, profile=profile,
                               chosen=text(rng.randint(*RESPONSE_WORDS)), rejected=text(rng.randint(*RESPONSE_WORDS))))
    groups = []
    for i in range(GROUPS):
        question, profile = prompt()
        groups.append(ScoreInput(id=f"g{i}", question=question, profile=profile,
                                 responses=tuple(text(rng.randint(*RESPONSE_WORDS)) for _ in range(GROUP_SIZE))))
    return pairs, groups


def baseline(rm: ScalarRewardModel, texts: list[str]) -> list[float]:
    """Each text on its own, BATCH at a time in the order given, right padded, model(...).logits."""
    tok, model, scores = rm.tokenizer, rm.model, []
    for start in range(0, len(texts), BATCH):
        ids = [tok(t, add_special_tokens=rm.add_special_tokens)["input_ids"] for t in texts[start:start + BATCH]]
        width = max(map(len, ids))
        batch = torch.full((len(ids), width), tok.pad_token_id)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, seq in enumerate(ids):
            batch[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        with torch.inference_mode():
            scores.extend(model(input_ids=batch, attention_mask=mask).logits[:, 0].float().tolist())
    return scores


def pair_texts(rm: ScalarRewardModel, pairs: list[PairInput]) -> list[str]:
    return [text for pair in pairs for text in rm.render_inputs(pair, setting="profile")]


def group_texts(rm: ScalarRewardModel, groups: list[ScoreInput]) -> list[str]:
    texts = []
    for group in groups:
        context = render_context(group.question, setting="profile", profile=group.profile)
        texts.extend(rm._render(context, r) for r in group.responses)
    return texts


def best_of(runs: int, engine_fn, baseline_fn):
    """Alternate the two sides `runs` times and keep each side's fastest run, so a burst of
    load from other processes on a shared machine does not decide the ratio."""
    engine_s = base_s = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        engine = engine_fn()
        engine_s = min(engine_s, time.perf_counter() - start)
        start = time.perf_counter()
        base = baseline_fn()
        base_s = min(base_s, time.perf_counter() - start)
    return engine, engine_s, base, base_s


def main() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_decoder_rm(Path(tmp) / "rm", hidden=256, layers=4, heads=4, max_positions=4096, seed=SEED)
        rm = ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(folder), batch_size=BATCH, max_length=4096))
    pairs, groups = make_data(rng, word_list())
    params = sum(p.numel() for p in rm.model.parameters())
    print(f"model: Llama layout, hidden 256, 4 layers, {params / 1e6:.1f}M parameters, float32, CPU, "
          f"{torch.get_num_threads()} threads; engine mode: {rm.engine.mode}; batch size {BATCH}; "
          f"times are the best of {RUNS} alternating runs")

    # warm-up, so neither side pays for first-call allocations
    list(rm.score_pairs(pairs[:2], setting="profile"))
    baseline(rm, pair_texts(rm, pairs[:1]))

    results, engine_s, base, base_s = best_of(RUNS, lambda: list(rm.score_pairs(pairs, setting="profile")),
                                              lambda: baseline(rm, pair_texts(rm, pairs)))
    by_id = {r.id: r for r in results}
    engine = [s for p in pairs for s in (by_id[p.id].chosen_score, by_id[p.id].rejected_score)]
    lengths = [n for r in results for n in r.details["tokens"]]
    report(f"(a) {PAIRS} pairs, {len(engine)} responses, {min(lengths)}-{max(lengths)} tokens each",
           len(engine), engine_s, base_s, engine, base)

    got, engine_s, base, base_s = best_of(RUNS, lambda: dict(rm.score_groups(groups, setting="profile")),
                                          lambda: baseline(rm, group_texts(rm, groups)))
    engine = [s for g in groups for s in got[g.id]]
    report(f"(b) {GROUPS} Best-of-{GROUP_SIZE} groups, {len(engine)} responses", len(engine), engine_s, base_s,
           engine, base)


def report(title: str, n: int, engine_s: float, base_s: float, engine: list[float], base: list[float]) -> None:
    diff = max(abs(a - b) for a, b in zip(engine, base))
    print(title)
    print(f"    engine (prefix cache): {n / engine_s:8.2f} responses/s  ({engine_s:6.2f} s)")
    print(f"    plain full forward:    {n / base_s:8.2f} responses/s  ({base_s:6.2f} s)")
    print(f"    speed-up: {base_s / engine_s:.2f}x    largest |score difference|: {diff:.2e}")


if __name__ == "__main__":
    main()
