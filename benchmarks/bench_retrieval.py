"""Profile-retrieval speed: DenseRetriever.rank_many against embedding each post on its own.

Ranks the top-10 posts of 50 users x 40 posts (plus one question each) of varied length
(half short, a third medium, the rest long: up to ~400 tokens; random words from the
WordPiece vocabulary, fixed seed) with the bundled all-MiniLM-L6-v2, float32, CPU:
  baseline  every question and post tokenized and run through the model alone, mean-pooled,
            normalised, dot products, sorted: the plain loop;
  cold      rank_many with an empty on-disk cache: deduplicated, length-sorted batches of 32
            (at most 4096 tokens on CPU); baseline and cold alternate in rounds of 5 users
            (stopping early, and saying so, if the rounds pass 60 s on a busy machine);
  warm      rank_many again on the same retriever: every vector from the in-memory LRU;
  disk      rank_many on a new retriever over the same cache folder (a second process).
Prints posts per second for each, the speed-ups, and how far the rankings agree.

    .venv/bin/python benchmarks/bench_retrieval.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from prblib.construction.retrieval import DenseRetriever, mean_pool  # noqa: E402

SEED = 0
USERS, POSTS, K = 50, 40, 10
LENGTHS = ((0.5, 5, 30), (0.35, 30, 90), (0.15, 90, 250))  # (share, min words, max words)
BLOCK = 5  # users per round; baseline and cold rank_many alternate by round, so load on a
           # shared machine falls on both alike
ROUNDS_BUDGET_S = 60  # on a busy machine, stop the rounds early (and say so) to finish in ~2 minutes


def make_items(rng: random.Random, words: list[str]) -> list[tuple[str, list[dict]]]:
    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) + "."

    items = []
    for u in range(USERS):
        posts = []
        for p in range(POSTS):
            share = rng.random()
            for weight, lo, hi in LENGTHS:
                if share < weight:
                    break
                share -= weight
            posts.append({"id": f"u{u}-p{p}", "text": text(lo, hi), "category": "bench"})
        items.append((text(8, 24) + "?", posts))
    return items


def baseline(retriever: DenseRetriever, items) -> list[list[tuple[dict, float]]]:
    tokenizer, model = retriever.tokenizer, retriever.model

    def embed_one(text: str) -> torch.Tensor:
        encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=retriever.max_length)
        hidden = model(**encoded).last_hidden_state
        vector = mean_pool(hidden, encoded["attention_mask"])[0]
        return torch.nn.functional.normalize(vector, dim=-1)

    results = []
    with torch.inference_mode():
        for question, posts in items:
            q = embed_one(question)
            scores = [float(embed_one(post["text"]) @ q) for post in posts]
            order = sorted(range(len(posts)), key=lambda i: -scores[i])[:K]
            results.append([(posts[i], scores[i]) for i in order])
    return results


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    rng = random.Random(SEED)
    retriever = DenseRetriever.default(lru_size=0)  # the baseline's model; no cache involved
    vocab = retriever.tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2)
    items = make_items(rng, words)
    n_posts = sum(len(posts) for _, posts in items)
    lengths = [len(ids) for ids in retriever.tokenizer([p["text"] for _, ps in items for p in ps],
                                                       truncation=True, max_length=retriever.max_length)["input_ids"]]
    print(f"all-MiniLM-L6-v2, float32, CPU ({torch.get_num_threads()} threads): {USERS} users x {POSTS} posts = "
          f"{n_posts} posts, top-{K}; post tokens min {min(lengths)} / median {int(np.median(lengths))} / "
          f"max {max(lengths)}")

    retriever.embed(["warm-up"])
    with tempfile.TemporaryDirectory() as cache:
        fast = DenseRetriever.default(cache_dir=Path(cache))
        fast.embed(["warm-up"])
        fast.stats = dict.fromkeys(fast.stats, 0)  # count the benchmark's texts only
        plain, cold, t_plain, t_cold = [], [], 0.0, 0.0
        for start in range(0, len(items), BLOCK):
            if t_plain + t_cold > ROUNDS_BUDGET_S:
                print(f"(time budget reached: measured on the first {start} of {len(items)} users)")
                items = items[:start]
                n_posts = sum(len(posts) for _, posts in items)
                break
            block = items[start:start + BLOCK]
            result, seconds = timed(lambda: baseline(retriever, block))
            plain += result
            t_plain += seconds
            result, seconds = timed(lambda: fast.rank_many(block, k=K))
            cold += result
            t_cold += seconds
        print(f"baseline (one text at a time)     {n_posts / t_plain:8.1f} posts/s  ({t_plain:6.2f} s)")
        print(f"rank_many, cold cache            {n_posts / t_cold:8.1f} posts/s  ({t_cold:6.2f} s)  "
              f"x{t_plain / t_cold:.2f} vs baseline; {fast.stats['embedded']} texts embedded "
              f"in {fast.stats['batches']} batches")
        before = dict(fast.stats)
        warm, t_warm = timed(lambda: fast.rank_many(items, k=K))
        print(f"rank_many, second pass (memory)   {n_posts / t_warm:8.1f} posts/s  ({t_warm:6.2f} s)  "
              f"x{t_cold / t_warm:.1f} vs cold; {fast.stats['embedded'] - before['embedded']} texts embedded, "
              f"{fast.stats['memory_hits'] - before['memory_hits']} memory hits")
        again = DenseRetriever.default(cache_dir=Path(cache))
        disk, t_disk = timed(lambda: again.rank_many(items, k=K))
        print(f"rank_many, new process (disk)     {n_posts / t_disk:8.1f} posts/s  ({t_disk:6.2f} s)  "
              f"x{t_cold / t_disk:.1f} vs cold; {again.stats['embedded']} texts embedded, "
              f"{again.stats['disk_hits']} disk hits")

    same_top = sum([p["id"] for p, _ in a] == [p["id"] for p, _ in b] for a, b in zip(plain, cold))
    diff = max(abs(sa - sb) for a, b in zip(plain, cold) for (_, sa), (_, sb) in zip(a, b))
    cached_equal = all([(p["id"], s) for p, s in a] == [(p["id"], s) for p, s in b]
                       for a, b in zip(cold, warm)) and all(
        [(p["id"], s) for p, s in a] == [(p["id"], s) for p, s in b] for a, b in zip(cold, disk))
    print(f"agreement: identical top-{K} order for {same_top}/{len(items)} users vs baseline, largest score "
          f"difference {diff:.2e}; cached passes identical to cold: {cached_equal}")


if __name__ == "__main__":
    main()
