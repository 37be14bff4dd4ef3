"""A small synthetic file in the published PersonalRewardBench schema, written by us for tests.

12 users; each has 4 train rows, 1 val row and 2 test rows. Half the users like short answers,
half like long ones (their chosen answer is the short or the long one), so prototypes have
something to find. Row order is shuffled by a fixed seed so users interleave as in the real files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

USERS = 12
SPLIT_ROWS = (("train", 4), ("val", 1), ("test", 2))
TOPICS = ("tea", "bicycles", "jazz", "tomatoes", "chess", "rainfall", "knots", "poetry", "bread", "comets")


def prb_row(user: int, index: int, split: str) -> dict:
    topic = TOPICS[(user + index) % len(TOPICS)]
    short = f"{topic.capitalize()}: keep it simple."
    long = (f"{topic.capitalize()} is a wide subject; here is a thorough tour of its history, practice and "
            f"common mistakes, with examples (user {user}, row {index}).")
    likes_short = user % 2 == 0
    chosen, rejected = (short, long) if likes_short else (long, short)
    return {
        "conversation_id": f"c{user:02d}-{index}",
        "user_id": f"user{user:02d}",
        "context": [{"content": f"Tell me about {topic} (question {index} of user {user}).", "role": "user"}],
        "chosen": {"content": chosen, "role": "assistant"},
        "rejected": {"content": rejected, "role": "assistant"},
        "chosen_score": 80.0 + index,
        "rejected_score": 20.0 + index,
        "turns": 1,
        "type": "unguided",
        "split": split,
        "flip": bool(index % 2),
    }


def prb_rows(users: int = USERS, seed: int = 3) -> list[dict]:
    rows = []
    for user in range(users):
        index = 0
        for split, count in SPLIT_ROWS:
            for _ in range(count):
                rows.append(prb_row(user, index, split))
                index += 1
    random.Random(seed).shuffle(rows)
    return rows


def write_prb(folder: Path, rows: list[dict] | None = None, name: str = "prism_personalized_0125") -> Path:
    """The rows as <folder>/<name>/data.jsonl (the folder name tells the set: PRISM); returns the folder."""
    target = Path(folder) / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rows or prb_rows())),
                                       encoding="utf-8")
    return target
