"""Import throughput and memory on a large generated benchmark file.

Writes a JSONL file of the requested size (synthetic rows in the published schema), then
measures in separate processes, in the same run:
  - baseline: a plain `json.loads` of every line into one list (what a naive importer does);
  - prbench: `manage.py import_benchmark` (streamed validation + batched inserts).
Prints peak resident memory of each, the ratio, and rows/s. Uses DATABASE_URL when set,
otherwise a throwaway SQLite file.

    .venv/bin/python benchmarks/bench_import.py --size-mb 300
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BASELINE = """
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
print(len(rows))
"""


def make_file(path: Path, size_mb: int) -> int:
    filler = "I keep a notebook of every trail I hike and the weather on the day. " * 6
    target, n = size_mb * 1024 * 1024, 0
    with open(path, "w", encoding="utf-8") as fh:
        while fh.tell() < target:
            row = {
                "id": f"bench-{n}",
                "question": f"Which long-distance trail should I try next, given my notes? ({n})",
                "profile": [{"id": f"bench-{n}-p{j}", "text": filler, "category": "Lifestyle_and_Personal_Development"}
                            for j in range(10)],
                "rubric_aspects": [{"aspect": "Refers to the hiker's notebook", "evidence": "keeps notes",
                                    "reason": "personal habit"}],
                "narrative": "Wants suggestions that build on their own records.",
                "category": "Lifestyle_and_Personal_Development",
                "chosen": "Given your notes on weather, try a trail with stable autumn conditions.",
                "rejected": "Try a popular trail with good reviews and facilities.",
            }
            fh.write(json.dumps(row) + "\n")
            n += 1
    return n


# Each measured command runs under its own small parent, whose RUSAGE_CHILDREN then
# covers that command alone.
WRAP = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
"""


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one command."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAP, *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} failed:\n{proc.stderr[-2000:]}")
    return seconds, int(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=300)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="prbench-bench-") as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "big.jsonl"
        rows = make_file(data, args.size_mb)
        size = data.stat().st_size
        env = dict(os.environ, PRBENCH_VAR_DIR=str(tmp_path / "var"))
        if "DATABASE_URL" not in env:
            env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'bench.sqlite3'}"
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)

        import_s, import_kib = run([sys.executable, "manage.py", "import_benchmark", str(data),
                                       "--name", f"bench-{int(time.time())}", "-v", "0"], env)
        base_s, base_kib = run([sys.executable, "-c", BASELINE, str(data)], env)

    print(f"file: {size / 2**20:.0f} MiB, {rows} rows")
    print(f"import_benchmark: peak RSS {import_kib / 1024:.0f} MiB, {import_s:.1f} s, {rows / import_s:.0f} rows/s")
    print(f"baseline json.loads of every line: peak RSS {base_kib / 1024:.0f} MiB, {base_s:.1f} s")
    print(f"memory ratio import/baseline: {import_kib / base_kib:.2f}; import peak / file size: "
          f"{import_kib * 1024 / size:.2f}")


if __name__ == "__main__":
    main()
