"""Does benchmark accuracy predict downstream outcome? Pure functions over plain data.

The benchmark is worth something only if the reward models (RMs) it ranks high also do well
downstream (Best-of-N, PPO; outcome = a judge's rubric score). This module relates the two:

- `correlate`: Spearman rho, Kendall tau-b, weighted Kendall tau, Pearson r, NDCG (raw and
  shifted gains, optional @k) and extrapolated RBO between benchmark scores and outcomes over
  RMs, with permutation p-values (exact up to EXACT_MAX_N RMs), percentile bootstrap CIs over
  RMs where they do not collapse to a point, and what a random ordering of the RMs gives
  (`chance`) for every metric (`definitions` says what each is).
- `ndcg`: NDCG of the ranking a benchmark induces, with the downstream outcome as gain.
- `rbo`: extrapolated rank-biased overlap of two rankings; `rbo_scores` of the rankings two
  score vectors induce, ties by fractional prefixes (never broken by name).
- `rank_stability`: do different policies (BoN k, PPO) rank the RMs the same way?
- `calibration`: how well an RM's score difference on a pair predicts the preference
  (`cross_fit_probabilities` gives the cross-fitted probabilities it scores);
  `verdict_calibration`: the Brier score and skill of a judge's verdict shares.

Higher is better everywhere: for benchmark scores (accuracy) and for outcomes. Every output is
JSON-serialisable: plain floats, ints, strings, lists and dicts, with None where a value is
undefined (never NaN). Bootstraps and Monte Carlo orderings use numpy's default_rng(seed), so a
report is reproducible.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from itertools import combinations, permutations
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss
from sklearn.model_selection import KFold

from prblib.stats.metrics import bootstrap_over_items

RESAMPLES = 1000
MIN_RMS = 3  # below this a correlation over RMs says nothing (and Pearson's p-value is undefined)
MIN_PAIRS = 10
UNINFORMED_BRIER = 0.25  # Brier score of the forecast 0.5 on every row: what a judge ignoring the answers gets
_CHUNK = 100  # bootstrap resamples evaluated at a time, to bound memory


# --------------------------------------------------------------------------------------------
# small helpers


def _num(value: Any) -> float | None:
    """A plain float, or None for NaN/inf/None (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")


def _check_resamples(resamples: int) -> None:
    if int(resamples) != resamples or resamples < 1:
        raise ValueError("resamples must be a positive integer")


def _finite_or_none(value: Any) -> float | None:
    """A finite float from a caller's mapping, or None when it is missing, NaN or inf."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------------------------
# the metrics (point values on one set of RMs)

METRICS = ("spearman", "kendall", "weighted_tau", "pearson", "ndcg", "ndcg_shifted", "rbo")
WITH_P_VALUE = ("spearman", "kendall", "pearson")
MIN_RMS_FOR_CI = 5  # below this, values are shown but a CI over RMs would be a fiction
RBO_P = 0.9
P_FLOOR = 1e-16  # below double precision's resolution near 1: shown as "< 1e-16", never "0"
# Null distributions over orderings of the RMs (p-values and the chance baseline): every one of
# the n! orderings up to EXACT_MAX_N RMs (8! = 40,320), PERMUTATIONS seeded random orderings
# above, and scipy's asymptotic p-values (t / normal approximation) from ASYMPTOTIC_MIN_N RMs on.
EXACT_MAX_N = 8
PERMUTATIONS = 9999
ASYMPTOTIC_MIN_N = 101
_PERMUTATION_BATCH = 2000  # orderings evaluated at a time, to bound memory
# Below this width a bootstrap interval is a point: shown as "not enough data", never [x, x].
_POINT = 1e-12


def p_display(p_value: float | None) -> str | None:
    """A p-value for people: "< 1e-16" below the floor (scipy returns 0.0 there), else 2 significant digits."""
    if p_value is None:
        return None
    return f"< {P_FLOOR:.0e}" if p_value < P_FLOOR else f"{p_value:.2g}"


def _quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def ndcg(predicted_scores: Mapping[str, float] | Sequence[float],
         true_relevance: Mapping[str, float] | Sequence[float], *, k: int | None = None,
         shifted: bool = False) -> float | None:
    """NDCG@k of ranking RMs by `predicted_scores` (benchmark score, higher first) with the
    downstream outcome as gain: `sklearn.metrics.ndcg_score([gains], [predicted], k=k)`.

    Gains are the raw outcomes (Jarvelin & Kekalainen 2002; the judge's 0-2 rubric scale is
    non-negative), so an RM's gain is what it achieves. With `shifted=True` the gains are
    outcome - min(outcome) (the worst RM gains 0; NDCG is scale-invariant, so this equals
    min-max rescaling): use it when outcomes can be negative, or to see the ranking's quality
    rather than the outcomes' level (raw gains on a scale far from 0 keep every ordering near 1:
    see `correlate`'s chance and worst figures). Discount 1 / log2(position + 1); tied
    predictions share their group's mean gain (sklearn's default, McSherry & Najork 2008).

    Accepts two mappings with the same keys or two sequences of equal length. Returns None
    when undefined: no RMs, every gain 0 (every ordering equally good), or a negative raw
    outcome (raises nothing: `ndcg_reason` says which). ValueError on mismatched input or k < 1.
    """
    return _ndcg_and_reason(predicted_scores, true_relevance, k=k, shifted=shifted)[0]


def ndcg_reason(predicted_scores, true_relevance, *, k: int | None = None, shifted: bool = False) -> str | None:
    """Why `ndcg` is None for this input (None when it has a value)."""
    return _ndcg_and_reason(predicted_scores, true_relevance, k=k, shifted=shifted)[1]


def _ndcg_and_reason(predicted_scores, true_relevance, *, k, shifted) -> tuple[float | None, str | None]:
    pred, true = _aligned(predicted_scores, true_relevance)
    if k is not None and (int(k) != k or k < 1):
        raise ValueError("k must be a positive integer or None")
    if pred.size == 0:
        return None, "no RMs"
    if not shifted and true.min() < 0:
        return None, "an outcome is negative: raw gains need outcomes >= 0 (see ndcg_shifted)"
    gains = true - true.min() if shifted else true
    if not gains.any():
        return None, "undefined: every gain is 0, so every ordering is equally good"
    return _num(_ndcg_rows(pred[None], gains[None], None if k is None else int(k))[0]), None


def rbo(first: Sequence, second: Sequence, *, p: float = RBO_P) -> float:
    """Extrapolated rank-biased overlap of two rankings (best first) of the same items,
    Webber, Moffat & Zobel 2010, eq. 23 (ties none: order tied items before calling):

        RBO_ext = X_k / k * p^k + (1 - p) / p * sum_{d=1..k} X_d / d * p^d

    where X_d = |first[:d] & second[:d]| and k the rankings' length. 1 for identical rankings;
    p (0 < p < 1, "persistence") sets how top-weighted it is: the top d ranks carry
    1 - p^(d-1) + (1-p)/p * d * (ln(1/(1-p)) - sum_{i<d} p^i / i) of the weight (eq. 21).
    ValueError when the rankings are not of the same distinct items or p is outside (0, 1)."""
    first, second = list(first), list(second)
    if not 0 < p < 1:
        raise ValueError("p must be between 0 and 1 (exclusive)")
    if len(set(first)) != len(first) or set(first) != set(second) or len(first) != len(second):
        raise ValueError("rbo compares two rankings of the same distinct items")
    k = len(first)
    if k == 0:
        return 1.0
    seen_first, seen_second, overlap, total = set(), set(), 0, 0.0
    for d, (a, b) in enumerate(zip(first, second), start=1):
        overlap += (a == b) + (a in seen_second) + (b in seen_first)
        seen_first.add(a)
        seen_second.add(b)
        total += overlap / d * p ** d
    return float(overlap / k * p ** k + (1 - p) / p * total)


def rbo_scores(first_scores: Sequence[float], second_scores: Sequence[float], *, p: float = RBO_P) -> float | None:
    """Extrapolated RBO (Webber, Moffat & Zobel 2010, eq. 23) of the two rankings that two score
    vectors over the same items induce (higher first), ties handled by the values alone, never
    by the items' names or input order.

    Tie rule (fractional prefixes): a group of t tied items holding positions a+1..a+t counts
    each of its items as a fraction min(1, max(0, (d - a) / t)) of a member of the top d, and the
    overlap at depth d is X_d = sum over items of the smaller of its two memberships. Without ties
    this is eq. 23 exactly (`rbo`). When only one of the rankings has ties (the usual case: tied
    accuracies against distinct outcomes) it equals the mean of `rbo` over every ordering of the
    tied items, since eq. 23 is linear in X_d; unlike that mean it gives 1 for a ranking with ties
    compared with itself (so an RM drawn twice by the bootstrap is no disagreement).

    Sequences of equal length (shape (n,)); None for no items. ValueError for unequal lengths,
    non-finite scores or p outside (0, 1)."""
    if not 0 < p < 1:
        raise ValueError("p must be between 0 and 1 (exclusive)")
    x, y = np.asarray(first_scores, dtype=float), np.asarray(second_scores, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError("rbo_scores compares two flat score sequences of equal length")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("scores must be finite")
    if x.size == 0:
        return None
    return float(_rbo_rows(x[None], y[None], p)[0])


def _top_d_membership(values: np.ndarray) -> np.ndarray:
    """How much item i belongs to the top d of the ranking by `values` (higher first): 1 or 0
    without ties, (d - a) / t clipped to [0, 1] for a tie group of t items after a items (the
    probability that it is in the top d when the group is ordered at random): shape (rows,
    n items, n depths d = 1..n)."""
    ahead = (values[:, None, :] > values[:, :, None]).sum(axis=-1)  # items strictly ahead of i
    tied = (values[:, None, :] == values[:, :, None]).sum(axis=-1)  # i's tie group, i included
    depths = np.arange(1, values.shape[1] + 1)
    return np.clip((depths[None, None, :] - ahead[..., None]) / tied[..., None], 0.0, 1.0)


def _rbo_rows(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    """`rbo_scores` per row of x and y (shape (rows, n)), vectorised."""
    n = x.shape[1]
    overlap = np.minimum(_top_d_membership(x), _top_d_membership(y)).sum(axis=1)  # X_d, shape (rows, n)
    depths = np.arange(1, n + 1)
    weights = p ** depths
    return overlap[:, -1] / n * p ** n + (1 - p) / p * (overlap / depths * weights).sum(axis=1)


# Batched statistics: rows are sets of RMs (the data, or bootstrap resamples); NaN where undefined.

def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    denom = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    # A resample drawing one value over and over is constant: r is undefined, not 0.
    constant = (np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=1) / denom
    r = np.clip(r, -1.0, 1.0)
    r[constant] = np.nan
    return r


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Spearman rho is Pearson r of average ranks, which is what scipy.stats.spearmanr computes.
    return _pearson_rows(stats.rankdata(x, axis=1), stats.rankdata(y, axis=1))


def _kendall_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall tau-b per row, from the signs of all pairwise differences (O(n^2) per row)."""
    n = x.shape[1]
    i, j = np.triu_indices(n, k=1)
    sx = np.sign(x[:, i] - x[:, j])
    sy = np.sign(y[:, i] - y[:, j])
    pairs = i.size
    # tau-b = (concordant - discordant) / sqrt((pairs - ties in x) * (pairs - ties in y)),
    # identical to scipy's (P - Q) / sqrt((P + Q + T) (P + Q + U)).
    untied_x = pairs - (sx == 0).sum(axis=1)
    untied_y = pairs - (sy == 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = (sx * sy).sum(axis=1) / np.sqrt(untied_x * untied_y.astype(float))
    tau = np.clip(tau, -1.0, 1.0)
    tau[(untied_x == 0) | (untied_y == 0)] = np.nan
    return tau


def _ndcg_rows(pred: np.ndarray, true: np.ndarray, k: int | None) -> np.ndarray:
    """`sklearn.metrics.ndcg_score([true_row], [pred_row], k=k)` per row, vectorised (pinned
    equal to sklearn in the tests): DCG = sum_i gain_i * the mean discount of the positions i's
    tie group of predictions occupies (sklearn's ignore_ties=False), discount 1 / log2(pos + 1),
    0 past k; over the DCG of the gains sorted best first. NaN where a gain is negative (sklearn
    refuses those: see ndcg_shifted) or every gain is 0 (sklearn would say 0; every ordering is
    equally good, so NDCG is undefined). Clipped to [0, 1] against rounding."""
    n = pred.shape[1]
    discount = 1 / np.log2(np.arange(2, n + 2))
    if k is not None:
        discount[k:] = 0.0
    cumulative = np.concatenate([[0.0], np.cumsum(discount)])
    ahead = (pred[:, None, :] > pred[:, :, None]).sum(axis=-1)
    through = (pred[:, None, :] >= pred[:, :, None]).sum(axis=-1)
    mean_discount = (cumulative[through] - cumulative[ahead]) / (through - ahead)
    dcg = (true * mean_discount).sum(axis=1)
    ideal = (-np.sort(-true, axis=1) * discount).sum(axis=1)
    valid = (true.min(axis=1) >= 0) & (true.max(axis=1) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(valid, dcg / np.where(valid, ideal, 1.0), np.nan)
    return np.clip(out, 0.0, 1.0)


def _metric_rows(x: np.ndarray, y: np.ndarray, *, ndcg_k: int | None, rbo_p: float,
                 weighted: bool = True) -> dict[str, np.ndarray]:
    """Every metric of benchmark scores x against outcomes y, one value per row (NaN where
    undefined); `weighted=False` leaves weighted tau out (scipy's is one row at a time)."""
    out = {"spearman": _spearman_rows(x, y), "kendall": _kendall_rows(x, y), "pearson": _pearson_rows(x, y)}
    if weighted:
        constant = (np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)
        out["weighted_tau"] = np.array([np.nan if c else _quiet(stats.weightedtau, a, b).statistic
                                        for a, b, c in zip(x, y, constant)])
    out["ndcg"] = _ndcg_rows(x, y, ndcg_k)  # NaN where an outcome is negative
    out["ndcg_shifted"] = _ndcg_rows(x, y - y.min(axis=1, keepdims=True), ndcg_k)
    out["rbo"] = _rbo_rows(x, y, rbo_p)
    return out


# --------------------------------------------------------------------------------------------
# correlate


def definitions(*, ndcg_k: int | None = None, rbo_p: float = RBO_P) -> dict[str, str]:
    """What each metric of `correlate` is, in one line each (shown by the API and the README)."""
    cut = f"@{ndcg_k}" if ndcg_k else ""
    return {
        "spearman": "Spearman rho of accuracy and outcome over RMs (scipy.stats.spearmanr: Pearson r of average "
                    "ranks); p-value two-sided, from the permutation distribution (see p)",
        "kendall": "Kendall tau-b of accuracy and outcome (scipy.stats.kendalltau); p-value two-sided, permutation",
        "weighted_tau": "weighted Kendall tau, hyperbolic weights on the top ranks "
                        "(scipy.stats.weightedtau(accuracy, outcome), its defaults)",
        "pearson": "Pearson r of accuracy and outcome (scipy.stats.pearsonr); p-value two-sided, permutation",
        "ndcg": f"NDCG{cut} of the accuracy ranking, gain = the raw outcome (the judge's rubric score, 0-2), "
                "discount 1/log2(position + 1), tied accuracies share their positions' mean discount "
                "(sklearn.metrics.ndcg_score([outcome], [accuracy])); null if an outcome is negative. Raw gains "
                "far from 0 keep every ordering near 1: read it against its chance and worst figures",
        "ndcg_shifted": f"NDCG{cut} with gain = outcome - min outcome (equals min-max rescaled gains: the worst "
                        "RM gains 0), so an ordering's value reflects the ranking rather than the outcomes' level",
        "rbo": f"extrapolated rank-biased overlap (Webber et al. 2010, eq. 23) of the accuracy and outcome "
               f"rankings, persistence p = {rbo_p}; ties never broken by name: a tie group counts fractionally "
               "in each prefix it spans (the mean over the tie's orderings when only one ranking has ties)",
        "p": f"permutation test of no association: the statistic over every ordering of the RMs' accuracies "
             f"against their outcomes (exact, all n! orderings, up to {EXACT_MAX_N} RMs), over {PERMUTATIONS} "
             f"seeded random orderings from {EXACT_MAX_N + 1} RMs (Monte Carlo, p = (hits + 1) / "
             f"({PERMUTATIONS} + 1)), scipy's asymptotic p from {ASYMPTOTIC_MIN_N} RMs "
             "(scipy.stats.permutation_test, two-sided); an exact p with n RMs is never below 2/n!",
        "chance": "what a random ordering of the RMs gives: mean, standard deviation and central interval of the "
                  "metric over the orderings the p-value uses (exact over all n! up to "
                  f"{EXACT_MAX_N} RMs, else {PERMUTATIONS} seeded random ones), and share_at_least, the share of "
                  "orderings scoring at least the benchmark's value; NDCG's worst is the value of the "
                  "reversed outcome ordering",
        "ci": "percentile bootstrap over RMs (scipy.stats.bootstrap, RMs resampled with replacement, the same "
              f"resamples for every metric); none with fewer than {MIN_RMS_FOR_CI} RMs, and 'not enough data' "
              "when every resample gives the same value (the interval would be a single point)",
    }


def _permutation_orderings(n: int, seed: int):
    """(batches of orderings (rows, n), how many, exact?): all n! orderings up to EXACT_MAX_N RMs,
    else PERMUTATIONS orderings drawn by numpy's default_rng(seed)."""
    if n <= EXACT_MAX_N:
        every = np.array(list(permutations(range(n))), dtype=int)
        return [every], every.shape[0], True
    rng = np.random.default_rng(seed)
    drawn = [np.argsort(rng.random((min(_PERMUTATION_BATCH, PERMUTATIONS - start), n)), axis=1)
             for start in range(0, PERMUTATIONS, _PERMUTATION_BATCH)]
    return drawn, PERMUTATIONS, False


def p_method(n: int, *, seed: int = 0) -> str:
    """How `permutation_p_value` computes p for n RMs, in words (shown beside every p)."""
    if n >= ASYMPTOTIC_MIN_N:
        return "asymptotic"
    if n <= EXACT_MAX_N:
        return f"exact, all {math.factorial(n)} orderings"
    return f"permutation, {PERMUTATIONS} random orderings (seed {seed})"


_ROWS = {"spearman": _spearman_rows, "kendall": _kendall_rows, "pearson": _pearson_rows}
_ASYMPTOTIC = {"spearman": stats.spearmanr, "kendall": stats.kendalltau, "pearson": stats.pearsonr}


def permutation_p_value(x: Sequence[float], y: Sequence[float], statistic: str, *, seed: int = 0) -> float | None:
    """Two-sided p-value of `statistic` ("spearman", "kendall" or "pearson") between x and y (shape
    (n,)) under the null that the pairing is random: `scipy.stats.permutation_test((x,), ...,
    permutation_type="pairings", alternative="two-sided")`, exact over all n! orderings up to
    EXACT_MAX_N, else PERMUTATIONS orderings drawn with default_rng(seed) (p = (hits + 1) /
    (PERMUTATIONS + 1)); scipy's asymptotic p-value (spearmanr / kendalltau / pearsonr) from
    ASYMPTOTIC_MIN_N. Ties keep their structure (x is permuted as given: tau-b, average ranks).
    An exact p with n items is a multiple of 1/n! and never below 2/n! (e.g. 3 items in perfect
    order: 1/3). None when the statistic is undefined (an input constant) or n < 3."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    if n >= ASYMPTOTIC_MIN_N:
        return _num(_quiet(_ASYMPTOTIC[statistic], x, y).pvalue)
    rows = _ROWS[statistic]

    def on_orderings(permuted: np.ndarray, axis: int = -1) -> np.ndarray:
        batch = np.atleast_2d(permuted)
        values = rows(batch, np.broadcast_to(y, batch.shape))
        return values if permuted.ndim > 1 else values[0]

    with np.errstate(all="ignore"):
        result = stats.permutation_test((x,), on_orderings, permutation_type="pairings", vectorized=True,
                                        n_resamples=np.inf if n <= EXACT_MAX_N else PERMUTATIONS,
                                        alternative="two-sided", batch=_PERMUTATION_BATCH,
                                        rng=np.random.default_rng(seed))
    return _num(min(1.0, float(result.pvalue)))


def chance(benchmark_scores: Sequence[float], outcomes: Sequence[float], *, ndcg_k: int | None = None,
           rbo_p: float = RBO_P, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """What a random ordering of the RMs gives for each metric of `correlate`: the benchmark
    scores are permuted against the outcomes (ties kept), over every one of the n! orderings up
    to EXACT_MAX_N RMs, else PERMUTATIONS orderings drawn with default_rng(seed).

    Returns {"orderings": how many, "exact": bool, "method": text, metric: {mean, sd (population
    SD over the orderings), low, high (the central `confidence` interval of the orderings'
    values), share_at_least (share of orderings scoring >= the value of the given ordering,
    within 1e-12: the one-sided permutation p), worst (NDCG only: the value of the ordering
    reversed against the outcomes)} or None where undefined}. Weighted tau is not included
    (scipy.stats.weightedtau runs one ordering at a time). Inputs: equal-length sequences (n >= 2)."""
    _check_confidence(confidence)
    x, y = np.asarray(benchmark_scores, dtype=float), np.asarray(outcomes, dtype=float)
    n = x.size
    batches, count, exact = _permutation_orderings(n, seed)
    names = [m for m in METRICS if m != "weighted_tau"]
    observed = _metric_rows(x[None], y[None], ndcg_k=ndcg_k, rbo_p=rbo_p, weighted=False)
    values = {m: [] for m in names}
    for orderings in batches:
        rows = _metric_rows(x[orderings], np.broadcast_to(y, orderings.shape), ndcg_k=ndcg_k, rbo_p=rbo_p,
                            weighted=False)
        for m in names:
            values[m].append(rows[m])
    out: dict[str, Any] = {"orderings": int(count), "exact": exact,
                           "method": (f"exact, all {count} orderings" if exact
                                      else f"Monte Carlo, {count} random orderings (seed {seed})")}
    tail = (1 - confidence) / 2
    for m in names:
        dist = np.concatenate(values[m])
        dist = dist[~np.isnan(dist)]
        if dist.size == 0:
            out[m] = None
            continue
        entry = {"mean": _num(dist.mean()), "sd": _num(dist.std()),
                 "low": _num(np.quantile(dist, tail)), "high": _num(np.quantile(dist, 1 - tail)),
                 "share_at_least": None}
        seen = observed[m][0]
        if not np.isnan(seen):
            entry["share_at_least"] = _num(np.mean(dist >= seen - 1e-12))
        if m.startswith("ndcg"):
            gains = y - y.min() if m == "ndcg_shifted" else y
            entry["worst"] = _num(_ndcg_rows(-y[None], gains[None], ndcg_k)[0])
        out[m] = entry
    out["weighted_tau"] = None
    return out


def _entry_with_ci(entry: dict[str, Any], low, high, skipped) -> None:
    """Set a metric's CI, or 'not enough data' where the bootstrap distribution is one point."""
    entry["skipped_resamples"] = skipped
    if low is None or high is None:
        entry["ci_reason"] = "not enough data: the metric is undefined on every bootstrap resample"
    elif high - low <= _POINT * max(1.0, abs(high)):
        entry["ci_reason"] = (f"not enough data: every bootstrap resample gives {low:.3g}, so the interval "
                              "would be a single point")
    else:
        entry["ci_low"], entry["ci_high"] = low, high


def correlate(benchmark_scores: Mapping[str, float], outcomes: Mapping[str, float], *,
              resamples: int = RESAMPLES, seed: int = 0, confidence: float = 0.95,
              ndcg_k: int | None = None, rbo_p: float = RBO_P) -> dict[str, Any]:
    """Relate the benchmark's scores of RMs (accuracy) to their downstream outcomes.

    Uses the RMs present in both mappings with finite values; the others are named in
    `dropped` (RM -> why). Fewer than 3 such RMs: every value is None and `reason` says why.
    Fewer than MIN_RMS_FOR_CI (5): values are given, every CI is None and `warning` says why.

    Returns a dict with keys:
      n, rms (sorted names used), dropped {rm: reason}, resamples, seed, confidence, ndcg_k,
        rbo_p, reason (None when computed), warning (None, or the small-sample warning),
        p_method (how the p-values were computed, `p_method`), chance_method (how `chance` was),
      one entry per name in METRICS (see `definitions`), each {value, ci_low, ci_high,
        skipped_resamples, reason, ci_reason, chance}, plus p_value, p_display ("< 1e-16"
        below the floor) and p_method for spearman, kendall and pearson: the two-sided
        permutation p-value of `permutation_p_value` (exact up to EXACT_MAX_N RMs).
      chance: `chance`'s figures for that metric (mean, sd, low, high, share_at_least, and
        worst for NDCG), None for weighted tau.
      The CI is scipy.stats.bootstrap's percentile interval over RMs resampled with
      replacement, `resamples` resamples drawn with numpy's default_rng(seed) and shared by all
      metrics; a resample on which a metric is undefined (it drew one RM n times, so an input is
      constant) is skipped and counted in skipped_resamples, the CI taken over the rest. When
      the interval is a single point (e.g. RMs in perfect order: every resample gives 1) the CI
      is None and ci_reason says "not enough data". A metric undefined on the full data is None
      with a reason.
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
    if not 0 < rbo_p < 1:
        raise ValueError("rbo_p must be between 0 and 1 (exclusive)")
    if ndcg_k is not None and (int(ndcg_k) != ndcg_k or ndcg_k < 1):
        raise ValueError("ndcg_k must be a positive integer or None")
    dropped: dict[str, str] = {}
    common: list[str] = []
    for rm in sorted(set(benchmark_scores) | set(outcomes), key=str):
        if rm not in outcomes:
            dropped[str(rm)] = "no downstream outcome"
        elif rm not in benchmark_scores:
            dropped[str(rm)] = "no benchmark score"
        elif _finite_or_none(benchmark_scores[rm]) is None or _finite_or_none(outcomes[rm]) is None:
            dropped[str(rm)] = "missing or non-finite value"
        else:
            common.append(rm)
    n = len(common)
    report: dict[str, Any] = {"n": n, "rms": [str(rm) for rm in common], "dropped": dropped,
                              "resamples": int(resamples), "seed": int(seed), "confidence": float(confidence),
                              "ndcg_k": ndcg_k, "rbo_p": float(rbo_p), "reason": None, "warning": None,
                              "p_method": None, "chance_method": None}
    empty = {"value": None, "ci_low": None, "ci_high": None, "skipped_resamples": None, "reason": None,
             "ci_reason": None, "chance": None}
    if n < MIN_RMS:
        reason = f"need at least {MIN_RMS} RMs with both a benchmark score and an outcome, got {n}"
        report["reason"] = reason
        for name in METRICS:
            report[name] = {**empty, "reason": reason}
            if name in WITH_P_VALUE:
                report[name].update(p_value=None, p_display=None, p_method=None)
        return report

    x = np.array([float(benchmark_scores[rm]) for rm in common])
    y = np.array([float(outcomes[rm]) for rm in common])
    values = {name: _num(row[0]) for name, row in _metric_rows(x[None], y[None], ndcg_k=ndcg_k,
                                                               rbo_p=rbo_p).items()}
    boot = None
    if n < MIN_RMS_FOR_CI:
        report["warning"] = (f"only {n} RMs: values are shown but no confidence intervals (they need at least "
                             f"{MIN_RMS_FOR_CI}); a correlation over so few RMs is weak evidence")
    else:
        boot = _bootstrap(x, y, resamples=int(resamples), seed=seed, confidence=confidence,
                          ndcg_k=ndcg_k, rbo_p=rbo_p)
    random_orderings = chance(x, y, ndcg_k=ndcg_k, rbo_p=rbo_p, seed=seed, confidence=confidence)
    report["p_method"] = p_method(n, seed=seed)
    report["chance_method"] = random_orderings["method"]
    constant = "undefined: benchmark scores or outcomes are constant across RMs"
    for name in METRICS:
        entry = {**empty, "value": values[name]}
        if name in WITH_P_VALUE:
            p_value = None if values[name] is None else permutation_p_value(x, y, name, seed=seed)
            entry.update(p_value=p_value, p_display=p_display(p_value),
                         p_method=None if p_value is None else report["p_method"])
        if values[name] is None:
            entry["reason"] = (ndcg_reason(x, y, k=ndcg_k, shifted=name == "ndcg_shifted")
                               if name.startswith("ndcg") else constant)
        else:
            entry["chance"] = random_orderings[name]
            if boot is not None:
                _entry_with_ci(entry, *boot[name])
        report[name] = entry
    return report


def _bootstrap(x: np.ndarray, y: np.ndarray, *, resamples: int, seed: int,
               confidence: float, ndcg_k: int | None, rbo_p: float) -> dict[str, tuple]:
    """{metric: (ci_low, ci_high, skipped resamples)}: `metrics.bootstrap_over_items` over RMs
    (scipy.stats.bootstrap's percentile interval, RM indices resampled with replacement; one
    resample = the same RMs for every metric); resamples where a metric is NaN are skipped. An
    RM drawn twice is two tied entries (tied in both rankings: no disagreement for RBO)."""
    def statistic(idx: np.ndarray) -> np.ndarray:
        rows = _metric_rows(x[idx], y[idx], ndcg_k=ndcg_k, rbo_p=rbo_p)
        return np.stack([rows[m] for m in METRICS])

    low, high, skipped = bootstrap_over_items(x.size, statistic, resamples=resamples, seed=seed,
                                              confidence=confidence, batch=_CHUNK)
    return {name: (_num(lo), _num(hi), int(sk)) for name, lo, hi, sk in zip(METRICS, low, high, skipped)}


# --------------------------------------------------------------------------------------------
# NDCG input


def _aligned(predicted_scores, true_relevance) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(predicted_scores, Mapping) != isinstance(true_relevance, Mapping):
        raise ValueError("pass two mappings (RM -> value) or two sequences, not one of each")
    if isinstance(predicted_scores, Mapping):
        if set(predicted_scores) != set(true_relevance):
            raise ValueError("predicted_scores and true_relevance must have the same RMs")
        keys = list(predicted_scores)
        predicted = [predicted_scores[key] for key in keys]
        truth = [true_relevance[key] for key in keys]
    else:
        predicted, truth = list(predicted_scores), list(true_relevance)
    pred = np.asarray(predicted, dtype=float)
    true = np.asarray(truth, dtype=float)
    if pred.ndim != 1 or pred.shape != true.shape:
        raise ValueError("predicted_scores and true_relevance must be flat and of equal length")
    if not (np.isfinite(pred).all() and np.isfinite(true).all()):
        raise ValueError("scores and relevances must be finite")
    return pred, true


# --------------------------------------------------------------------------------------------
# rank stability across policies


def rank_stability(outcomes_by_policy: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """How consistently different policies (e.g. BoN k=4, BoN k=16, PPO) rank the RMs.

    Uses the RMs with a finite outcome under every policy; the others are named in `dropped`.
    Ranks: 1 = best (highest outcome), ties get their average rank.

    Returns a dict with keys:
      policies (in the order given), rms (sorted), n (RMs used), dropped {rm: reason},
      ranks {policy: {rm: rank}},
      pairwise: [{a, b, tau, p_value, p_method}] for every pair of policies, Kendall tau-b
        (scipy.stats.kendalltau) between the two rankings with its two-sided permutation
        p-value (`permutation_p_value`: exact up to EXACT_MAX_N RMs); tau None when undefined
        (fewer than MIN_RMS = 3 RMs: two RMs are in the same order or not, which says nothing
        about stability; or a policy gives every RM the same outcome),
      mean_tau: mean of the defined pairwise taus (None if there are none),
      rank_range {rm: {min, max, range}}: best and worst rank an RM gets across policies,
      reason: None, or why nothing could be compared (fewer than 2 policies or 3 RMs).
    """
    policies = [str(policy) for policy in outcomes_by_policy]
    tables = list(outcomes_by_policy.values())
    dropped: dict[str, str] = {}
    common: list = []
    for rm in sorted({rm for table in tables for rm in table}, key=str):
        missing = [p for p, table in zip(policies, tables) if _finite_or_none(table.get(rm)) is None]
        if missing:
            dropped[str(rm)] = "no finite outcome under " + ", ".join(missing)
        else:
            common.append(rm)

    ranks: dict[str, dict[str, float]] = {}
    rank_arrays: list[np.ndarray] = []
    for policy, table in zip(policies, tables):
        values = np.array([float(table[rm]) for rm in common])
        rank = stats.rankdata(-values) if values.size else values
        rank_arrays.append(rank)
        ranks[policy] = {str(rm): float(r) for rm, r in zip(common, rank)}

    pairwise = []
    for (a, ra), (b, rb) in combinations(zip(policies, rank_arrays), 2):
        tau = p_value = method = None
        if len(common) >= MIN_RMS:
            tau = _num(_quiet(stats.kendalltau, ra, rb).statistic)
            if tau is not None:
                p_value = permutation_p_value(ra, rb, "kendall")
                method = p_method(len(common))
        pairwise.append({"a": a, "b": b, "tau": tau, "p_value": p_value, "p_method": method})
    taus = [entry["tau"] for entry in pairwise if entry["tau"] is not None]

    rank_range = {}
    for column, rm in enumerate(common):
        low = min(float(rank[column]) for rank in rank_arrays)
        high = max(float(rank[column]) for rank in rank_arrays)
        rank_range[str(rm)] = {"min": low, "max": high, "range": high - low}

    reason = None
    if len(policies) < 2:
        reason = f"need at least 2 policies to compare, got {len(policies)}"
    elif len(common) < MIN_RMS:
        reason = f"need at least {MIN_RMS} RMs with an outcome under every policy, got {len(common)}"
    return {"policies": policies, "rms": [str(rm) for rm in common], "n": len(common), "dropped": dropped,
            "ranks": ranks, "pairwise": pairwise, "mean_tau": _num(np.mean(taus)) if taus else None,
            "rank_range": rank_range, "reason": reason}


# --------------------------------------------------------------------------------------------
# calibration


def _fit_logistic(d: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of P(y=1 | x) = sigmoid(slope x + intercept) on rows (d, 1), (-d, 0).

    The feature is divided by its root mean square before fitting, so sklearn's default L2
    penalty (C=1) does not depend on the units of the RM's scores; the slope is reported in the
    original units. The penalty also keeps the slope finite when the RM orders every pair
    right (the two orientations are then perfectly separable).
    """
    scale = float(np.sqrt(np.mean(d * d)))
    if scale == 0:
        return 0.0, 0.0
    x = np.concatenate([d, -d])[:, None] / scale
    y = np.concatenate([np.ones(d.size), np.zeros(d.size)])
    model = LogisticRegression().fit(x, y)
    return float(model.coef_[0, 0]) / scale, float(model.intercept_[0])


def _reliability(p: np.ndarray, y: np.ndarray, bins: int) -> tuple[float, list[dict[str, Any]]]:
    """ECE and the reliability table over `bins` equal-width bins of predicted probability."""
    index = np.minimum((p * bins).astype(int), bins - 1)
    table = []
    ece = 0.0
    for b in range(bins):
        mask = index == b
        count = int(mask.sum())
        row = {"bin_low": b / bins, "bin_high": (b + 1) / bins, "count": count,
               "mean_predicted": None, "observed_frequency": None}
        if count:
            mean_p, freq = float(p[mask].mean()), float(y[mask].mean())
            row["mean_predicted"], row["observed_frequency"] = mean_p, freq
            ece += count / p.size * abs(mean_p - freq)
        table.append(row)
    return ece, table


def cross_fit_probabilities(diffs: Sequence[float], *, cv: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cross-fitted P(y=1 | x) for the rows (d, 1) of every pair followed by (-d, 0).

    Returns (probabilities, labels), each of length 2n. The pairs are split into min(cv, n)
    folds (KFold, shuffled with `seed`); a pair's two rows are scored by the logistic model
    fit on the other folds, never by one that saw the pair.
    """
    d = np.asarray(diffs, dtype=float).ravel()
    n = d.size
    p_chosen, p_flipped = np.empty(n), np.empty(n)
    for train, test in KFold(n_splits=min(int(cv), n), shuffle=True, random_state=seed).split(d):
        slope, intercept = _fit_logistic(d[train])
        p_chosen[test] = expit(slope * d[test] + intercept)
        p_flipped[test] = expit(-slope * d[test] + intercept)
    return np.concatenate([p_chosen, p_flipped]), np.concatenate([np.ones(n), np.zeros(n)])


def calibration(diffs: Sequence[float], *, bins: int = 10, cv: int = 5, seed: int = 0) -> dict[str, Any]:
    """Calibration of an RM from its per-pair score differences d = chosen - rejected.

    In a benchmark every pair's truth is "chosen", so each pair is used in both orientations,
    (d, y=1) and (-d, y=0), and a 1-D logistic regression P(y=1 | x) = sigmoid(a x + b)
    (sklearn LogisticRegression, feature scaled by its RMS, default L2 penalty) maps a score
    difference to the probability that the RM's preferred answer is the better one. By the
    symmetry of the data the fitted intercept is 0 (up to solver tolerance); the slope says
    how much a unit of score difference is worth.

    Cross-fitting: the pairs are split into `cv` folds (KFold, shuffled with `seed`), both
    orientations of a pair always in the same fold; each pair's probabilities come from the
    model fit on the other folds, so the ECE and Brier score are not flattered by fitting
    and scoring the same pairs. `slope`/`intercept` are from one fit on all pairs.

    Keys:
      n (pairs), bins, cv (folds used), seed, reason (None unless degenerate),
      slope, intercept (full-data fit, slope in the units of d),
      ece: expected calibration error of the cross-fitted probabilities over all 2n rows:
        equal-width bins over [0, 1] of predicted probability, |mean predicted - observed
        frequency| weighted by the bin's share of rows,
      brier: mean squared error of those probabilities against y (sklearn brier_score_loss),
      brier_skill: 1 - brier / 0.25, the Brier skill score against the uninformed forecast 0.5
        (0 for an RM whose differences carry no information, 1 for a perfect one; on these
        mirrored rows the ECE alone cannot tell an uninformative RM, p = 0.5 everywhere, from
        a good one),
      reliability: one row per bin {bin_low, bin_high, count, mean_predicted,
        observed_frequency} (the last two None for an empty bin),
      raw: {ece, brier, reliability} for sigmoid(d) itself, i.e. reading d as a
        Bradley-Terry logit difference with no refitting. The recalibrated `ece` is small
        whenever a logistic link fits, whatever the scale of d (the refit absorbs the scale);
        `raw` and `slope` (1 = scores are calibrated logits) are what show a badly scaled RM.
    With fewer than 10 pairs, or all differences equal, every value is None with a reason.
    """
    d = np.asarray(diffs, dtype=float).ravel()
    if not np.isfinite(d).all():
        raise ValueError("score differences must be finite")
    if int(bins) != bins or bins < 1:
        raise ValueError("bins must be a positive integer")
    if int(cv) != cv or cv < 2:
        raise ValueError("cv must be an integer >= 2")
    bins, n = int(bins), int(d.size)
    report: dict[str, Any] = {"n": n, "bins": bins, "cv": None, "seed": int(seed), "reason": None,
                              "slope": None, "intercept": None, "ece": None, "brier": None, "brier_skill": None,
                              "reliability": None, "raw": {"ece": None, "brier": None, "reliability": None}}
    if n < MIN_PAIRS:
        report["reason"] = f"need at least {MIN_PAIRS} pairs, got {n}"
        return report
    if np.ptp(d) == 0:
        report["reason"] = "all score differences are equal: nothing to relate probability to"
        return report

    p, y = cross_fit_probabilities(d, cv=cv, seed=seed)
    slope, intercept = _fit_logistic(d)
    ece, table = _reliability(p, y, bins)
    raw_p = expit(np.concatenate([d, -d]))
    raw_ece, raw_table = _reliability(raw_p, y, bins)
    report.update({"cv": min(int(cv), n), "slope": _num(slope), "intercept": _num(intercept), "ece": _num(ece),
                   "brier": _num(brier_score_loss(y, p)),
                   "brier_skill": _num(1 - brier_score_loss(y, p) / UNINFORMED_BRIER), "reliability": table,
                   "raw": {"ece": _num(raw_ece), "brier": _num(brier_score_loss(y, raw_p)),
                           "reliability": raw_table}})
    return report


# --------------------------------------------------------------------------------------------
# generative judges: verdict shares


def verdict_calibration(shares: Sequence[float | None], *, bins: int = 10) -> dict[str, Any]:
    """How much a generative judge's own probabilities say, from per pair the share of its
    verdicts that prefer the chosen answer (pairwise judges: over both orders; P-GenRM: over its
    m chains and the neighbours'). No fitting: the shares are read as probabilities as they are.

    Every pair's truth is "chosen", so each pair gives the rows (share, y=1) and (1 - share,
    y=0), as in `calibration`. Pairs with no parsed verdict (share None) are left out and
    counted in `unjudged`.

    No expected calibration error: on these mirrored rows a judge that always answers "A" gives
    every pair the share 0.5 and would be perfectly calibrated (ECE 0). Reported instead is the
    Brier skill score against that uninformed forecast, brier_skill = 1 - Brier / 0.25 (Murphy
    1973): 0 for any judge whose verdicts ignore the answers (always "A", always "B", a coin), 1
    for one that always prefers the chosen answer, negative for one that prefers the rejected.

    Keys: n (pairs used), unjudged, bins (kept for the old reports' shape), reason (None unless
    fewer than 10 pairs), brier (mean squared error against y, sklearn brier_score_loss),
    brier_skill, mean_share (mean probability given to the chosen answer); ece and reliability
    are always None (see above).
    """
    if int(bins) != bins or bins < 1:
        raise ValueError("bins must be a positive integer")
    used = [float(s) for s in shares if s is not None]
    if any(not 0 <= s <= 1 for s in used):
        raise ValueError("verdict shares must lie in [0, 1]")
    report: dict[str, Any] = {"n": len(used), "unjudged": len(shares) - len(used), "bins": int(bins),
                              "reason": None, "ece": None, "brier": None, "brier_skill": None, "mean_share": None,
                              "reliability": None}
    if len(used) < MIN_PAIRS:
        report["reason"] = f"need at least {MIN_PAIRS} pairs with a parsed verdict, got {len(used)}"
        return report
    share = np.asarray(used)
    p = np.concatenate([share, 1 - share])
    y = np.concatenate([np.ones(share.size), np.zeros(share.size)])
    brier = float(brier_score_loss(y, p))
    report.update(brier=_num(brier), brier_skill=_num(1 - brier / UNINFORMED_BRIER), mean_share=_num(share.mean()))
    return report
