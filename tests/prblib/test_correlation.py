"""Benchmark-vs-downstream statistics against scipy, sklearn and hand computations."""

import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss, ndcg_score
from sklearn.model_selection import KFold

from prblib.stats.correlation import (METRICS, calibration, correlate, cross_fit_probabilities, definitions,
                                     ndcg, p_display, rank_stability, rbo)

# Benchmark accuracy and a downstream outcome for eight RMs; rm2 and rm4 tie on accuracy.
BENCHMARK = {"rm0": 0.61, "rm1": 0.64, "rm2": 0.66, "rm3": 0.70, "rm4": 0.66, "rm5": 0.75, "rm6": 0.58,
             "rm7": 0.69}
OUTCOME = {"rm0": 3.1, "rm1": 3.0, "rm2": 3.4, "rm3": 3.9, "rm4": 3.6, "rm5": 4.2, "rm6": 2.8, "rm7": 3.5}


def exact_null(x, y):
    """Spearman, Kendall and Pearson of every ordering of x against y, by scipy one at a time."""
    import itertools

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    orders = np.array(list(itertools.permutations(range(len(x)))))
    xs = x[orders]
    ranks_x, ranks_y = stats.rankdata(xs, axis=1), stats.rankdata(y)
    spearman = np.array([np.corrcoef(r, ranks_y)[0, 1] for r in ranks_x])
    pearson = np.array([np.corrcoef(r, y)[0, 1] for r in xs])
    kendall = np.array([stats.kendalltau(r, y).statistic for r in xs]) if len(x) <= 7 else None
    if kendall is None:  # 40,320 calls of kendalltau are slow: tau-b from the pairs' signs, numpy
        i, j = np.triu_indices(len(x), 1)
        sx, sy = np.sign(xs[:, i] - xs[:, j]), np.sign(y[i] - y[j])
        kendall = (sx * sy).sum(1) / np.sqrt((sx != 0).sum(1) * float((sy != 0).sum()))
    return {"spearman": spearman, "kendall": kendall, "pearson": pearson}


def fractional_rbo(x, y, p=0.9):
    """RBO with the fractional-prefix tie rule, by plain loops: item i of a tie group of t after
    a items is a fraction clip((d - a) / t, 0, 1) of the top d; X_d sums the smaller fractions."""
    n = len(x)

    def member(values, i, d):
        ahead = sum(v > values[i] for v in values)
        tied = sum(v == values[i] for v in values)
        return min(1.0, max(0.0, (d - ahead) / tied))

    overlaps = [sum(min(member(x, i, d), member(y, i, d)) for i in range(n)) for d in range(1, n + 1)]
    return overlaps[-1] / n * p ** n + (1 - p) / p * sum(X / d * p ** d for d, X in enumerate(overlaps, start=1))


def brute_force_rbo_ci(x, y, *, seed, resamples=1000):
    x, y = np.asarray(x), np.asarray(y)

    def statistic(idx):
        idx = idx.astype(int)
        return fractional_rbo(list(x[idx]), list(y[idx]))

    dist = stats.bootstrap((np.arange(len(x)),), statistic, vectorized=False, n_resamples=resamples, batch=100,
                           method="percentile", rng=np.random.default_rng(seed)).bootstrap_distribution
    return tuple(np.quantile(dist, [0.025, 0.975]))


def dumps(report):
    return json.dumps(report, allow_nan=False)


def minmax(values):
    values = np.asarray(values, dtype=float)
    return (values - values.min()) / (values.max() - values.min())


# --- correlate -------------------------------------------------------------------------------

SCIPY = {"spearman": stats.spearmanr, "kendall": stats.kendalltau, "pearson": stats.pearsonr}


def test_correlate_matches_scipy_and_sklearn_for_every_metric():
    report = correlate(BENCHMARK, OUTCOME)
    rms = sorted(BENCHMARK)
    x, y = [BENCHMARK[rm] for rm in rms], [OUTCOME[rm] for rm in rms]
    assert report["n"] == 8 and report["rms"] == rms and report["dropped"] == {} and report["reason"] is None
    assert report["warning"] is None and report["rbo_p"] == 0.9 and report["ndcg_k"] is None
    # p: exact over the 8! orderings, counted here with scipy's own statistics on every ordering.
    null = exact_null(x, y)
    for name, function in SCIPY.items():
        expected = function(x, y)
        assert report[name]["value"] == pytest.approx(expected.statistic, abs=1e-12)
        observed, dist = expected.statistic, null[name]
        two_sided = min(1.0, 2 * min(np.mean(dist >= observed - 1e-12), np.mean(dist <= observed + 1e-12)))
        assert report[name]["p_value"] == pytest.approx(two_sided, rel=1e-9)
        assert report[name]["p_method"] == "exact, all 40320 orderings"
        assert report[name]["reason"] is None
    assert report["weighted_tau"]["value"] == pytest.approx(stats.weightedtau(x, y).statistic, abs=1e-12)
    assert report["ndcg"]["value"] == pytest.approx(ndcg_score([y], [x]))  # raw outcomes as gains
    assert report["ndcg_shifted"]["value"] == pytest.approx(ndcg_score([minmax(y)], [x]))
    # rm2 and rm4 tie on accuracy: RBO is the mean over both orders of the tie (never by name);
    # outcome ranking: rm5 rm3 rm4 rm7 rm2 rm0 rm1 rm6.
    by_acc = ["rm5", "rm3", "rm7", "rm2", "rm4", "rm1", "rm0", "rm6"]
    swapped = ["rm5", "rm3", "rm7", "rm4", "rm2", "rm1", "rm0", "rm6"]
    by_out = ["rm5", "rm3", "rm4", "rm7", "rm2", "rm0", "rm1", "rm6"]
    assert report["rbo"]["value"] == pytest.approx((rbo(by_acc, by_out) + rbo(swapped, by_out)) / 2)


def test_every_metric_has_a_bootstrap_ci_reproducible_with_the_seed():
    report = correlate(BENCHMARK, OUTCOME, seed=7)
    for name in METRICS:
        entry = report[name]
        assert entry["ci_low"] <= entry["value"] + 1e-12 and entry["value"] <= entry["ci_high"] + 1e-12, name
        assert entry["skipped_resamples"] >= 0
    assert correlate(BENCHMARK, OUTCOME, seed=7) == report
    assert correlate(BENCHMARK, OUTCOME, seed=8)["pearson"]["ci_low"] != report["pearson"]["ci_low"]
    narrow = correlate(BENCHMARK, OUTCOME, seed=7, confidence=0.5)
    assert narrow["pearson"]["ci_high"] - narrow["pearson"]["ci_low"] < (
        report["pearson"]["ci_high"] - report["pearson"]["ci_low"])


def test_the_ci_is_scipy_bootstrap_over_rms_skipping_undefined_resamples():
    # Five RMs, two tied on accuracy and two on outcome: some resamples make an input constant.
    bench = {"a": 0.5, "b": 0.5, "c": 0.7, "d": 0.8, "e": 0.6}
    outcome = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 3.0, "e": 0.5}
    report = correlate(bench, outcome, resamples=200, seed=3)
    x, y = np.array([bench[k] for k in "abcde"]), np.array([outcome[k] for k in "abcde"])

    def reference(idx):  # scipy's own functions, one resample at a time
        xs, ys = x[idx.astype(int)], y[idx.astype(int)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.array([f(xs, ys).statistic for f in SCIPY.values()] +
                            [stats.weightedtau(xs, ys).statistic, ndcg_score([ys], [xs])])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns that some resamples are degenerate (NaN)
        dist = stats.bootstrap((np.arange(5),), reference, vectorized=False, n_resamples=200, batch=100,
                               method="percentile", rng=np.random.default_rng(3)).bootstrap_distribution
    for row, name in zip(dist, [*SCIPY, "weighted_tau", "ndcg"]):
        valid = row[~np.isnan(row)]
        assert report[name]["skipped_resamples"] == 200 - valid.size
        low, high = np.quantile(valid, [0.025, 0.975])
        assert (report[name]["ci_low"], report[name]["ci_high"]) == (pytest.approx(low), pytest.approx(high)), name
    assert report["spearman"]["skipped_resamples"] > 0
    dumps(report)


def test_fewer_than_five_rms_show_values_with_a_warning_and_no_ci():
    report = correlate({"a": 0.5, "b": 0.6, "c": 0.7, "d": 0.8}, {"a": 1.0, "b": 1.2, "c": 1.1, "d": 1.9})
    assert report["n"] == 4 and "only 4 RMs" in report["warning"] and report["reason"] is None
    assert report["spearman"]["value"] == pytest.approx(0.8)
    for name in METRICS:
        assert report[name]["value"] is not None
        assert report[name]["ci_low"] is None and report[name]["ci_high"] is None, name
    dumps(report)


def test_p_values_below_double_precision_are_shown_as_below_1e_16_not_0():
    # 40 RMs: Monte Carlo permutation, 9999 orderings; none reaches the perfect order, so each
    # tail is (0 + 1) / (9999 + 1) and the two-sided p twice that.
    x = {f"rm{i}": float(i) for i in range(40)}
    report = correlate(x, {rm: 2 * v for rm, v in x.items()}, resamples=20)
    assert report["spearman"]["p_value"] == pytest.approx(2 / 10000)
    assert report["spearman"]["p_method"] == "permutation, 9999 random orderings (seed 0)"
    # From 101 RMs on, scipy's asymptotic p-value, which underflows to 0: shown "< 1e-16".
    x = {f"rm{i}": float(i) for i in range(120)}
    report = correlate(x, {rm: 2 * v for rm, v in x.items()}, resamples=20)
    assert report["spearman"]["p_value"] == 0.0 and report["spearman"]["p_display"] == "< 1e-16"
    assert report["pearson"]["p_display"] == "< 1e-16" and report["pearson"]["p_method"] == "asymptotic"
    assert p_display(0.000123) == "0.00012" and p_display(None) is None


def test_rms_missing_from_either_side_or_without_a_finite_value_are_dropped_and_named():
    bench = dict(BENCHMARK, only_bench=0.9, nan_rm=float("nan"))
    outcome = dict(OUTCOME, only_outcome=4.0, nan_rm=3.0)
    report = correlate(bench, outcome)
    assert report["dropped"] == {"only_bench": "no downstream outcome", "only_outcome": "no benchmark score",
                                 "nan_rm": "missing or non-finite value"}
    assert report["n"] == 8 and report["spearman"] == correlate(BENCHMARK, OUTCOME)["spearman"]
    dumps(report)


def test_fewer_than_three_common_rms_give_no_statistics_and_a_reason():
    report = correlate({"a": 0.6, "b": 0.7, "c": 0.8}, {"a": 1.0, "b": 2.0})
    assert report["n"] == 2 and report["dropped"] == {"c": "no downstream outcome"}
    assert "at least 3" in report["reason"]
    for name in METRICS:
        assert report[name]["value"] is None and report[name]["ci_low"] is None
        assert report[name]["reason"] == report["reason"]
    assert report["spearman"]["p_value"] is None and report["spearman"]["p_display"] is None
    dumps(report)
    dumps(correlate({}, {}))


def test_constant_benchmark_scores_leave_correlations_undefined_not_nan():
    report = correlate({"a": 0.7, "b": 0.7, "c": 0.7}, {"a": 1.0, "b": 2.0, "c": 3.0})
    for name in ("spearman", "kendall", "pearson", "weighted_tau"):
        assert report[name]["value"] is None and report[name]["ci_low"] is None
        assert "constant" in report[name]["reason"]
    assert report["ndcg"]["value"] == pytest.approx(ndcg_score([[1, 2, 3]], [[0.7, 0.7, 0.7]]))
    dumps(report)


def test_negative_outcomes_leave_raw_ndcg_null_with_a_reason_and_shifted_ndcg_defined():
    report = correlate(BENCHMARK, {rm: v - 3.5 for rm, v in OUTCOME.items()})
    assert report["ndcg"]["value"] is None and "negative" in report["ndcg"]["reason"]
    assert report["ndcg_shifted"]["value"] == pytest.approx(correlate(BENCHMARK, OUTCOME)["ndcg_shifted"]["value"])


def test_ndcg_at_k_and_rbo_persistence_are_options():
    rms = sorted(BENCHMARK)
    x, y = [BENCHMARK[rm] for rm in rms], [OUTCOME[rm] for rm in rms]
    report = correlate(BENCHMARK, OUTCOME, ndcg_k=3, rbo_p=0.5)
    assert report["ndcg"]["value"] == pytest.approx(ndcg_score([y], [x], k=3))
    assert report["ndcg_k"] == 3 and report["rbo_p"] == 0.5
    assert report["rbo"]["value"] != correlate(BENCHMARK, OUTCOME)["rbo"]["value"]
    assert set(definitions()) == {*METRICS, "ci", "p", "chance"} and "p = 0.5" in definitions(rbo_p=0.5)["rbo"]


def test_correlate_rejects_a_bad_confidence_resample_count_cutoff_or_persistence():
    for kwargs in ({"confidence": 1.0}, {"resamples": 0}, {"ndcg_k": 0}, {"rbo_p": 1.0}):
        with pytest.raises(ValueError):
            correlate(BENCHMARK, OUTCOME, **kwargs)


# --- rbo -------------------------------------------------------------------------------------

# Values from a published reference implementation: the `rbo` package 0.1.3 on PyPI
# (github.com/changyaochen/rbo), RankingSimilarity(S, T).rbo(p=p, ext=True), i.e. Webber et al.
# 2010 eq. 23; computed outside this project and written here.
@pytest.mark.parametrize("first,second,p,expected", [
    ("abcde", "abcde", 0.9, 1.0),
    ("abcde", "edcba", 0.9, 0.7377750000000001),
    ("abcde", "bacde", 0.9, 0.9),
    ("abcdefgh", "acbdfehg", 0.9, 0.9342859857142858),
    ("abcdefgh", "hgfedcba", 0.5, 0.037425595238095244),
    ("abcdefg", "bcadgef", 0.8, 0.6926933333333334),
])
def test_rbo_equals_the_reference_implementation(first, second, p, expected):
    assert rbo(list(first), list(second), p=p) == pytest.approx(expected, abs=1e-12)


def test_rbo_refuses_rankings_of_different_items_or_a_bad_p():
    with pytest.raises(ValueError):
        rbo(["a", "b"], ["a", "c"])
    with pytest.raises(ValueError):
        rbo(["a", "a"], ["a", "a"])
    with pytest.raises(ValueError):
        rbo(["a"], ["a"], p=1.0)


# --- ndcg ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [None, 1, 3, 20])
def test_ndcg_equals_sklearn_with_raw_gains_and_shifted_gains(seed, k):
    rng = np.random.default_rng(seed)
    predicted, outcome = rng.normal(size=12), rng.random(size=12) * 2
    assert ndcg(predicted, outcome, k=k) == pytest.approx(ndcg_score([outcome], [predicted], k=k))
    signed = outcome * 3 - 1
    signed[0] = -0.5  # a negative outcome
    assert ndcg(predicted, signed, k=k) is None
    assert ndcg(predicted, signed, k=k, shifted=True) == pytest.approx(ndcg_score([minmax(signed)], [predicted], k=k))


def test_a_reversed_ranking_scores_higher_with_raw_gains_than_rescaled_ones():
    # Outcomes on the judge's 0-2 scale; the benchmark ranks the five RMs exactly backwards.
    accuracy, outcome = [0.6, 0.7, 0.8, 0.9, 1.0], [1.62, 1.55, 1.31, 1.35, 1.02]
    assert ndcg(accuracy, outcome) == pytest.approx(0.902944, abs=1e-6)
    assert ndcg(accuracy, outcome, shifted=True) == pytest.approx(0.664530, abs=1e-6)


def test_ndcg_of_a_perfect_ranking_is_one_whatever_the_monotone_transform():
    outcome = {"a": 0.0, "b": 0.5, "c": 1.0, "d": 3.0}
    assert ndcg({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}, outcome) == pytest.approx(1.0)
    assert ndcg([1, 2, 3, 4], [5, 1, 7, 2]) == pytest.approx(ndcg([10, 200, 3000, 40000], [5, 1, 7, 2]))


def test_ndcg_averages_tied_predictions_like_sklearn_whatever_the_input_order():
    predicted, outcome = [0.7, 0.7, 0.5, 0.9, 0.5], [1.0, 3.0, 2.0, 0.0, 4.0]
    expected = ndcg_score([outcome], [predicted])
    assert ndcg(predicted, outcome) == pytest.approx(expected)
    assert ndcg(predicted[::-1], outcome[::-1]) == pytest.approx(expected)
    assert ndcg(predicted, outcome, k=2) == pytest.approx(ndcg_score([outcome], [predicted], k=2))


def test_ndcg_is_undefined_when_every_gain_is_0_and_rejects_mismatched_input():
    assert ndcg([0.1, 0.2, 0.3], [0.0, 0.0, 0.0]) is None
    assert ndcg([0.1, 0.2, 0.3], [2.0, 2.0, 2.0], shifted=True) is None
    assert ndcg([0.1, 0.2, 0.3], [2.0, 2.0, 2.0]) == pytest.approx(1.0)  # every ordering is perfect
    assert ndcg([], []) is None
    with pytest.raises(ValueError):
        ndcg({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 2.0})
    with pytest.raises(ValueError):
        ndcg([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        ndcg([1.0, 2.0], [1.0, 2.0], k=0)


# --- rank_stability --------------------------------------------------------------------------

def test_rank_stability_on_hand_made_rankings():
    report = rank_stability({
        "bon_k4": {"r1": 4.0, "r2": 3.0, "r3": 2.0, "r4": 1.0},
        "bon_k16": {"r1": 9.0, "r2": 8.0, "r3": 7.0, "r4": 6.0, "extra": 5.0},
        "ppo": {"r1": 3.0, "r2": 3.5, "r3": 2.0, "r4": 1.0},  # r1 and r2 swap places
    })
    assert report["policies"] == ["bon_k4", "bon_k16", "ppo"] and report["rms"] == ["r1", "r2", "r3", "r4"]
    assert report["dropped"] == {"extra": "no finite outcome under bon_k4, ppo"} and report["n"] == 4
    assert report["ranks"]["ppo"] == {"r1": 2.0, "r2": 1.0, "r3": 3.0, "r4": 4.0}
    taus = {(e["a"], e["b"]): e["tau"] for e in report["pairwise"]}
    # One discordant pair out of six: (5 - 1) / 6.
    assert taus == {("bon_k4", "bon_k16"): pytest.approx(1.0), ("bon_k4", "ppo"): pytest.approx(2 / 3),
                    ("bon_k16", "ppo"): pytest.approx(2 / 3)}
    assert report["mean_tau"] == pytest.approx(7 / 9)
    assert report["rank_range"] == {"r1": {"min": 1.0, "max": 2.0, "range": 1.0},
                                    "r2": {"min": 1.0, "max": 2.0, "range": 1.0},
                                    "r3": {"min": 3.0, "max": 3.0, "range": 0.0},
                                    "r4": {"min": 4.0, "max": 4.0, "range": 0.0}}
    assert report["reason"] is None
    dumps(report)


def test_rank_stability_ties_share_a_rank_and_match_scipy_kendall():
    a, b = {"x": 1.0, "y": 1.0, "z": 2.0, "w": 0.0}, {"x": 2.0, "y": 1.0, "z": 3.0, "w": 0.5}
    report = rank_stability({"a": a, "b": b})
    assert report["ranks"]["a"] == {"w": 4.0, "x": 2.5, "y": 2.5, "z": 1.0}
    rms = report["rms"]
    expected = stats.kendalltau([a[r] for r in rms], [b[r] for r in rms])
    assert report["pairwise"][0]["tau"] == pytest.approx(expected.statistic)
    # Exact permutation p over the 4! orderings (scipy's kendalltau on each one), two-sided.
    import itertools
    ra = [report["ranks"]["a"][r] for r in rms]
    rb = [report["ranks"]["b"][r] for r in rms]
    null = np.array([stats.kendalltau([ra[i] for i in order], rb).statistic
                     for order in itertools.permutations(range(4))])
    t = expected.statistic
    p = min(1.0, 2 * min(np.mean(null >= t - 1e-12), np.mean(null <= t + 1e-12)))
    assert report["pairwise"][0]["p_value"] == pytest.approx(p)
    assert report["pairwise"][0]["p_method"] == "exact, all 24 orderings"


def test_rank_stability_with_one_policy_or_constant_outcomes_says_why():
    single = rank_stability({"ppo": {"a": 1.0, "b": 2.0}})
    assert single["pairwise"] == [] and single["mean_tau"] is None and "2 policies" in single["reason"]
    assert single["rank_range"]["a"]["range"] == 0.0
    flat = rank_stability({"p": {"a": 1.0, "b": 1.0, "c": 1.0}, "q": {"a": 1.0, "b": 2.0, "c": 3.0}})
    assert flat["pairwise"][0]["tau"] is None and flat["mean_tau"] is None
    for report in (single, flat, rank_stability({}), rank_stability({"p": {"a": 1.0}, "q": {"b": 1.0}})):
        dumps(report)


# --- calibration -----------------------------------------------------------------------------

def synthetic_diffs(n, *, truth, seed):
    """Score differences of an RM whose margin m predicts the preference with P = truth(m).

    The RM scores a pair (A, B) with margin m = score(A) - score(B); A is the better answer
    with probability truth(m), and the better answer is the benchmark's "chosen", so
    d = m when A is better and -m otherwise.
    """
    rng = np.random.default_rng(seed)
    margin = rng.normal(0.0, 2.0, size=n)
    a_better = rng.random(n) < truth(margin)
    return np.where(a_better, margin, -margin)


def test_calibration_of_a_well_calibrated_rm_has_small_ece_and_unit_slope():
    report = calibration(synthetic_diffs(4000, truth=expit, seed=0))
    assert report["n"] == 4000 and report["cv"] == 5 and report["reason"] is None
    assert report["ece"] < 0.03 and report["raw"]["ece"] < 0.03
    assert report["slope"] == pytest.approx(1.0, abs=0.1)
    assert report["intercept"] == pytest.approx(0.0, abs=1e-6)  # the two orientations are symmetric
    dumps(report)


def test_a_badly_scaled_rm_has_a_larger_ece_on_its_raw_scores_and_a_slope_off_one():
    calibrated = calibration(synthetic_diffs(4000, truth=expit, seed=1))
    # Scores four times too confident: the truth is sigmoid(m / 4).
    overconfident = calibration(synthetic_diffs(4000, truth=lambda m: expit(m / 4), seed=1))
    assert overconfident["raw"]["ece"] > 0.1 > 3 * calibrated["raw"]["ece"]
    assert overconfident["slope"] == pytest.approx(0.25, abs=0.05)
    # The logistic refit absorbs the scale, so the recalibrated probabilities stay calibrated.
    assert overconfident["ece"] < 0.03


def test_a_preference_the_logistic_link_cannot_fit_has_a_larger_cross_fitted_ece():
    calibrated = calibration(synthetic_diffs(4000, truth=expit, seed=2))
    # 75% right whatever the margin: a step, not a sigmoid.
    step = calibration(synthetic_diffs(4000, truth=lambda m: np.where(m > 0, 0.75, 0.25), seed=2))
    assert step["ece"] > 0.05 and step["ece"] > 3 * calibrated["ece"]


def test_brier_scores_equal_sklearn_on_the_same_predictions_and_ece_sums_the_table():
    diffs = synthetic_diffs(300, truth=lambda m: expit(m / 2), seed=3)
    report = calibration(diffs, bins=8, cv=4, seed=5)
    p, y = cross_fit_probabilities(diffs, cv=4, seed=5)
    assert report["brier"] == pytest.approx(brier_score_loss(y, p))
    raw_p = expit(np.concatenate([diffs, -diffs]))
    assert report["raw"]["brier"] == pytest.approx(brier_score_loss(y, raw_p))
    table = report["reliability"]
    assert len(table) == 8 and sum(row["count"] for row in table) == 600
    assert report["ece"] == pytest.approx(sum(row["count"] / 600 * abs(row["mean_predicted"] - row["observed_frequency"])
                                              for row in table if row["count"]))
    for row in table:
        if row["count"]:
            assert row["bin_low"] <= row["mean_predicted"] <= row["bin_high"]
        else:
            assert row["mean_predicted"] is None and row["observed_frequency"] is None
    assert calibration(diffs, bins=8, cv=4, seed=5) == report


def test_each_pair_is_scored_by_a_model_that_was_not_fit_on_it():
    diffs = synthetic_diffs(60, truth=expit, seed=4)
    p, y = cross_fit_probabilities(diffs, cv=3, seed=9)
    assert list(y) == [1.0] * 60 + [0.0] * 60
    for train, test in KFold(n_splits=3, shuffle=True, random_state=9).split(diffs):
        d = diffs[train]
        scale = np.sqrt(np.mean(d * d))
        model = LogisticRegression().fit(np.concatenate([d, -d])[:, None] / scale,
                                         np.concatenate([np.ones(d.size), np.zeros(d.size)]))
        expected = model.predict_proba(diffs[test][:, None] / scale)[:, 1]
        assert p[test] == pytest.approx(expected)
        assert p[60 + test] == pytest.approx(model.predict_proba(-diffs[test][:, None] / scale)[:, 1])


def test_calibration_of_degenerate_input_gives_no_values_and_a_reason():
    few = calibration([0.5] * 9)
    flat = calibration([1.0] * 50)
    assert "at least 10" in few["reason"] and "equal" in flat["reason"]
    for report in (few, flat, calibration([])):
        assert report["ece"] is None and report["brier"] is None and report["slope"] is None
        assert report["reliability"] is None and report["raw"]["ece"] is None
        dumps(report)
    with pytest.raises(ValueError):
        calibration([1.0, float("nan")] * 10)


def test_an_rm_right_on_every_pair_gets_a_finite_calibration():
    report = calibration(np.abs(synthetic_diffs(200, truth=expit, seed=6)) + 0.1)
    assert report["slope"] > 0 and math.isfinite(report["slope"]) and report["ece"] < 0.2
    dumps(report)


def test_correlation_cis_keep_the_figures_pinned_before_the_shared_bootstrap_and_sklearn_ndcg():
    bench = {f"rm{i}": v for i, v in enumerate([0.61, 0.55, 0.70, 0.52, 0.66, 0.58, 0.73])}
    outcome = {f"rm{i}": v for i, v in enumerate([1.20, 1.05, 1.41, 0.99, 1.30, 1.22, 1.38])}
    report = correlate(bench, outcome, seed=0)
    pinned = {"spearman": (0.9285714285714286, 0.4117647058823529, 1.0),
              "kendall": (0.8095238095238095, 0.29411764705882354, 1.0),
              "weighted_tau": (0.7493112947658402, 0.32708959180067154, 1.0),
              "pearson": (0.9573593696601335, 0.889869396560396, 0.9995504837029036),
              "ndcg": (0.9974161592392123, 0.9955954286495017, 1.0),
              "ndcg_shifted": (0.9883169697485601, 0.9650390946692852, 1.0),
              }
    for name, figures in pinned.items():
        got = (report[name]["value"], report[name]["ci_low"], report[name]["ci_high"])
        assert got == pytest.approx(figures, abs=1e-12), name
        assert report[name]["skipped_resamples"] == 0
    # RBO's CI: a resampled RM drawn twice is two entries tied in both rankings (no longer two
    # items told apart by a label); the reference applies the tie rule with plain loops.
    assert report["rbo"]["value"] == pytest.approx(0.881775, abs=1e-12)
    rms = sorted(bench)
    low, high = brute_force_rbo_ci([bench[r] for r in rms], [outcome[r] for r in rms], seed=0)
    assert (report["rbo"]["ci_low"], report["rbo"]["ci_high"]) == (pytest.approx(low, abs=1e-12),
                                                                   pytest.approx(high, abs=1e-12))
    at3 = correlate(bench, outcome, seed=0, ndcg_k=3)
    assert (at3["ndcg"]["value"], at3["ndcg"]["ci_low"]) == pytest.approx((0.9962220045066471, 0.988651402090173),
                                                                          abs=1e-12)
    assert (at3["ndcg_shifted"]["value"], at3["ndcg_shifted"]["ci_low"]) == pytest.approx(
        (0.9865149047827041, 0.9329376951220045), abs=1e-12)


def test_ndcg_figures_pinned_raw_at_k_negative_and_shifted():
    assert ndcg([0.3, 0.1, 0.2, 0.2], [2.0, 0.5, 1.0, 3.0]) == pytest.approx(0.8995418664316756, abs=1e-12)
    assert ndcg([0.3, 0.1, 0.2, 0.2], [2.0, 0.5, 1.0, 3.0], k=2) == pytest.approx(0.7653606369886217, abs=1e-12)
    assert ndcg([0.3, 0.1, 0.2], [2.0, -0.5, 1.0]) is None
    assert ndcg([0.3, 0.1, 0.2], [2.0, -0.5, 1.0], shifted=True) == pytest.approx(1.0, abs=1e-12)
    # sklearn's ndcg_score (since) differs from the former batched formula by rounding only (< 1e-15).


def test_brier_figures_pinned():
    rng = np.random.default_rng(42)
    rng.random(37), rng.random(40), rng.random(40), rng.integers(1, 6, 25), rng.integers(1, 6, 25)
    report = calibration(rng.normal(0.5, 1.0, 60), seed=0)
    assert (report["brier"], report["raw"]["brier"]) == pytest.approx((0.20454779579502425, 0.20152786907693088),
                                                                      abs=1e-12)
    from prblib.stats.correlation import verdict_calibration
    assert verdict_calibration(list(rng.random(30)))["brier"] == pytest.approx(0.37098867225143656, abs=1e-12)
