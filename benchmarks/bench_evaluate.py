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
import json, sys
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
with torch.inference_mode():
    for start in range(0, len(texts), batch):
        # The texts already hold the chat template's leading [CLS]: no special tokens added.
        enc = tokenizer(texts[start:start + batch], add_special_tokens=False, padding=True, return_tensors="pt")
        scores += model(**enc).logits[:, 0].tolist()
with open(out, "w") as fh:
    json.dump(scores, fh)
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
        ratios, cpu_ratios = [], []
        for run in range(args.runs):
            load = load_average()
            # Alternate which side goes first, so a slow start of the round does not always hit one side.
            if run % 2 == 0:
                (ours_s, ours_cpu), (plain_s, plain_cpu) = timed(evaluate, env), timed(plain, env)
            else:
                (plain_s, plain_cpu), (ours_s, ours_cpu) = timed(plain, env), timed(evaluate, env)
            ratios.append(plain_s / ours_s)
            cpu_ratios.append(plain_cpu / ours_cpu)
            print(f"  round {run + 1}: evaluate_rm {ours_s:6.2f} s ({ours_cpu:6.2f} CPU s)   plain script "
                  f"{plain_s:6.2f} s ({plain_cpu:6.2f} CPU s)   speed-up {ratios[-1]:.2f}x wall, "
                  f"{cpu_ratios[-1]:.2f}x CPU   ({load})")

        # --out lists pairs as they finish (longest first); the plain script in dataset order.
        by_id = {row["id"]: row for row in map(json.loads, ours.read_text().splitlines())}
        order = [row["id"] for row in map(json.loads, inputs.read_text().splitlines())]
        ours_scores = [s for i in order for s in (by_id[i]["chosen_score"], by_id[i]["rejected_score"])]
        plain_scores = json.loads(theirs.read_text())
        diff = max(abs(a - b) for a, b in zip(ours_scores, plain_scores, strict=True))
    print(f"whole-process speed-up over {args.runs} round(s), wall: min {min(ratios):.2f}x  "
          f"median {statistics.median(ratios):.2f}x  max {max(ratios):.2f}x;  CPU: min {min(cpu_ratios):.2f}x  "
          f"median {statistics.median(cpu_ratios):.2f}x  max {max(cpu_ratios):.2f}x;  "
          f"largest |score difference| {diff:.2e}")
    if diff > 1e-4:
        sys.exit(f"scores differ by {diff:.2e} (> 1e-4)")


if __name__ == "__main__":
    main()
