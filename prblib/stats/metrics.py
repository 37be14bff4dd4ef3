"""Evaluation metrics: pure functions over plain data (no Django, no torch).

Accuracy follows the paper: a pair is correct when chosen scores strictly higher, so a tie is
wrong; `accuracy_ties_half` counts a tie as half a point instead. An accuracy's 95% interval is
the Clopper-Pearson (exact binomial) interval, which never collapses at 0 or n correct (10/10:
[0.6915, 1]). Means of other scores get percentile bootstraps with a fixed seed, so a report is
reproducible: `bootstrap_over_items` (by scipy.stats.bootstrap) is the one bootstrap, also used by
the correlation and annotation reports; where every resample gives the same value (one item, or
all items equal) the interval is None, "not enough data", never [x, x].
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

RESAMPLES = 1000
_CHUNK = 100  # resamples drawn at a time, to bound memory on large benchmarks


NOT_ENOUGH_DATA = "not enough data: every bootstrap resample gives the same value"
_POINT = 1e-12  # an interval narrower than this (relative to its value) is a point


def bootstrap_ci(values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0,
                 confidence: float = 0.95) -> tuple[float, float] | tuple[None, None]:
    """Percentile bootstrap CI of the mean of `values`: (low, high). (None, None) when there is not
    enough data for one: no value, one value, or every value equal (every resample would give the
    same mean, so the interval would be the point [x, x]: NOT_ENOUGH_DATA says why).
    Drawn by `bootstrap_over_items` (scipy.stats.bootstrap, numpy default_rng(seed))."""
    data = np.asarray(values, dtype=float)
    if data.size < 2 or np.ptp(data) == 0:
        return None, None
    low, high, _ = bootstrap_over_items(data.size, lambda idx: data[idx].mean(axis=-1)[None],
                                        resamples=resamples, seed=seed, confidence=confidence)
    return float(low[0]), float(high[0])


def proportion_ci(correct: int, n: int, *, confidence: float = 0.95) -> tuple[float, float] | tuple[None, None]:
    """Clopper-Pearson ("exact") interval of a proportion correct/n:
    `scipy.stats.binomtest(correct, n).proportion_ci(confidence, method="exact")` (Clopper & Pearson
    1934). It never collapses: 10/10 gives [0.6915, 1] ((0.025)^(1/10) = 0.6915), 0/10 [0, 0.3085],
    1/1 [0.025, 1]. (None, None) when n is 0. ValueError unless 0 <= correct <= n."""
    if int(n) != n or int(correct) != correct or not 0 <= correct <= n:
        raise ValueError("need whole numbers 0 <= correct <= n")
    if n == 0:
        return None, None
    from scipy import stats

    interval = stats.binomtest(int(correct), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return float(interval.low), float(interval.high)


def bootstrap_over_items(n: int, statistic: Callable[[np.ndarray], np.ndarray], *, resamples: int = RESAMPLES,
                         seed: int = 0, confidence: float = 0.95,
                         batch: int = _CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one bootstrap of the project: percentile intervals of m statistics over n items
    resampled with replacement (all statistics see the same resamples, so paired columns stay
    paired), drawn by `scipy.stats.bootstrap(method="percentile")` with
    `rng=numpy.random.default_rng(seed)`, `batch` resamples at a time to bound memory.

    `statistic(idx)` gets item indices of shape (batch, n) and returns shape (m, batch) (NaN where
    a statistic is undefined on that resample). Returns (low, high, skipped), each of shape (m,):
    the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles (linear interpolation, as scipy's
    interval) over the resamples where the statistic is defined, and how many were skipped; low
    and high are NaN when every resample was skipped. With one item every resample is that item,
    so the interval is the statistic of the data itself (scipy refuses n < 2). ValueError when
    n < 1, resamples < 1 or confidence is not in (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    if int(resamples) != resamples or resamples < 1:
        raise ValueError("resamples must be a positive integer")
    if int(n) != n or n < 1:
        raise ValueError("the bootstrap needs at least one item")
    if n == 1:
        value = np.asarray(statistic(np.zeros((1, 1), dtype=int)), dtype=float)[:, 0]
        skipped = np.where(np.isnan(value), int(resamples), 0)
        return value, value.copy(), skipped
    import warnings

    from scipy import stats

    def on_indices(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(statistic(np.atleast_2d(idx).astype(int)), dtype=float)

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # degenerate resamples are counted in `skipped` instead
        distribution = stats.bootstrap((np.arange(int(n)),), on_indices, vectorized=True,
                                       n_resamples=int(resamples), batch=int(batch), method="percentile",
                                       confidence_level=confidence,
                                       rng=np.random.default_rng(seed)).bootstrap_distribution
    tail = (1 - confidence) / 2
    low, high = np.full(distribution.shape[0], np.nan), np.full(distribution.shape[0], np.nan)
    skipped = np.zeros(distribution.shape[0], dtype=int)
    for i, row in enumerate(distribution):
        valid = row[~np.isnan(row)]
        skipped[i] = row.size - valid.size
        if valid.size:
            low[i], high[i] = np.quantile(valid, [tail, 1 - tail])
    return low, high, skipped


def _summary(rows: list[tuple[bool, bool]], *, resamples: int, seed: int) -> dict[str, Any]:
    n = len(rows)
    correct = sum(1 for c, _ in rows if c)
    ties = sum(1 for _, t in rows if t)
    if n == 0:
        return {"n": 0, "correct": 0, "ties": 0, "accuracy": None, "tie_rate": None, "accuracy_ties_half": None,
                "ci_low": None, "ci_high": None, "ci_method": CI_METHOD}
    low, high = proportion_ci(correct, n)
    return {"n": n, "correct": correct, "ties": ties, "accuracy": correct / n, "tie_rate": ties / n,
            "accuracy_ties_half": (correct + 0.5 * ties) / n, "ci_low": low, "ci_high": high, "ci_method": CI_METHOD}


CI_METHOD = "Clopper-Pearson 95% (scipy.stats.binomtest(...).proportion_ci(method='exact'))"


def summarize(results: Iterable[tuple[str, bool, bool]], *, resamples: int = RESAMPLES,
              seed: int = 0) -> dict[str, Any]:
    """Accuracy report from (domain, correct, tie) triples, one per pair.

    Returns n, correct, ties, accuracy (ties wrong), tie_rate, accuracy_ties_half, ci_low/ci_high
    (the 95% Clopper-Pearson interval of accuracy, `proportion_ci`: it never collapses, so a
    domain with one pair right gets [0.025, 1], not [1, 1]), ci_method, and by_domain with the
    same fields per domain. Rates are None when there are no pairs. `resamples` and `seed` are
    kept for callers of the former bootstrap and no longer used.
    """
    rows: list[tuple[str, bool, bool]] = []
    for domain, correct, tie in results:
        if correct and tie:
            raise ValueError("a pair cannot be both correct and a tie")
        rows.append((str(domain), bool(correct), bool(tie)))
    report = _summary([(c, t) for _, c, t in rows], resamples=resamples, seed=seed)
    report["by_domain"] = {
        domain: _summary([(c, t) for d, c, t in rows if d == domain], resamples=resamples, seed=seed)
        for domain in sorted({d for d, _, _ in rows})
    }
    return report


def paired_comparison(correct_a: Sequence[bool], correct_b: Sequence[bool], *, resamples: int = RESAMPLES,
                      seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Compare two systems judged on the same items (aligned lists of correctness).

    p_value: exact McNemar test, i.e. a two-sided binomial test (p = 1/2) on the discordant
    items (a right and b wrong: a_only; a wrong and b right: b_only); 1.0 when there are none.
    diff: accuracy of a minus accuracy of b; ci_low/ci_high: percentile bootstrap of diff
    resampling items (both systems together, so the pairing is kept); None, with ci_reason
    "not enough data", when the systems never differ (every resample gives diff 0).
    """
    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("both systems must be judged on the same items (equal-length lists)")
    n = int(a.size)
    if n == 0:
        return {"n": 0, "a_only": 0, "b_only": 0, "diff": None, "p_value": None, "ci_low": None, "ci_high": None,
                "ci_reason": "no items"}
    a_only = int(np.sum(a & ~b))
    b_only = int(np.sum(~a & b))
    p_value = mcnemar_p(a_only, b_only)
    diffs = a.astype(float) - b.astype(float)  # the mean of per-item differences is the accuracy difference
    low, high = bootstrap_ci(diffs, resamples=resamples, seed=seed, confidence=confidence)
    return {"n": n, "a_only": a_only, "b_only": b_only, "diff": float(a.mean() - b.mean()),
            "p_value": p_value, "ci_low": low, "ci_high": high, "ci_reason": None if low is not None else NOT_ENOUGH_DATA}


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given), by statsmodels' multipletests."""
    if len(p_values) == 0:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(p_values), method="holm")[1]]


def mcnemar_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (statsmodels' mcnemar with
    exact=True: a binomial test of a_only among a_only + b_only at 0.5); 1.0 when there are none."""
    if a_only + b_only == 0:
        return 1.0
    from statsmodels.stats.contingency_tables import mcnemar

    return min(1.0, float(mcnemar([[0, a_only], [b_only, 0]], exact=True).pvalue))


def significance_groups(systems: Mapping[str, Sequence[bool]], *, alpha: float = 0.05) -> dict[str, int]:
    """Ranks that only separate systems when the difference is significant.

    Rule: sort systems by accuracy (highest first; equal accuracy by name). The first unranked
    system leads a group and gets rank = 1 + the number of systems ranked before it (so ranks
    read like 1, 1, 3). It is compared with every system below it by the exact McNemar test
    (`paired_comparison`), and those p-values are Holm-corrected together (the family is this
    leader's comparisons), controlling the chance of wrongly splitting a system from its leader.
    Walking down the order, systems join the leader's group while they are not significantly
    worse (adjusted p >= alpha); the first one that is significantly worse, and everything
    below it, is left for the next group, so groups stay contiguous in accuracy order. Repeat
    until all are ranked. A system is never ranked above a more accurate one.
    """
    names = list(systems)
    data = {name: np.asarray(systems[name], dtype=bool) for name in names}
    lengths = {v.size for v in data.values()}
    if len(lengths) > 1:
        raise ValueError("all systems must be judged on the same items (equal-length lists)")
    ordered = sorted(names, key=lambda name: (-float(data[name].mean()) if data[name].size else 0.0, name))
    ranks: dict[str, int] = {}
    position = 0
    while position < len(ordered):
        leader, rest = ordered[position], ordered[position + 1:]
        p_values = [mcnemar_p(int(np.sum(data[leader] & ~data[other])), int(np.sum(~data[leader] & data[other])))
                    for other in rest]
        adjusted = holm_adjust(p_values) if p_values else []
        group = [leader]
        for other, p in zip(rest, adjusted):
            if p < alpha:
                break
            group.append(other)
        for name in group:
            ranks[name] = position + 1
        position += len(group)
    return ranks


def judge_order_stats(pair_details: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Order numbers of a pairwise judge, from each pair's details {"orders": [{"chosen_position",
    "verdict"}, ...]}.

    judgments: verdicts asked for (orders over all pairs); accuracy: share of judgments that
    picked the chosen answer; accuracy_chosen_first / _second: the same when chosen was shown as
    A / as B; position_bias: first minus second (positive = the judge favours the first slot);
    order_consistency: share of pairs judged in both orders whose two verdicts point at the same
    underlying answer (a parse failure makes a pair inconsistent); parse_failure_rate: failed
    judgments / judgments. A number is None when nothing feeds it.
    """
    judgments = failures = 0
    hits = {"A": 0, "B": 0}
    shown = {"A": 0, "B": 0}
    two_order_pairs = consistent = 0
    pairs = 0
    for details in pair_details:
        orders = list(details.get("orders") or [])
        pairs += 1
        picks = []
        for order in orders:
            position, verdict = order["chosen_position"], order.get("verdict")
            judgments += 1
            shown[position] += 1
            if verdict is None:
                failures += 1
                picks.append(None)
            else:
                hits[position] += verdict == position
                picks.append(verdict == position)  # True: picked the chosen answer
        if len(orders) == 2:
            two_order_pairs += 1
            consistent += picks[0] is not None and picks[0] == picks[1]

    def rate(num: int, den: int) -> float | None:
        return num / den if den else None

    first, second = rate(hits["A"], shown["A"]), rate(hits["B"], shown["B"])
    return {
        "pairs": pairs,
        "judgments": judgments,
        "parse_failures": failures,
        "accuracy": rate(hits["A"] + hits["B"], judgments),
        "accuracy_chosen_first": first,
        "accuracy_chosen_second": second,
        "position_bias": None if first is None or second is None else first - second,
        "order_consistency": rate(consistent, two_order_pairs),
        "parse_failure_rate": rate(failures, judgments),
    }
