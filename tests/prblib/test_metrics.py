"""Evaluation metrics against hand computations and scipy."""

import numpy as np
import pytest
from scipy import stats

from prblib.stats.metrics import (bootstrap_ci, holm_adjust, judge_order_stats, paired_comparison,
                                 significance_groups, summarize)


def test_summarize_counts_ties_wrong_and_as_half_overall_and_by_domain():
    report = summarize([("Arts", True, False), ("Arts", False, True), ("Arts", False, False),
                        ("Lifestyle", True, False)])
    assert (report["n"], report["correct"], report["ties"]) == (4, 2, 1)
    assert report["accuracy"] == 0.5 and report["tie_rate"] == 0.25 and report["accuracy_ties_half"] == 0.625
    arts, life = report["by_domain"]["Arts"], report["by_domain"]["Lifestyle"]
    assert (arts["n"], arts["accuracy"], arts["accuracy_ties_half"]) == (3, 1 / 3, 0.5)
    # A domain with one pair right: Clopper-Pearson [0.025, 1] (1 - 0.975), never [1, 1].
    assert (life["n"], life["accuracy"]) == (1, 1.0)
    assert (life["ci_low"], life["ci_high"]) == (pytest.approx(0.025), 1.0)
    assert report["ci_low"] <= report["accuracy"] <= report["ci_high"]
    assert set(report["by_domain"]) == {"Arts", "Lifestyle"}


def test_summarize_is_reproducible_and_handles_no_pairs():
    rows = [("d", i % 3 != 0, False) for i in range(50)]
    assert summarize(rows) == summarize(rows)
    empty = summarize([])
    assert empty["n"] == 0 and empty["accuracy"] is None and empty["ci_low"] is None and empty["by_domain"] == {}


def test_a_pair_cannot_be_both_correct_and_a_tie():
    with pytest.raises(ValueError):
        summarize([("d", True, True)])


def test_the_bootstrap_ci_matches_the_exact_bootstrap_distribution_of_a_proportion():
    # The bootstrap mean of 0/1 values with k ones out of n is Binomial(n, k/n) / n.
    values = [1.0] * 60 + [0.0] * 40
    low, high = bootstrap_ci(values, resamples=1000, seed=0)
    assert low == pytest.approx(stats.binom.ppf(0.025, 100, 0.6) / 100, abs=0.02)
    assert high == pytest.approx(stats.binom.ppf(0.975, 100, 0.6) / 100, abs=0.02)


def test_the_bootstrap_ci_agrees_with_scipy_percentile_bootstrap():
    values = np.random.default_rng(1).normal(3.0, 2.0, size=200)
    ours = bootstrap_ci(values, resamples=1000, seed=0)
    theirs = stats.bootstrap((values,), np.mean, n_resamples=5000, method="percentile", confidence_level=0.95,
                             random_state=np.random.default_rng(2)).confidence_interval
    assert ours[0] == pytest.approx(theirs.low, abs=0.08)
    assert ours[1] == pytest.approx(theirs.high, abs=0.08)


def test_the_bootstrap_is_seeded_and_degenerate_samples_have_no_interval():
    values = [1, 0, 1, 1, 0, 1, 0, 1]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci([0.7] * 20) == (None, None)  # not enough data, never [0.7, 0.7]
    assert bootstrap_ci([0.0] * 5) == (None, None)  # a PPO outcome of five zeros
    assert bootstrap_ci([]) == (None, None)
    low90, high90 = bootstrap_ci(values, confidence=0.90)
    low95, high95 = bootstrap_ci(values, confidence=0.95)
    assert low95 <= low90 <= high90 <= high95


def test_paired_comparison_is_mcnemars_exact_test_on_the_discordant_items():
    a = [True, True, True, True, True, False, False, True, False, True]
    b = [False, False, False, True, True, False, True, True, False, False]
    result = paired_comparison(a, b)
    assert (result["a_only"], result["b_only"], result["n"]) == (4, 1, 10)
    assert result["diff"] == pytest.approx(0.7 - 0.4)
    # Two-sided exact binomial: 2 * P(X >= 4 | n=5, p=1/2) = 2 * 6/32.
    assert result["p_value"] == pytest.approx(12 / 32)
    assert result["p_value"] == pytest.approx(stats.binomtest(4, 5, 0.5).pvalue)
    assert result["ci_low"] <= result["diff"] <= result["ci_high"]


def test_paired_comparison_of_identical_systems_shows_no_difference():
    a = [True, False, True, True]
    result = paired_comparison(a, a)
    assert result["p_value"] == 1.0 and result["diff"] == 0.0 and (result["ci_low"], result["ci_high"]) == (None, None)
    assert result["ci_reason"].startswith("not enough data")


def test_the_paired_bootstrap_keeps_items_together():
    # b is a shifted by one item everywhere: the paired difference is always exactly 0.1.
    a = [True] * 10 + [False] * 90
    b = [True] * 20 + [False] * 80
    result = paired_comparison(b, a, resamples=500)
    assert result["diff"] == pytest.approx(0.1)
    assert result["ci_low"] > 0.03 and result["ci_high"] < 0.17
    assert result["p_value"] == pytest.approx(stats.binomtest(10, 10, 0.5).pvalue)


def test_paired_comparison_needs_the_same_items():
    with pytest.raises(ValueError):
        paired_comparison([True, False], [True])


def test_holm_adjustment_by_hand():
    assert holm_adjust([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm_adjust([0.6, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm_adjust([]) == []


def correct_on(indices, n=100):
    chosen = set(indices)
    return [i in chosen for i in range(n)]


def test_significance_groups_share_a_rank_until_a_system_is_significantly_worse():
    systems = {"A": correct_on(range(80)), "B": correct_on(range(78)), "C": correct_on(range(50))}
    assert significance_groups(systems) == {"A": 1, "B": 1, "C": 3}


def test_groups_stay_contiguous_in_accuracy_order():
    # C (69%) is not significantly worse than A (80%) on its own (many discordant items), but B
    # (70%) is, so C cannot join A's group past B; it then ties with B.
    systems = {"A": correct_on(range(80)), "B": correct_on(range(70)), "C": correct_on(range(30, 99))}
    assert significance_groups(systems) == {"A": 1, "B": 2, "C": 2}


def test_holm_correction_keeps_borderline_systems_in_the_group():
    a = correct_on(range(60))
    x = correct_on(range(6, 60))  # a better on 6 items, never worse: p = 2 / 2**6 = 0.03125
    y = correct_on(range(54))     # the same on other items
    assert significance_groups({"A": a, "X": x}) == {"A": 1, "X": 2}  # a single comparison: significant
    assert significance_groups({"A": a, "X": x, "Y": y}) == {"A": 1, "X": 1, "Y": 1}  # Holm: 0.0625 each


def test_significance_groups_order_equal_accuracy_by_name_and_check_alignment():
    assert significance_groups({"b": [True, False], "a": [False, True]}) == {"a": 1, "b": 1}
    with pytest.raises(ValueError):
        significance_groups({"a": [True], "b": [True, False]})


def test_judge_order_stats_by_hand():
    details = [
        {"orders": [{"chosen_position": "A", "verdict": "A"}, {"chosen_position": "B", "verdict": "B"}]},
        {"orders": [{"chosen_position": "A", "verdict": "A"}, {"chosen_position": "B", "verdict": "A"}]},
        {"orders": [{"chosen_position": "A", "verdict": "B"}, {"chosen_position": "B", "verdict": "A"}]},
        {"orders": [{"chosen_position": "A", "verdict": None}, {"chosen_position": "B", "verdict": "B"}]},
        {"orders": [{"chosen_position": "B", "verdict": "B"}]},
    ]
    result = judge_order_stats(details)
    assert (result["pairs"], result["judgments"], result["parse_failures"]) == (5, 9, 1)
    assert result["accuracy"] == pytest.approx(5 / 9)
    assert result["accuracy_chosen_first"] == pytest.approx(2 / 4)
    assert result["accuracy_chosen_second"] == pytest.approx(3 / 5)
    assert result["position_bias"] == pytest.approx(0.5 - 0.6)
    assert result["order_consistency"] == pytest.approx(2 / 4)  # pairs 1 and 3 (both picked the rejected)
    assert result["parse_failure_rate"] == pytest.approx(1 / 9)


def test_judge_order_stats_of_nothing_are_empty():
    result = judge_order_stats([])
    assert result["judgments"] == 0 and result["accuracy"] is None and result["position_bias"] is None


# Figures pinned before the three hand-written bootstraps became one (scipy.stats.bootstrap):
# the same resamples are drawn (rows of default_rng(seed).integers(0, n, (100, n))), so the
# figures are unchanged (paired: 0.05 was 0.04999999999999993, a mean of differences instead of
# a difference of means, within 1e-15).
PINNED_VALUES = (np.random.default_rng(42).random(37) < 0.6).astype(float)


def test_bootstrap_ci_keeps_the_figure_it_gave_before_scipy_drew_it():
    assert bootstrap_ci(PINNED_VALUES.tolist(), resamples=1000, seed=0) == pytest.approx(
        (0.3506756756756763, 0.6756756756756757), abs=1e-12)
    assert bootstrap_ci([0.5], seed=0) == (None, None)


def test_the_one_bootstrap_is_scipys_percentile_interval_over_items():
    from scipy import stats as sps

    from prblib.stats.metrics import bootstrap_over_items

    data = np.array([0.2, 1.5, 0.7, 3.1, 2.2, 0.9, 1.1])
    low, high, skipped = bootstrap_over_items(data.size, lambda idx: data[idx].mean(axis=-1)[None],
                                              resamples=400, seed=5, confidence=0.9)
    theirs = sps.bootstrap((data,), np.mean, n_resamples=400, batch=100, method="percentile",
                           confidence_level=0.9, rng=np.random.default_rng(5)).confidence_interval
    assert (low[0], high[0]) == (pytest.approx(theirs.low, abs=1e-12), pytest.approx(theirs.high, abs=1e-12))
    assert skipped.tolist() == [0]
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_over_items(3, lambda idx: idx.mean(axis=-1)[None], resamples=0)


def test_paired_comparison_ci_keeps_its_figure():
    rng = np.random.default_rng(42)
    rng.random(37)
    a = (rng.random(40) < 0.7).tolist()
    b = (rng.random(40) < 0.5).tolist()
    result = paired_comparison(a, b, seed=0)
    assert (result["ci_low"], result["ci_high"]) == (pytest.approx(0.05, abs=1e-12), pytest.approx(0.475, abs=1e-12))
    assert result["p_value"] == pytest.approx(0.052478790283203125, abs=1e-15)
