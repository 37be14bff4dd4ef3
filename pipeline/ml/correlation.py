"""Does benchmark accuracy predict downstream outcome? Pure functions over plain data.

The benchmark is worth something only if the reward models (RMs) it ranks high also do well
downstream (Best-of-N, PPO; outcome = a judge's rubric score). This module relates the two:

- `correlate`: Spearman rho, Kendall tau-b and Pearson r between benchmark scores and outcomes
  over RMs, with scipy's p-values, percentile bootstrap CIs over RMs, and NDCG.
- `ndcg`: NDCG of the ranking a benchmark induces, with the downstream outcome as gain.
- `rank_stability`: do different policies (BoN k, PPO) rank the RMs the same way?
- `calibration`: how well an RM's score difference on a pair predicts the preference
  (`cross_fit_probabilities` gives the cross-fitted probabilities it scores).

Higher is better everywhere: for benchmark scores (accuracy) and for outcomes. Every output is
JSON-serialisable: plain floats, ints, strings, lists and dicts, with None where a value is
undefined (never NaN). Bootstraps use numpy's default_rng(seed), so a report is reproducible.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

RESAMPLES = 1000
MIN_RMS = 3  # below this a correlation over RMs says nothing (and Pearson's p-value is undefined)
MIN_PAIRS = 10
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


def _interval(samples: np.ndarray, confidence: float) -> tuple[float | None, float | None]:
    if samples.size == 0:
        return None, None
    tail = (1 - confidence) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return _num(low), _num(high)


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
# batched correlation statistics (rows = bootstrap resamples); NaN where undefined


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


_STATISTICS = {
    "spearman": (stats.spearmanr, _spearman_rows),
    "kendall": (stats.kendalltau, _kendall_rows),
    "pearson": (stats.pearsonr, _pearson_rows),
}


def _scipy_point(function, x: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        result = function(x, y)
    return _num(result.statistic), _num(result.pvalue)


# --------------------------------------------------------------------------------------------
# correlate


def correlate(benchmark_scores: Mapping[str, float], outcomes: Mapping[str, float], *,
              resamples: int = RESAMPLES, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Relate the benchmark's scores of RMs to their downstream outcomes.

    Uses the RMs present in both mappings with finite values; the others are named in
    `dropped` (RM -> why). With fewer than 3 such RMs every statistic is None and `reason` says
    why.

    Returns a dict with keys:
      n, rms (sorted names used), dropped {rm: reason}, resamples, seed, confidence, reason
        (None when the statistics were computed),
      spearman, kendall (tau-b), pearson: each {value, p_value, ci_low, ci_high,
        skipped_resamples, reason}. value/p_value come from scipy.stats.spearmanr / kendalltau
        / pearsonr. The CI is a percentile bootstrap over RMs: `resamples` resamples of the RMs
        drawn with replacement (the same resamples for all three statistics); a resample on
        which a statistic is undefined (e.g. it drew one RM n times, so an input is constant)
        is skipped and counted in skipped_resamples, and the CI is taken over the rest.
        A statistic undefined on the full data (constant scores or outcomes) is None with a
        reason.
      ndcg: {value, reason}: `ndcg(benchmark_scores, outcomes)` over the same RMs, no cutoff.
        No bootstrap CI: a resample with duplicated RMs is not a ranking anyone would make.
    """
    _check_resamples(resamples)
    _check_confidence(confidence)
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
                              "reason": None}
    if n < MIN_RMS:
        reason = f"need at least {MIN_RMS} RMs with both a benchmark score and an outcome, got {n}"
        report["reason"] = reason
        for name in _STATISTICS:
            report[name] = {"value": None, "p_value": None, "ci_low": None, "ci_high": None,
                            "skipped_resamples": None, "reason": reason}
        report["ndcg"] = {"value": None, "reason": reason}
        return report

    x = np.array([float(benchmark_scores[rm]) for rm in common])
    y = np.array([float(outcomes[rm]) for rm in common])
    boot = _bootstrap_correlations(x, y, resamples=int(resamples), seed=seed)
    for name, (function, _) in _STATISTICS.items():
        value, p_value = _scipy_point(function, x, y)
        samples = boot[name]
        valid = samples[~np.isnan(samples)]
        entry = {"value": value, "p_value": p_value, "ci_low": None, "ci_high": None,
                 "skipped_resamples": int(samples.size - valid.size), "reason": None}
        if value is None:
            entry["reason"] = "undefined: benchmark scores or outcomes are constant across RMs"
        else:
            entry["ci_low"], entry["ci_high"] = _interval(valid, confidence)
        report[name] = entry
    value = ndcg(x.tolist(), y.tolist())
    report["ndcg"] = {"value": value,
                      "reason": None if value is not None else "undefined: outcomes are equal across RMs"}
    return report


def _bootstrap_correlations(x: np.ndarray, y: np.ndarray, *, resamples: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = x.size
    out = {name: np.empty(resamples) for name in _STATISTICS}
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        idx = rng.integers(0, n, size=(size, n))
        for name, (_, batched) in _STATISTICS.items():
            out[name][start:start + size] = batched(x[idx], y[idx])
    return out


# --------------------------------------------------------------------------------------------
# NDCG


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


def _discounts(n: int, k: int | None) -> np.ndarray:
    discount = 1.0 / np.log2(np.arange(n) + 2.0)
    if k is not None:
        discount[k:] = 0.0
    return discount


def ndcg(predicted_scores: Mapping[str, float] | Sequence[float],
         true_relevance: Mapping[str, float] | Sequence[float], *, k: int | None = None) -> float | None:
    """NDCG@k of ranking RMs by `predicted_scores` (benchmark score, higher first).

    Gain: the downstream outcome min-max scaled to [0, 1] over the RMs given, i.e.
    (outcome - min) / (max - min). Outcomes can be negative (reward deltas, z-scores) and
    NDCG is not shift-invariant, so they are scaled first; as a consequence the worst RM has
    gain 0 and its position does not matter, and relevances that are already 0..1 with a 0 and
    a 1 among them are used as they are. Discount 1 / log2(position + 1), positions from 1;
    normalised by the DCG of the ideal (outcome-sorted) ordering, both cut at the top k.

    Ties in predicted scores are averaged: a tied group's positions share the group's mean
    gain (McSherry & Najork 2008), so the value does not depend on input order. This is what
    sklearn.metrics.ndcg_score does by default, so the two agree on tied data too, and on
    untied data both are plain NDCG.

    Accepts two mappings with the same keys or two sequences of equal length. Returns None
    when undefined: no RMs, or all outcomes equal (every ordering is then equally good).
    """
    pred, true = _aligned(predicted_scores, true_relevance)
    if k is not None and (int(k) != k or k < 1):
        raise ValueError("k must be a positive integer or None")
    n = pred.size
    if n == 0:
        return None
    span = true.max() - true.min()
    if span == 0:
        return None
    gain = (true - true.min()) / span
    discount = _discounts(n, None if k is None else int(k))
    ideal = float(np.sort(gain)[::-1] @ discount)

    order = np.argsort(-pred, kind="stable")
    sorted_pred, sorted_gain = pred[order], gain[order]
    dcg = 0.0
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and sorted_pred[stop] == sorted_pred[start]:
            stop += 1
        dcg += sorted_gain[start:stop].mean() * discount[start:stop].sum()
        start = stop
    return _num(dcg / ideal)


# --------------------------------------------------------------------------------------------
# rank stability across policies


def rank_stability(outcomes_by_policy: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """How consistently different policies (e.g. BoN k=4, BoN k=16, PPO) rank the RMs.

    Uses the RMs with a finite outcome under every policy; the others are named in `dropped`.
    Ranks: 1 = best (highest outcome), ties get their average rank.

    Returns a dict with keys:
      policies (in the order given), rms (sorted), n (RMs used), dropped {rm: reason},
      ranks {policy: {rm: rank}},
      pairwise: [{a, b, tau, p_value}] for every pair of policies, Kendall tau-b
        (scipy.stats.kendalltau) between the two rankings; tau None when undefined
        (fewer than 2 RMs, or a policy gives every RM the same outcome),
      mean_tau: mean of the defined pairwise taus (None if there are none),
      rank_range {rm: {min, max, range}}: best and worst rank an RM gets across policies,
      reason: None, or why nothing could be compared (fewer than 2 policies or 2 RMs).
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
        tau = p_value = None
        if len(common) >= 2:
            tau, p_value = _scipy_point(stats.kendalltau, ra, rb)
            if tau is None:
                p_value = None
        pairwise.append({"a": a, "b": b, "tau": tau, "p_value": p_value})
    taus = [entry["tau"] for entry in pairwise if entry["tau"] is not None]

    rank_range = {}
    for column, rm in enumerate(common):
        low = min(float(rank[column]) for rank in rank_arrays)
        high = max(float(rank[column]) for rank in rank_arrays)
        rank_range[str(rm)] = {"min": low, "max": high, "range": high - low}

    reason = None
    if len(policies) < 2:
        reason = f"need at least 2 policies to compare, got {len(policies)}"
    elif len(common) < 2:
        reason = f"need at least 2 RMs with an outcome under every policy, got {len(common)}"
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
                              "slope": None, "intercept": None, "ece": None, "brier": None,
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
                   "brier": _num(np.mean((p - y) ** 2)), "reliability": table,
                   "raw": {"ece": _num(raw_ece), "brier": _num(np.mean((raw_p - y) ** 2)),
                           "reliability": raw_table}})
    return report


# --------------------------------------------------------------------------------------------
# Best-of-k scaling curve
