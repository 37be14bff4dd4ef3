"""Scalar-RM scoring speed: the engine (prefix cache, length buckets) against a plain forward pass.

Builds the ~10M-parameter tiny Llama reward model (benchmarks/common.py: hidden 256, 4
layers, random weights, float32, CPU, fixed seed, a real WordPiece tokenizer), then scores
  (a) 48 pairs whose prompt is a ~1000-token profile plus question and whose responses are
      ~130 tokens, and
  (b) 4 Best-of-16 groups of the same shape,
with ScalarRewardModel (rendering and tokenizing included) and with the plain
baseline: every response on its own, batches of 8 in dataset order, right padded, through
the model's own forward. The two sides alternate for `--runs` rounds; prints each round's
speed-up, min/median/max over the rounds, responses per second of each side's fastest round,
and the largest score difference between the two (exits non-zero above 1e-4).

    .venv/bin/python benchmarks/bench_scoring.py             # 2 rounds (~2 min on an idle 2-core machine)
    .venv/bin/python benchmarks/bench_scoring.py --runs 5    # the figures in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from common import TextMaker, build_tiny_llama_rm, load_average, machine  # noqa: E402
from prblib.rewards.base import ModelSpec, PairInput, ScoreInput  # noqa: E402
from prblib.context import render_context  # noqa: E402
from prblib.rewards.scalar import ScalarRewardModel  # noqa: E402

SEED = 0
BATCH = 8
PAIRS = 48
GROUPS, GROUP_SIZE = 4, 16
TOLERANCE = 1e-4


def make_data(maker: TextMaker) -> tuple[list[PairInput], list[ScoreInput]]:
    pairs = [PairInput(id=f"p{i}", domain="bench", question=maker.question(), profile=maker.profile(),
                       chosen=maker.response(), rejected=maker.response()) for i in range(PAIRS)]
    groups = [ScoreInput(id=f"g{i}", question=maker.question(), profile=maker.profile(),
                         responses=tuple(maker.response() for _ in range(GROUP_SIZE))) for i in range(GROUPS)]
    return pairs, groups


def baseline(rm: ScalarRewardModel, texts: list[str]) -> list[float]:
    """Each text on its own, BATCH at a time in the order given, right padded, model(...).logits
    (on the model's device)."""
    tok, model, scores = rm.tokenizer, rm.model, []
    device = next(model.parameters()).device
    for start in range(0, len(texts), BATCH):
        ids = [tok(t, add_special_tokens=rm.add_special_tokens)["input_ids"] for t in texts[start:start + BATCH]]
        width = max(map(len, ids))
        batch = torch.full((len(ids), width), tok.pad_token_id)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, seq in enumerate(ids):
            batch[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        with torch.inference_mode():
            logits = model(input_ids=batch.to(device), attention_mask=mask.to(device)).logits
            scores.extend(logits[:, 0].float().tolist())
    return scores


def pair_texts(rm: ScalarRewardModel, pairs: list[PairInput]) -> list[str]:
    return [text for pair in pairs for text in rm.render_inputs(pair, setting="profile")]


def group_texts(rm: ScalarRewardModel, groups: list[ScoreInput]) -> list[str]:
    texts = []
    for group in groups:
        context = render_context(group.question, setting="profile", profile=group.profile)
        texts.extend(rm._render(context, r) for r in group.responses)
    return texts


def alternate(runs: int, engine_fn, baseline_fn):
    """Alternate the two sides `runs` times: (engine result, baseline result, engine seconds per
    round, baseline seconds per round). Ratios are taken round by round, so a burst of load from
    other processes on a shared machine moves one round, not the summary."""
    engine_s, base_s = [], []
    for _ in range(runs):
        start = time.perf_counter()
        engine = engine_fn()
        engine_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        base = baseline_fn()
        base_s.append(time.perf_counter() - start)
    return engine, base, engine_s, base_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="alternating rounds per part (default 2)")
    args = parser.parse_args()
    if args.runs < 1:
        sys.exit("--runs must be at least 1")
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.manual_seed(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_llama_rm(Path(tmp) / "rm", seed=SEED)
        rm = ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(folder), batch_size=BATCH, max_length=4096))
    pairs, groups = make_data(TextMaker(SEED))
    params = sum(p.numel() for p in rm.model.parameters())
    print(f"machine: {machine()}; model: Llama layout, hidden 256, 4 layers, {params / 1e6:.1f}M parameters, "
          f"float32, CPU, {torch.get_num_threads()} threads; engine mode: {rm.engine.mode}; batch size {BATCH}; "
          f"{args.runs} alternating round(s)")

    # warm-up, so neither side pays for first-call allocations
    list(rm.score_pairs(pairs[:2], setting="profile"))
    baseline(rm, pair_texts(rm, pairs[:1]))

    print(f"  ({load_average()})")
    results, base, engine_s, base_s = alternate(args.runs, lambda: list(rm.score_pairs(pairs, setting="profile")),
                                                lambda: baseline(rm, pair_texts(rm, pairs)))
    by_id = {r.id: r for r in results}
    engine = [s for p in pairs for s in (by_id[p.id].chosen_score, by_id[p.id].rejected_score)]
    lengths = [n for r in results for n in r.details["tokens"]]
    worst = report(f"(a) {PAIRS} pairs, {len(engine)} responses, {min(lengths)}-{max(lengths)} tokens each",
                   len(engine), engine_s, base_s, engine, base)

    print(f"  ({load_average()})")
    got, base, engine_s, base_s = alternate(args.runs, lambda: dict(rm.score_groups(groups, setting="profile")),
                                            lambda: baseline(rm, group_texts(rm, groups)))
    engine = [s for g in groups for s in got[g.id]]
    worst = max(worst, report(f"(b) {GROUPS} Best-of-{GROUP_SIZE} groups, {len(engine)} responses", len(engine),
                              engine_s, base_s, engine, base))
    print(f"  ({load_average()})")
    if worst > TOLERANCE:
        sys.exit(f"scores differ by {worst:.2e} (> {TOLERANCE})")


def report(title: str, n: int, engine_s: list[float], base_s: list[float], engine: list[float],
           base: list[float]) -> float:
    diff = max(abs(a - b) for a, b in zip(engine, base, strict=True))
    ratios = [b / e for e, b in zip(engine_s, base_s)]
    print(title)
    print(f"    engine (prefix cache): {n / min(engine_s):8.2f} responses/s  (fastest round {min(engine_s):6.2f} s)")
    print(f"    plain full forward:    {n / min(base_s):8.2f} responses/s  (fastest round {min(base_s):6.2f} s)")
    print(f"    speed-up per round: {', '.join(f'{r:.2f}x' for r in ratios)}   min {min(ratios):.2f}x  "
          f"median {statistics.median(ratios):.2f}x  max {max(ratios):.2f}x    largest |score difference|: {diff:.2e}")
    return diff


if __name__ == "__main__":
    main()
