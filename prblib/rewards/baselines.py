"""Reference baselines that need no model: where a reward model should land at the least.

- length: prefers the longer answer. A benchmark whose pairs differ in length would reward
  it; on balanced pairs it should sit near chance.
- profile_overlap: prefers the answer sharing more words with the user's past posts, a
  cheap lexical stand-in for "uses the profile".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prblib.rewards.base import PairInput

_WORD = re.compile(r"[a-z0-9']+")
_STOP = frozenset("a an and are as at be but by for from has have i in is it its my of on or so that the this to "
                  "was we were with you your".split())


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def length_scores(pairs: Iterable[PairInput]) -> Iterator[tuple[str, float, float]]:
    for pair in pairs:
        yield pair.id, float(len(pair.chosen.split())), float(len(pair.rejected.split()))


def profile_overlap_scores(pairs: Iterable[PairInput]) -> Iterator[tuple[str, float, float]]:
    for pair in pairs:
        profile = set().union(*(_words(post) for post in pair.profile)) if pair.profile else set()

        def overlap(text: str) -> float:
            words = _words(text)
            return len(words & profile) / len(words) if words else 0.0

        yield pair.id, overlap(pair.chosen), overlap(pair.rejected)


BASELINES = {"length": length_scores, "profile_overlap": profile_overlap_scores}
