"""Whole-process evaluation speed: `manage.py evaluate_rm` against a plain scoring script.

Both run as separate processes in the same run, on the same inputs, so everything a user
waits for is timed: Python start, imports, Django set-up, model load, rendering and
tokenising, scoring, summary statistics, output.

Set-up (not timed): a throwaway SQLite database and var folder, the ~10M-parameter tiny Llama
reward model (benchmarks/common.py: hidden 256, 4 layers, random weights, fixed seed,
float32, safetensors) and a benchmark of 45 pairs imported with `import_benchmark`, each with
a ~1,100-token prompt (question + 10 profile posts) and ~130-token responses; then
`evaluate_rm --dump-inputs` writes the exact texts the model is given.

Timed, alternating, `--runs` rounds:
  evaluate_rm  `manage.py evaluate_rm --kind scalar --setting profile --batch-size 8 --out ...`
  plain        a plain transformers script: load the same folder, read those exact texts
               (already rendered: the plain side does no rendering), tokenise, right-pad
               batches of 8 in dataset order, `model(**batch).logits`.
Prints each round's wall and CPU times (user + system of the child, all threads: less moved
by other processes on a shared machine than wall time) and ratios, min/median/max of the
ratios, and the largest score difference between the two (exits non-zero above 1e-4).

Then the ceiling this workload allows. The plain script times its own forward passes (the
rest of its wall time is start-up, imports and load, which evaluate_rm pays too), and
`multiply_accumulates` counts both sides' work on these exact inputs. At equal work per second
the engine gains that ratio on scoring, and the whole process then
plain wall / (plain wall - plain forward + plain forward / work ratio).

    .venv/bin/python benchmarks/bench_evaluate.py              # 2 rounds (~2 min)
    .venv/bin/python benchmarks/bench_evaluate.py --runs 5     # the figures in benchmarks/README.md
    .venv/bin/python benchmarks/bench_evaluate.py --threads 1  # one torch thread on each side
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, TextMaker, build_tiny_llama_rm, load_average, machine, quiet_run  # noqa: E402

PAIRS = 45
BATCH = 8
SEED = 0
CATEGORIES = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")

PLAIN = """
import json, sys, time
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

folder, inputs, out, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True,
                                                           use_safetensors=True).eval()
texts = []
with open(inputs, encoding="utf-8") as fh:
    for line in fh:
        row = json.loads(line)
        texts += [row["chosen_text"], row["rejected_text"]]
scores = []
started = time.perf_counter()
with torch.inference_mode():
    for start in range(0, len(texts), batch):
        # The texts already hold the chat template's leading [CLS]: no special tokens added.
        enc = tokenizer(texts[start:start + batch], add_special_tokens=False, padding=True, return_tensors="pt")
        scores += model(**enc).logits[:, 0].tolist()
with open(out, "w") as fh:
    json.dump({"scores": scores, "forward_s": time.perf_counter() - started}, fh)
"""


def write_benchmark(path: Path, pairs: int) -> None:
    maker = TextMaker(SEED)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(pairs):
            row = {"id": f"bench-{i}", "question": maker.question(),
                   "profile": [{"id": f"bench-{i}-p{j}", "text": post, "category": "bench"}
                               for j, post in enumerate(maker.profile())],
                   "rubric_aspects": [{"aspect": "Builds on the user's own posts", "evidence": "posts",
                                       "reason": "personal"}],
                   "narrative": "Wants answers that use what they wrote before.",
                   "category": CATEGORIES[i % len(CATEGORIES)],
                   "chosen": maker.response(), "rejected": maker.response()}
            fh.write(json.dumps(row) + "\n")


def multiply_accumulates(folder: Path, inputs: Path, batch: int) -> tuple[float, float]:
    """(plain script, engine) multiply-accumulates of the decoder layers on the dumped inputs.

    A count of work, not a timing: per token and layer, the projections (q, k, v, o: grouped
    key/value heads counted as such) and the gated MLP (3 x hidden x intermediate), plus
    2 x heads x head_dim x context for attention (scores and weighted values); the embedding
    lookups and the one-logit score head (hidden per token, 0.02% here) are left out. The plain script as it runs:
    batches of `batch` texts in dataset order, right-padded to the longest, full attention over
    the padded length (an explicit padding mask). The engine at its least possible work: each
    pair's shared token prefix once with causal attention, then each response's tokens
    attending to the prefix and causally to themselves, no padding. At equal multiply-accumulates
    per second their ratio is the most the engine's scoring can gain over the plain script.
    """
    from tokenizers import Tokenizer

    config = json.loads((folder / "config.json").read_text())
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    linear = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter

    def per_token(context: float) -> float:
        return linear + 2 * heads * head_dim * context

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lengths, engine = [], 0.0
    for row in map(json.loads, inputs.read_text().splitlines()):
        chosen, rejected = (tokenizer.encode(row[k], add_special_tokens=False).ids
                            for k in ("chosen_text", "rejected_text"))
        prefix = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
        engine += prefix * per_token((prefix + 1) / 2)
        for suffix in (len(chosen) - prefix, len(rejected) - prefix):
            engine += suffix * per_token(prefix + (suffix + 1) / 2)
        lengths += [len(chosen), len(rejected)]
    plain = 0.0
    for start in range(0, len(lengths), batch):
        longest = max(lengths[start:start + batch])
        plain += len(lengths[start:start + batch]) * longest * per_token(longest)
    return plain * layers, engine * layers


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system, all threads) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    quiet_run(cmd, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both sides (default: torch's own choice); "
                        "1 keeps a busy shared machine's thread contention out of the comparison")
    args = parser.parse_args()
    if args.runs < 1 or args.pairs < 1:
        sys.exit("--runs and --pairs must be at least 1")

    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="prbench-bench-eval-") as tmp:
        tmp_path = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
        env.update(PRBENCH_VAR_DIR=str(tmp_path / "var"), DATABASE_URL=f"sqlite:///{tmp_path / 'bench.sqlite3'}",
                   TOKENIZERS_PARALLELISM="false")
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        folder = build_tiny_llama_rm(tmp_path / "rm", seed=SEED)
        data = tmp_path / "bench.jsonl"
        write_benchmark(data, args.pairs)
        quiet_run([py, "manage.py", "migrate", "-v", "0"], env=env)
        quiet_run([py, "manage.py", "import_benchmark", str(data), "--name", "bench-eval"], env=env)
        inputs, ours, theirs = tmp_path / "inputs.jsonl", tmp_path / "ours.jsonl", tmp_path / "theirs.json"
        evaluate = [py, "manage.py", "evaluate_rm", "--benchmark", "bench-eval", "--model", str(folder),
                    "--kind", "scalar", "--setting", "profile", "--batch-size", str(BATCH), "--out", str(ours),
                    "-v", "0"]
        quiet_run(evaluate + ["--dump-inputs", str(inputs)], env=env)  # also warms the file cache
        plain = [py, "-c", PLAIN, str(folder), str(inputs), str(theirs), str(BATCH)]
        lengths = [len(row["chosen_text"].split()) for row in map(json.loads, inputs.read_text().splitlines())]

        print(f"machine: {machine()}; {args.pairs} pairs, texts of {min(lengths)}-{max(lengths)} "
              f"words (about one token each), batch {BATCH}, float32 CPU, "
              f"{args.threads or 'default'} torch threads")
        ratios, cpu_ratios, ceilings = [], [], []
        plain_work, engine_work = multiply_accumulates(folder, inputs, BATCH)
        work_ratio = plain_work / engine_work
        for run in range(args.runs):
            load = load_average()
            # Alternate which side goes first, so a slow start of the round does not always hit one side.
            if run % 2 == 0:
                (ours_s, ours_cpu), (plain_s, plain_cpu) = timed(evaluate, env), timed(plain, env)
            else:
                (plain_s, plain_cpu), (ours_s, ours_cpu) = timed(plain, env), timed(evaluate, env)
            ratios.append(plain_s / ours_s)
            cpu_ratios.append(plain_cpu / ours_cpu)
            forward_s = json.loads(theirs.read_text())["forward_s"]
            # The most evaluate_rm could reach: everything but scoring as cheap as the plain
            # script's start-up and load, and scoring work_ratio times faster than its forward passes.
            ceilings.append(plain_s / (plain_s - forward_s + forward_s / work_ratio))
            print(f"  round {run + 1}: evaluate_rm {ours_s:6.2f} s ({ours_cpu:6.2f} CPU s)   plain script "
                  f"{plain_s:6.2f} s ({plain_cpu:6.2f} CPU s; forward passes {forward_s:.2f} s)   speed-up "
                  f"{ratios[-1]:.2f}x wall, {cpu_ratios[-1]:.2f}x CPU   ({load})")

        # --out lists pairs as they finish (longest first); the plain script in dataset order.
        by_id = {row["id"]: row for row in map(json.loads, ours.read_text().splitlines())}
        order = [row["id"] for row in map(json.loads, inputs.read_text().splitlines())]
        ours_scores = [s for i in order for s in (by_id[i]["chosen_score"], by_id[i]["rejected_score"])]
        plain_scores = json.loads(theirs.read_text())["scores"]
        diff = max(abs(a - b) for a, b in zip(ours_scores, plain_scores, strict=True))
    print(f"whole-process speed-up over {args.runs} round(s), wall: min {min(ratios):.2f}x  "
          f"median {statistics.median(ratios):.2f}x  max {max(ratios):.2f}x;  CPU: min {min(cpu_ratios):.2f}x  "
          f"median {statistics.median(cpu_ratios):.2f}x  max {max(cpu_ratios):.2f}x;  "
          f"largest |score difference| {diff:.2e}")
    print(f"work (multiply-accumulates of the decoder layers): plain script {plain_work / 1e9:.1f} G, engine at "
          f"least {engine_work / 1e9:.1f} G, ratio {work_ratio:.2f}x (scoring's gain at equal work per second); "
          f"whole-process speed-up at that gain, with everything else as cheap as the plain script's start-up "
          f"and load: median {statistics.median(ceilings):.2f}x")
    if diff > 1e-4:
        sys.exit(f"scores differ by {diff:.2e} (> 1e-4)")


if __name__ == "__main__":
    main()
