"""The rules of protocol `release`: what the authors' released scripts compute, in our own code.

docs/protocols.md says, per kind of result, what the release computes (file and line in the
authors' repository), what protocol `prbench` computes instead and why. The names, labels and
one-line definitions are data in `registry.PROTOCOLS` / `RMKind.protocols`; this module holds
the rules themselves, shared by the judges, the scalar RM and the run's summary.

Pairwise judges under `release` (Personalized-RewardBench, evaluation/pairwise.py):
- order: ONE order per pair. Per domain (the release runs one subset file at a time), a fresh
  Python RNG seeded 42 makes one `random()` draw per row, in the benchmark's row order; a draw
  below 0.5 shows the chosen answer as A. `release_position(row)` is that rule: row r of a domain
  gets the (r+1)-th draw, whichever pairs a chunk or a resumed run scores.
- reading the reply (`parse_release_verdict`): the text after the last `</think>` (all of it
  when there is none), with every double quote and asterisk removed and lowercased; the
  first character after the first `result:` (leading white space skipped) is the verdict when it
  is `a` or `b`; anything else is unparsed.
- failure rule: an unparsed reply counts as "A" (RELEASE_FALLBACK) and stays in the denominator.
  The summary also gives the strict figure (an unparsed reply is wrong) and the count.

Plain Python; no Django, no torch.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prblib import registry

RELEASE_ORDER_SEED = 42  # the release's default --seed
RELEASE_FALLBACK = "A"  # what the release counts an unparsed reply as
STRICT_DEFINITION = "Strict: the same verdicts with an unreadable one counted wrong instead of as A."
NO_COUNTERPART = ("The authors' release evaluates this kind on the question alone: a result in the {setting} "
                  "setting has no published counterpart.")
NO_SCRIPT = "The authors' release has no evaluation script for this kind: its results have no published counterpart."


class ReleaseOrder:
    """The release's draws, one per row of a domain: `position(row)` is "A" when the chosen
    answer is shown first. Thread-safe (pairs are judged concurrently)."""

    def __init__(self, seed: int = RELEASE_ORDER_SEED):
        self._rng = random.Random(seed)
        self._draws: list[float] = []
        self._lock = threading.Lock()

    def draw(self, row: int) -> float:
        if row < 0:
            raise ValueError(f"a row index is 0 or more, not {row}")
        with self._lock:
            while len(self._draws) <= row:
                self._draws.append(self._rng.random())
            return self._draws[row]

    def position(self, row: int) -> str:
        return "A" if self.draw(row) < 0.5 else "B"


_ORDER = ReleaseOrder()


def release_position(row: int) -> str:
    """Where the release shows the chosen answer of a domain's row `row` (0-based): "A" or "B"."""
    return _ORDER.position(row)


def parse_release_verdict(text: str | None) -> str | None:
    """"A" or "B" as the release reads a judge's reply, or None when it finds neither."""
    reply = (text or "").strip().split("</think>")[-1].strip()
    reply = reply.replace('"', "").replace("*", "").strip().lower()
    marker = "result:"
    at = reply.find(marker)
    if at < 0:
        return None
    rest = reply[at + len(marker):].lstrip()
    if rest.startswith("a"):
        return "A"
    if rest.startswith("b"):
        return "B"
    return None


def pairwise_release_stats(details: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Beside a release run's accuracy (failures counted as A): {pairs, strict_accuracy (an
    unparsed reply wrong), parse_failures, counted_as_a, chosen_first} over one-order details."""
    pairs = strict = failures = counted_a = shown_first = 0
    for detail in details:
        orders = list(detail.get("orders") or [])
        if len(orders) != 1:
            continue
        order = orders[0]
        pairs += 1
        shown_first += order["chosen_position"] == "A"
        if order.get("verdict") is None:
            failures += 1
            counted_a += order.get("counted_as") == RELEASE_FALLBACK
        else:
            strict += order["verdict"] == order["chosen_position"]
    return {"pairs": pairs, "strict_accuracy": strict / pairs if pairs else None, "parse_failures": failures,
            "counted_as_a": counted_a, "chosen_first": shown_first, "strict_definition": STRICT_DEFINITION}


def protocol_summary(kind: str, options: Mapping[str, Any] | None, details: list[Mapping[str, Any]], *,
                     setting: str | None = None) -> dict[str, Any]:
    """The summary's `protocol` entry: {name, label, definition} of the rules the figures follow,
    plus, for a pairwise release run, the strict figure and the parse failures beside the
    release-comparable accuracy; and a `note` where the result has no published counterpart
    (`RMKind.released_settings`)."""
    shown: dict[str, Any] = registry.protocol_display(kind, dict(options or {}))
    if shown["name"] == "release" and any("orders" in d for d in details):
        shown.update(pairwise_release_stats(details))
    released = registry.kind(kind).released_settings
    if released == ():
        shown["note"] = NO_SCRIPT
    elif released is not None and setting and setting not in released:
        shown["note"] = NO_COUNTERPART.format(setting=setting)
    return shown


# --------------------------------------------------------------------------------------------
# Best-of-N and PPO under `release` (Personalized-RewardBench BoN/ and PPO/; verl's defaults where
# PPO/verl.sh sets nothing). docs/protocols.md gives each value's file and line.

# The policy's sampling (BoN/sample.py): N, temperature (its --temperature default), top_p, tokens.
RELEASE_BEST_OF_N = {"n": 16, "temperature": 1.0, "top_p": 0.9, "max_new_tokens": 512}
# The rubric judge (BoN/evaluate.py): greedy, 32 tokens, one request, the text read as it comes.
RELEASE_RUBRIC_JUDGE = {"temperature": 0.0, "max_tokens": 32}
RELEASE_PROFILE_POSTS = 10  # posts in the policy's prompt and the RM's input (BoN/sample.py --k)
# PPO (PPO/verl.sh; verl ppo_trainer.yaml for gamma, lam, epochs, value clip, weight decay, schedule).
RELEASE_PPO = {"batch_size": 128, "mini_batches": 8, "ppo_epochs": 1, "learning_rate": 5e-7,
               "critic_learning_rate": 5e-6, "response_length": 512, "temperature": 1.0, "kl_coef": 0.0,
               "gamma": 1.0, "lam": 1.0, "cliprange": 0.2, "cliprange_value": 0.5, "weight_decay": 0.01,
               "lr_schedule": "constant", "reward_scale": 0.1, "missing_reward": 0.5,
               "answer_temperature": 1.0, "answer_top_p": 0.9}

_LIST = re.compile(r"\[([^\]]+)\]")
_NUMBER = re.compile(r"-?\d+\.?\d*")


def release_rubric_score(text: str | None) -> float:
    """The rubric judge's grade as the release reads it: the numbers in the first bracketed list
    of the reply (stripped), or, without one, every number in the reply; their mean; 0.0 when
    there is no number. Never None: an unreadable reply scores 0 and stays in the mean.
    Shape: one float (the 0-2 scale the prompt asks for, but not clipped: the release does not)."""
    reply = (text or "").strip()
    found = _LIST.search(reply)
    numbers = [float(n) for n in _NUMBER.findall(found.group(1) if found else reply)]
    return sum(numbers) / len(numbers) if numbers else 0.0


def release_profile_text(posts: Iterable[Any], k: int = RELEASE_PROFILE_POSTS) -> str:
    """The release's profile text: the first k posts, each "Post i (Category: c):" and its text on
    the next line, joined by newlines. A post is a mapping with text (and category, empty when
    absent) or a string."""
    lines = []
    for i, post in enumerate(list(posts)[:k], start=1):
        if isinstance(post, Mapping):
            text, category = str(post.get("text", "")), str(post.get("category", "") or "")
        else:
            text, category = str(post), ""
        lines.append(f"Post {i} (Category: {category}):\n{text}")
    return "\n".join(lines)


def release_rm_question(question: str, posts: Iterable[Any]) -> str:
    """The user turn the release's discriminative RM scores a Best-of-N sample or a PPO rollout
    under: the question immediately followed by the profile text, no separator."""
    return question + release_profile_text(posts)
