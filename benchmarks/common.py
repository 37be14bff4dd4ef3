"""Helpers shared by the benchmark scripts (not a benchmark itself: `make bench` runs bench_*.py).

Synthetic personalised pairs shaped like the benchmark's (a ~1,000-token profile of 10 posts
plus a question, ~130-token responses), made of whole words of the WordPiece vocabulary the
tiny test models use, so every word is one token; and the ~10M-parameter tiny Llama reward
model (hidden 256, 4 layers, random weights, fixed seed, float32, safetensors).
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

POSTS, POST_WORDS = 10, 96  # ~1,000 prompt tokens with the question and the template
RESPONSE_WORDS = (110, 150)
QUESTION_WORDS = (12, 24)


def word_list() -> list[str]:
    """Whole lowercase words of the tiny models' tokenizer vocabulary: one token each."""
    from prblib.tiny_models import load_tokenizer

    vocab = load_tokenizer().get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2)


class TextMaker:
    """Random sentences of vocabulary words, reproducible from a seed."""

    def __init__(self, seed: int, words: list[str] | None = None):
        self.rng = random.Random(seed)
        self.words = words or word_list()

    def text(self, n: int) -> str:
        return " ".join(self.rng.choice(self.words) for _ in range(n)) + "."

    def question(self) -> str:
        return self.text(self.rng.randint(*QUESTION_WORDS)) + "?"

    def profile(self) -> tuple[str, ...]:
        return tuple(self.text(self.rng.randint(POST_WORDS - 8, POST_WORDS + 8)) for _ in range(POSTS))

    def response(self) -> str:
        return self.text(self.rng.randint(*RESPONSE_WORDS))


def build_tiny_llama_rm(folder: Path, *, seed: int = 0) -> Path:
    """The benchmarks' reward model: Llama layout, hidden 256, 4 layers, 4 heads, ~10.2M parameters."""
    from prblib.tiny_models import build_decoder_rm

    return build_decoder_rm(folder, hidden=256, layers=4, heads=4, max_positions=4096, seed=seed)


def load_average() -> str:
    """The 1-minute load average and the CPU count, for printing beside a figure."""
    import os

    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def machine() -> str:
    import os
    import platform

    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def quiet_run(cmd: list[str], *, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a command; exit with its stderr tail if it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd[:4]))} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc
