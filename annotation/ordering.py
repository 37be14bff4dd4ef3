"""The order in which one annotator meets a campaign's pairs: random but reproducible
(seeded by campaign and annotator), stratified across domains.

Plain Python, no Django models, so the data migration and the services share it.

How the order is built
----------------------
At campaign creation each domain's pairs are shuffled with a generator seeded by
(campaign, domain); a pair's place in that shuffle is its ``stratum_round`` r and its
domain's index in the sorted domain list is its ``domain_index`` d. Campaign.strata
holds the number of pairs per domain, n_d.

For annotator A, seeded by (campaign, A):
  1. each domain's rounds are rotated: r' = (r + s_d) mod n_d, with s_d in [0, n_d);
  2. rounds are permuted: key = (a * r' + b) mod P, P = 1_000_003 (prime, larger than any
     round), a in [1, P), b in [0, P); a bijection on rounds since P is prime;
  3. domains are rotated: d' = (d + c) mod D, c in [0, D).
Ordering by (key, d') visits one pair of every domain before any domain's second pair,
so the first D pairs an annotator sees span all D domains. The service puts
"closest to completion" in front of this order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

PRIME = 1_000_003


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256(":".join(["prbench-order", *map(str, parts)]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def stratify(pairs: Iterable[tuple[int, str]], *, campaign_id: int) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """``pairs``: (key, domain) for every pair of a campaign. Returns (strata, places):
    strata[d] = number of pairs in the d-th domain (domains sorted by name), places[key] =
    (domain_index, stratum_round)."""
    by_domain: dict[str, list[int]] = {}
    for key, domain in pairs:
        by_domain.setdefault(str(domain), []).append(key)
    strata, places = [], {}
    for d, domain in enumerate(sorted(by_domain)):
        keys = sorted(by_domain[domain])
        _rng(campaign_id, "domain", domain).shuffle(keys)
        strata.append(len(keys))
        for r, key in enumerate(keys):
            places[key] = (d, r)
    return strata, places


@dataclass(frozen=True)
class AnnotatorOrder:
    """The per-annotator constants of the order (see the module docstring)."""

    shifts: tuple[int, ...]  # s_d per domain
    a: int
    b: int
    domain_shift: int  # c

    def key(self, domain_index: int, stratum_round: int, strata: list[int]) -> tuple[int, int]:
        """The sort key of one pair, in Python (the service builds the same in SQL)."""
        rotated = (stratum_round + self.shifts[domain_index]) % strata[domain_index]
        return (self.a * rotated + self.b) % PRIME, (domain_index + self.domain_shift) % len(strata)


def annotator_order(*, campaign_id: int, annotator_id: int, strata: list[int]) -> AnnotatorOrder:
    rng = _rng(campaign_id, "annotator", annotator_id)
    return AnnotatorOrder(shifts=tuple(rng.randrange(max(n, 1)) for n in strata), a=rng.randrange(1, PRIME),
                          b=rng.randrange(PRIME), domain_shift=rng.randrange(max(len(strata), 1)))
