"""What a hostile upload or model folder costs the web process, before and against a plain baseline.

Two inputs the security audit (issue 33) sent to a submission, rebuilt here:
  - a scores file of 49 MiB of newlines, for a benchmark of 1,000 pairs;
  - a model folder of 200,000 empty files (`--files`).
Each is measured in a process of its own (CPU seconds, peak resident memory), in the same run:
  - scores: prbench's reader (`parse_scores_file`: chunks, refused at the first line past the
    benchmark's bound), the reader it replaced (`text_lines(read_text(path))`: the whole text,
    then every line in a list), and the plain baseline: reading the file once in 1 MiB chunks;
  - folder: prbench's walk (`ensure_inside_root`, refused past MODEL_MAX_FILES=5000), the walk
    it replaced (`os.walk` and a resolve of every entry), and the plain baseline: `os.listdir`.

    .venv/bin/python benchmarks/bench_costs.py [--files 200000] [--scores-mb 49]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import load_average, machine  # noqa: E402

PAIRS = 1000


def measure(kind: str, path: str) -> None:
    """Run one measurement in this process and print {"cpu": s, "rss_mib": MiB, "outcome": ...}."""
    import resource
    import time

    from prblib.errors import ModelError
    from prblib.modelcheck import ensure_inside_root
    from prblib.rows import read_text, text_lines
    from prblib.rewards.scores import parse_scores_file

    start = time.process_time()  # imports done: only the work is timed
    outcome = "read"
    if kind == "scores-prbench":
        try:
            parse_scores_file(path, expected_ids=[f"p{i}" for i in range(PAIRS)])
        except ModelError as exc:
            outcome = f"refused: {str(exc)[:90]}"
    elif kind == "scores-old":
        outcome = f"{sum(1 for _ in text_lines(read_text(path)))} non-blank lines, then checked"
    elif kind == "scores-baseline":
        with open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass
    elif kind == "folder-prbench":
        try:
            ensure_inside_root(Path(path), Path(path).parent)
        except ModelError as exc:
            outcome = f"refused: {str(exc)[:90]}"
    elif kind == "folder-old":
        root = Path(path).parent.resolve()
        for here, dirs, files in os.walk(path, followlinks=False):
            for name in (*dirs, *files):
                (Path(here) / name).resolve().is_relative_to(root)
        outcome = "every entry resolved"
    elif kind == "folder-baseline":
        outcome = f"{len(os.listdir(path))} names listed"
    cpu = time.process_time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"cpu": cpu, "rss_mib": rss, "outcome": outcome}))


def run(kind: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", kind, str(path)], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--scores-mb", type=int, default=49)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return measure(*args.one)

    print(machine(), "|", load_average())
    with tempfile.TemporaryDirectory() as tmp:
        flood = Path(tmp) / "flood.jsonl"
        flood.write_bytes(b"\n" * (args.scores_mb << 20))
        folder = Path(tmp) / "models" / "many"
        folder.mkdir(parents=True)
        for i in range(args.files):
            (folder / f"f{i:06}").touch()
        for title, prefix, path in ((f"scores file, {args.scores_mb} MiB of newlines, {PAIRS} pairs", "scores", flood),
                                    (f"model folder, {args.files:,} files", "folder", folder)):
            figures = {side: run(f"{prefix}-{side}", path) for side in ("baseline", "old", "prbench")}
            base = max(figures["baseline"]["cpu"], 1e-4)
            print(f"\n{title}")
            for side, label in (("baseline", "plain baseline"), ("old", "the reader it replaced"),
                                ("prbench", "prbench now")):
                f = figures[side]
                print(f"  {label:24} CPU {f['cpu']:7.3f} s ({f['cpu'] / base:6.2f}x the baseline), "
                      f"peak RSS {f['rss_mib']:6.0f} MiB; {f['outcome']}")
    print("\n" + load_average())


if __name__ == "__main__":
    main()
