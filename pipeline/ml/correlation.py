"""Does benchmark accuracy predict downstream outcome? Pure functions over plain data.

The benchmark is worth something only if the reward models (RMs) it ranks high also do well
downstream (Best-of-N, PPO; outcome = a judge's rubric score). This module relates the two:

- `correlate`: Spearman rho, Kendall tau-b, weighted Kendall tau, Pearson r, NDCG (raw and
  shifted gains, optional @k) and extrapolated RBO between benchmark scores and outcomes over
  RMs, with scipy's p-values and percentile bootstrap CIs over RMs (`definitions` says what
  each is).
- `ndcg`: NDCG of the ranking a benchmark induces, with the downstream outcome as gain.
- `rbo`: extrapolated rank-biased overlap of two rankings.
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
from sklearn.metrics import brier_score_loss, ndcg_score
from sklearn.model_selection import KFold

from pipeline.ml.metrics import bootstrap_over_items

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
    min-max rescaling): use it when outcomes can be negative. Discount 1 / log2(position + 1);
    tied predictions share their group's mean gain (sklearn's default, McSherry & Najork 2008).

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


def _ranking(values: np.ndarray, labels: Sequence[str]) -> list[str]:
    """Labels ordered by value, highest first; ties broken by label so the order is reproducible."""
    return [labels[i] for i in sorted(range(len(labels)), key=lambda i: (-values[i], str(labels[i])))]


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
    """`sklearn.metrics.ndcg_score([true_row], [pred_row], k=k)` per row (tied predictions share
    their group's mean discount, sklearn's ignore_ties=False); NaN where a gain is negative
    (sklearn refuses those: see ndcg_shifted) or every gain is 0 (sklearn would say 0; every
    ordering is equally good, so NDCG is undefined). Clipped to [0, 1] against rounding
    (sklearn can give 1 + 2e-16)."""
    out = np.full(pred.shape[0], np.nan)
    for i, (p_row, t_row) in enumerate(zip(pred, true)):
        if t_row.min() >= 0 and t_row.any():
            out[i] = ndcg_score(t_row[None], p_row[None], k=k)
    return np.clip(out, 0.0, 1.0)


def _metric_rows(x: np.ndarray, y: np.ndarray, labels: np.ndarray, *, ndcg_k: int | None,
                 rbo_p: float) -> dict[str, np.ndarray]:
    """Every metric of benchmark scores x against outcomes y, one value per row (NaN where undefined)."""
    out = {"spearman": _spearman_rows(x, y), "kendall": _kendall_rows(x, y), "pearson": _pearson_rows(x, y)}
    constant = (np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)
    out["weighted_tau"] = np.array([np.nan if c else _quiet(stats.weightedtau, a, b).statistic
                                    for a, b, c in zip(x, y, constant)])
    out["ndcg"] = _ndcg_rows(x, y, ndcg_k)  # NaN where an outcome is negative
    out["ndcg_shifted"] = _ndcg_rows(x, y - y.min(axis=1, keepdims=True), ndcg_k)
    out["rbo"] = np.array([rbo(_ranking(a, names), _ranking(b, names), p=rbo_p)
                           for a, b, names in zip(x, y, labels)])
    return out


# --------------------------------------------------------------------------------------------
# correlate


def definitions(*, ndcg_k: int | None = None, rbo_p: float = RBO_P) -> dict[str, str]:
    """What each metric of `correlate` is, in one line each (shown by the API and the README)."""
    cut = f"@{ndcg_k}" if ndcg_k else ""
    return {
        "spearman": "Spearman rho of accuracy and outcome over RMs (scipy.stats.spearmanr), p-value two-sided",
        "kendall": "Kendall tau-b of accuracy and outcome (scipy.stats.kendalltau), p-value two-sided",
        "weighted_tau": "weighted Kendall tau, hyperbolic weights on the top ranks "
                        "(scipy.stats.weightedtau(accuracy, outcome), its defaults)",
        "pearson": "Pearson r of accuracy and outcome (scipy.stats.pearsonr), p-value two-sided",
        "ndcg": f"NDCG{cut} of the accuracy ranking with the raw outcome as gain "
                "(sklearn.metrics.ndcg_score([outcome], [accuracy])); null if an outcome is negative",
        "ndcg_shifted": f"NDCG{cut} with gain = outcome - min outcome (equals min-max rescaled gains)",
        "rbo": f"extrapolated rank-biased overlap (Webber et al. 2010, eq. 23) of the accuracy and outcome "
               f"rankings, persistence p = {rbo_p}",
        "ci": "percentile bootstrap over RMs (scipy.stats.bootstrap, RMs resampled with replacement, the same "
              f"resamples for every metric); none with fewer than {MIN_RMS_FOR_CI} RMs",
    }


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
      one entry per name in METRICS (see `definitions`), each {value, ci_low, ci_high,
        skipped_resamples, reason}, plus p_value and p_display ("< 1e-16" below the floor)
        for spearman, kendall and pearson (scipy's two-sided p-values).
      The CI is scipy.stats.bootstrap's percentile interval over RMs resampled with
      replacement, `resamples` resamples drawn with numpy's default_rng(seed) and shared by all
      metrics; a resample on which a metric is undefined (it drew one RM n times, so an input is
      constant) is skipped and counted in skipped_resamples, the CI taken over the rest.
      A metric undefined on the full data is None with a reason.
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
                              "ndcg_k": ndcg_k, "rbo_p": float(rbo_p), "reason": None, "warning": None}
    empty = {"value": None, "ci_low": None, "ci_high": None, "skipped_resamples": None, "reason": None}
    if n < MIN_RMS:
        reason = f"need at least {MIN_RMS} RMs with both a benchmark score and an outcome, got {n}"
        report["reason"] = reason
        for name in METRICS:
            report[name] = {**empty, "reason": reason}
            if name in WITH_P_VALUE:
                report[name].update(p_value=None, p_display=None)
        return report

    labels = [str(rm) for rm in common]
    x = np.array([float(benchmark_scores[rm]) for rm in common])
    y = np.array([float(outcomes[rm]) for rm in common])
    values = {name: _num(row[0]) for name, row in _metric_rows(x[None], y[None], np.array([labels]),
                                                               ndcg_k=ndcg_k, rbo_p=rbo_p).items()}
    boot = None
    if n < MIN_RMS_FOR_CI:
        report["warning"] = (f"only {n} RMs: values are shown but no confidence intervals (they need at least "
                             f"{MIN_RMS_FOR_CI}); a correlation over so few RMs is weak evidence")
    else:
        boot = _bootstrap(x, y, labels, resamples=int(resamples), seed=seed, confidence=confidence,
                          ndcg_k=ndcg_k, rbo_p=rbo_p)
    constant = "undefined: benchmark scores or outcomes are constant across RMs"
    for name in METRICS:
        entry = {**empty, "value": values[name]}
        if name in WITH_P_VALUE:
            p_value = None if values[name] is None else _num(
                _quiet({"spearman": stats.spearmanr, "kendall": stats.kendalltau,
                        "pearson": stats.pearsonr}[name], x, y).pvalue)
            entry.update(p_value=p_value, p_display=p_display(p_value))
        if values[name] is None:
            entry["reason"] = (ndcg_reason(x, y, k=ndcg_k, shifted=name == "ndcg_shifted")
                               if name.startswith("ndcg") else constant)
        elif boot is not None:
            entry["ci_low"], entry["ci_high"], entry["skipped_resamples"] = boot[name]
        report[name] = entry
    return report


def _bootstrap(x: np.ndarray, y: np.ndarray, labels: Sequence[str], *, resamples: int, seed: int,
               confidence: float, ndcg_k: int | None, rbo_p: float) -> dict[str, tuple]:
    """{metric: (ci_low, ci_high, skipped resamples)}: `metrics.bootstrap_over_items` over RMs
    (scipy.stats.bootstrap's percentile interval, RM indices resampled with replacement; one
    resample = the same RMs for every metric); resamples where a metric is NaN are skipped."""
    def statistic(idx: np.ndarray) -> np.ndarray:
        # An RM drawn twice is two entries; RBO needs distinct items, so each copy gets its own label.
        names = np.array([[f"{labels[i]}#{j}" for j, i in enumerate(row)] for row in idx])
        rows = _metric_rows(x[idx], y[idx], names, ndcg_k=ndcg_k, rbo_p=rbo_p)
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
            result = _quiet(stats.kendalltau, ra, rb)
            tau, p_value = _num(result.statistic), _num(result.pvalue)
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
                   "brier": _num(brier_score_loss(y, p)), "reliability": table,
                   "raw": {"ece": _num(raw_ece), "brier": _num(brier_score_loss(y, raw_p)),
                           "reliability": raw_table}})
    return report


# --------------------------------------------------------------------------------------------
# Best-of-k scaling curve


def verdict_calibration(shares: Sequence[float | None], *, bins: int = 10) -> dict[str, Any]:
    """Calibration of a generative judge from its own probabilities: per pair, the share of its
    verdicts that prefer the chosen answer (pairwise judges: over both orders; P-GenRM: over its
    m chains and the neighbours'). No fitting: the shares are read as probabilities as they are.

    Every pair's truth is "chosen", so each pair gives the rows (share, y=1) and (1 - share,
    y=0), as in `calibration`. Pairs with no parsed verdict (share None) are left out and
    counted in `unjudged`.

    Keys: n (pairs used), unjudged, bins, reason (None unless fewer than 10 pairs),
      ece (equal-width bins, |mean predicted - observed| weighted by the bin's share of rows),
      brier (mean squared error against y, sklearn brier_score_loss), mean_share (mean probability given to the chosen
      answer), reliability [{bin_low, bin_high, count, mean_predicted, observed_frequency}].
    """
    if int(bins) != bins or bins < 1:
        raise ValueError("bins must be a positive integer")
    used = [float(s) for s in shares if s is not None]
    if any(not 0 <= s <= 1 for s in used):
        raise ValueError("verdict shares must lie in [0, 1]")
    report: dict[str, Any] = {"n": len(used), "unjudged": len(shares) - len(used), "bins": int(bins),
                              "reason": None, "ece": None, "brier": None, "mean_share": None, "reliability": None}
    if len(used) < MIN_PAIRS:
        report["reason"] = f"need at least {MIN_PAIRS} pairs with a parsed verdict, got {len(used)}"
        return report
    share = np.asarray(used)
    p = np.concatenate([share, 1 - share])
    y = np.concatenate([np.ones(share.size), np.zeros(share.size)])
    ece, table = _reliability(p, y, int(bins))
    report.update(ece=_num(ece), brier=_num(brier_score_loss(y, p)), mean_share=_num(share.mean()),
                  reliability=table)
    return report
