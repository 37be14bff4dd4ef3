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

from pipeline.ml.correlation import (calibration, correlate, cross_fit_probabilities, ndcg,
                                     rank_stability)

# Benchmark accuracy and a downstream outcome for eight RMs; rm2 and rm4 tie on accuracy.
BENCHMARK = {"rm0": 0.61, "rm1": 0.64, "rm2": 0.66, "rm3": 0.70, "rm4": 0.66, "rm5": 0.75, "rm6": 0.58,
             "rm7": 0.69}
OUTCOME = {"rm0": 3.1, "rm1": 3.0, "rm2": 3.4, "rm3": 3.9, "rm4": 3.6, "rm5": 4.2, "rm6": 2.8, "rm7": 3.5}


def dumps(report):
    return json.dumps(report, allow_nan=False)


def minmax(values):
    values = np.asarray(values, dtype=float)
    return (values - values.min()) / (values.max() - values.min())


# --- correlate -------------------------------------------------------------------------------

def test_correlate_matches_scipy_statistics_and_p_values():
    report = correlate(BENCHMARK, OUTCOME)
    rms = sorted(BENCHMARK)
    x, y = [BENCHMARK[rm] for rm in rms], [OUTCOME[rm] for rm in rms]
    assert report["n"] == 8 and report["rms"] == rms and report["dropped"] == {} and report["reason"] is None
    for name, function in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau),
                           ("pearson", stats.pearsonr)):
        expected = function(x, y)
        assert report[name]["value"] == pytest.approx(expected.statistic, abs=1e-12)
        assert report[name]["p_value"] == pytest.approx(expected.pvalue, rel=1e-9)
        assert report[name]["reason"] is None
    assert report["ndcg"]["value"] == pytest.approx(ndcg_score([minmax(y)], [x]))


def test_bootstrap_cis_contain_the_estimate_and_are_reproducible_with_the_seed():
    report = correlate(BENCHMARK, OUTCOME, seed=7)
    for name in ("spearman", "kendall", "pearson"):
        entry = report[name]
        assert -1 <= entry["ci_low"] <= entry["value"] <= entry["ci_high"] <= 1
        assert entry["skipped_resamples"] >= 0
    assert correlate(BENCHMARK, OUTCOME, seed=7) == report
    assert correlate(BENCHMARK, OUTCOME, seed=8)["pearson"]["ci_low"] != report["pearson"]["ci_low"]
    narrow = correlate(BENCHMARK, OUTCOME, seed=7, confidence=0.5)
    assert narrow["pearson"]["ci_high"] - narrow["pearson"]["ci_low"] < (
        report["pearson"]["ci_high"] - report["pearson"]["ci_low"])


def test_the_bootstrap_is_scipy_on_rms_resampled_with_replacement_skipping_undefined_resamples():
    # Three RMs with a tie: many resamples repeat one RM or only tied ones, so some are skipped.
    bench, outcome = {"a": 0.5, "b": 0.5, "c": 0.7}, {"a": 1.0, "b": 2.0, "c": 3.0}
    report = correlate(bench, outcome, resamples=100, seed=3)
    x, y = np.array([0.5, 0.5, 0.7]), np.array([1.0, 2.0, 3.0])
    idx = np.random.default_rng(3).integers(0, 3, size=(100, 3))
    for name, function in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau),
                           ("pearson", stats.pearsonr)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = np.array([function(x[i], y[i]).statistic for i in idx])
        valid = samples[~np.isnan(samples)]
        assert report[name]["skipped_resamples"] == 100 - valid.size > 0
        low, high = np.quantile(valid, [0.025, 0.975])
        assert (report[name]["ci_low"], report[name]["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    dumps(report)


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
    for name in ("spearman", "kendall", "pearson"):
        assert report[name]["value"] is None and report[name]["p_value"] is None
        assert report[name]["ci_low"] is None and report[name]["reason"] == report["reason"]
    assert report["ndcg"]["value"] is None
    dumps(report)
    dumps(correlate({}, {}))


def test_constant_benchmark_scores_leave_correlations_undefined_not_nan():
    report = correlate({"a": 0.7, "b": 0.7, "c": 0.7}, {"a": 1.0, "b": 2.0, "c": 3.0})
    for name in ("spearman", "kendall", "pearson"):
        assert report[name]["value"] is None and report[name]["ci_low"] is None
        assert "constant" in report[name]["reason"]
    assert report["ndcg"]["value"] == pytest.approx(ndcg_score([[0, 0.5, 1]], [[0.7, 0.7, 0.7]]))
    dumps(report)


def test_correlate_rejects_a_bad_confidence_or_resample_count():
    with pytest.raises(ValueError):
        correlate(BENCHMARK, OUTCOME, confidence=1.0)
    with pytest.raises(ValueError):
        correlate(BENCHMARK, OUTCOME, resamples=0)


# --- ndcg ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [None, 1, 3, 20])
def test_ndcg_equals_sklearn_on_untied_scores_with_outcomes_scaled_to_0_1(seed, k):
    rng = np.random.default_rng(seed)
    predicted, outcome = rng.normal(size=12), rng.normal(size=12) * 3 - 1  # negative outcomes too
    assert ndcg(predicted, outcome, k=k) == pytest.approx(ndcg_score([minmax(outcome)], [predicted], k=k))


def test_ndcg_uses_0_1_relevances_that_span_0_to_1_as_they_are():
    predicted, relevance = [0.9, 0.1, 0.5, 0.7, 0.3], [0.2, 0.0, 1.0, 0.4, 0.6]
    assert ndcg(predicted, relevance) == pytest.approx(ndcg_score([relevance], [predicted]))


def test_ndcg_of_a_perfect_ranking_is_one_and_of_a_reversed_one_is_less():
    outcome = {"a": -2.0, "b": 0.5, "c": 1.0, "d": 3.0}
    assert ndcg({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}, outcome) == pytest.approx(1.0)
    assert ndcg({"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}, outcome) < 0.7
    # Any monotone transform of the benchmark score gives the same ranking, hence the same NDCG.
    assert ndcg([1, 2, 3, 4], [5, 1, 7, 2]) == pytest.approx(ndcg([10, 200, 3000, 40000], [5, 1, 7, 2]))


def test_ndcg_averages_tied_predictions_like_sklearn_whatever_the_input_order():
    predicted, outcome = [0.7, 0.7, 0.5, 0.9, 0.5], [1.0, 3.0, 2.0, 0.0, 4.0]
    expected = ndcg_score([minmax(outcome)], [predicted])
    assert ndcg(predicted, outcome) == pytest.approx(expected)
    assert ndcg(predicted[::-1], outcome[::-1]) == pytest.approx(expected)
    assert ndcg(predicted, outcome, k=2) == pytest.approx(ndcg_score([minmax(outcome)], [predicted], k=2))


def test_ndcg_is_undefined_for_equal_outcomes_and_rejects_mismatched_input():
    assert ndcg([0.1, 0.2, 0.3], [2.0, 2.0, 2.0]) is None
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
    assert report["pairwise"][0]["p_value"] == pytest.approx(expected.pvalue)


def test_rank_stability_with_one_policy_or_constant_outcomes_says_why():
    single = rank_stability({"ppo": {"a": 1.0, "b": 2.0}})
    assert single["pairwise"] == [] and single["mean_tau"] is None and "2 policies" in single["reason"]
    assert single["rank_range"]["a"]["range"] == 0.0
    flat = rank_stability({"p": {"a": 1.0, "b": 1.0}, "q": {"a": 1.0, "b": 2.0}})
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
