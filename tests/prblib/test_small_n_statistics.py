"""Issue 28, faults 1-4: every p-value, interval and ranking figure says what it can at 5-14 RMs.

Each right value is written here, worked out by hand or by another library (statsmodels,
sklearn, the reference RBO, closed-form null moments), never read back from the code.
"""

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import ndcg_score
from statsmodels.stats.proportion import proportion_confint

from prblib.downstream.bon import outcomes as bon_outcomes
from prblib.stats.correlation import (EXACT_MAX_N, chance, correlate, permutation_p_value, rank_stability, rbo,
                                     rbo_scores, verdict_calibration)
from prblib.stats.metrics import bootstrap_ci, proportion_ci, summarize

# --- fault 1: exact p-values ----------------------------------------------------------------


def test_three_rms_in_perfect_order_have_the_exact_p_of_one_third():
    # The t-approximation gave p < 1e-16. Of the 3! = 6 orderings, 1 gives rho = 1 and 1 gives
    # rho = -1: two-sided p = 2/6.
    report = correlate({"a": 0.6, "b": 0.7, "c": 0.8}, {"a": 1.0, "b": 1.5, "c": 1.9})
    for name in ("spearman", "kendall", "pearson"):
        assert report[name]["p_value"] == pytest.approx(1 / 3), name
        assert report[name]["p_method"] == "exact, all 6 orderings"
    assert report["spearman"]["p_display"] == "0.33"
    assert report["p_method"] == "exact, all 6 orderings"


def test_five_rms_at_rho_09_have_the_exact_p_0083_not_the_t_approximations_0037():
    x, y = [1, 2, 3, 4, 5], [1, 2, 3, 5, 4]
    assert stats.spearmanr(x, y).pvalue == pytest.approx(0.0374, abs=1e-4)  # what was shown
    # rho >= 0.9 needs sum d^2 <= 2: the identity and the 4 adjacent swaps, 5 of 120; both tails: 10/120.
    report = correlate(dict(zip("abcde", x)), dict(zip("abcde", y)))
    assert report["spearman"]["value"] == pytest.approx(0.9)
    assert report["spearman"]["p_value"] == pytest.approx(10 / 120)
    assert report["spearman"]["p_display"] == "0.083"
    assert report["spearman"]["p_method"] == "exact, all 120 orderings"
    # The share of orderings reaching rho >= 0.9 is the one-sided p: 5/120.
    assert report["spearman"]["chance"]["share_at_least"] == pytest.approx(5 / 120)


def test_an_exact_test_with_five_rms_never_goes_below_2_of_120_two_sided_or_1_of_120_one_sided():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    ps = {order: permutation_p_value(x, list(order), "spearman") for order in itertools.permutations(x)}
    assert min(ps.values()) == pytest.approx(2 / 120)  # only the perfect and the reversed order
    assert ps[(1.0, 2.0, 3.0, 4.0, 5.0)] == pytest.approx(2 / 120)
    assert ps[(5.0, 4.0, 3.0, 2.0, 1.0)] == pytest.approx(2 / 120)
    assert all(round(p * 120, 9) == round(p * 120) for p in ps.values())  # multiples of 1/120
    one_sided = chance(x, x)["spearman"]["share_at_least"]
    assert one_sided == pytest.approx(1 / 120)


def test_kendall_matches_scipys_exact_null_distribution_without_ties():
    x, y = np.arange(7.0), np.array([2.0, 1.0, 4.0, 3.0, 6.0, 7.0, 5.0])
    assert permutation_p_value(x, y, "kendall") == pytest.approx(stats.kendalltau(x, y, method="exact").pvalue)


def test_above_eight_rms_p_is_a_seeded_monte_carlo_permutation_p():
    assert EXACT_MAX_N == 8
    bench = {f"rm{i}": 0.5 + i / 100 for i in range(10)}
    outcome = {f"rm{i}": 1.0 + i / 10 for i in range(10)}
    report = correlate(bench, outcome, resamples=50, seed=3)
    # No random ordering of 10 matches the perfect order in 9999 draws: (0 + 1) / 10000 per tail.
    assert report["spearman"]["p_value"] == pytest.approx(2 / 10000)
    assert report["spearman"]["p_method"] == "permutation, 9999 random orderings (seed 3)"
    assert report["chance_method"] == "Monte Carlo, 9999 random orderings (seed 3)"
    assert correlate(bench, outcome, resamples=50, seed=3) == report


# --- fault 2: intervals that cannot collapse ---------------------------------------------------


def test_accuracy_intervals_are_clopper_pearson_and_never_collapse_at_0_or_n():
    low, high = proportion_ci(10, 10)
    assert (low, high) == (pytest.approx(0.025 ** (1 / 10)), 1.0)  # 0.6915
    assert low == pytest.approx(0.6915, abs=1e-4)
    assert proportion_ci(0, 10) == (0.0, pytest.approx(1 - 0.025 ** (1 / 10)))
    for k, n in ((10, 10), (0, 10), (7, 10), (1, 1), (23, 30)):
        theirs = proportion_confint(k, n, alpha=0.05, method="beta")  # statsmodels' Clopper-Pearson
        assert proportion_ci(k, n) == (pytest.approx(theirs[0], abs=1e-12), pytest.approx(theirs[1], abs=1e-12))
    report = summarize([("Arts", True, False)] * 10 + [("Life", False, False)] * 10 + [("One", True, False)])
    assert (report["by_domain"]["Arts"]["ci_low"], report["by_domain"]["Arts"]["ci_high"]) == (
        pytest.approx(0.6915, abs=1e-4), 1.0)
    assert (report["by_domain"]["Life"]["ci_low"], report["by_domain"]["Life"]["ci_high"]) == (
        0.0, pytest.approx(0.3085, abs=1e-4))
    # A domain with one pair: [0.025, 1], never [1, 1].
    assert (report["by_domain"]["One"]["ci_low"], report["by_domain"]["One"]["ci_high"]) == (
        pytest.approx(0.025), 1.0)
    assert report["ci_method"].startswith("Clopper-Pearson")


def test_correlations_of_rms_in_perfect_order_say_not_enough_data_instead_of_1_1():
    bench = {rm: v for rm, v in zip("abcde", (0.5, 0.6, 0.7, 0.8, 0.9))}
    outcome = {rm: v for rm, v in zip("abcde", (1.0, 1.2, 1.3, 1.7, 1.9))}
    report = correlate(bench, outcome)
    for name in ("spearman", "kendall", "rbo", "weighted_tau"):
        assert report[name]["value"] == pytest.approx(1.0)
        assert report[name]["ci_low"] is None and report[name]["ci_high"] is None, name
        assert report[name]["ci_reason"].startswith("not enough data"), name
    assert report["pearson"]["ci_low"] < report["pearson"]["ci_high"]  # r < 1 varies over resamples


def test_a_ppo_outcome_of_five_equal_scores_has_no_interval_rather_than_0_0():
    judged = {(f"i{j}", 1): 0.0 for j in range(5)}
    result = bon_outcomes(judged, {f"i{j}": "Arts" for j in range(5)})[1]
    assert result["mean"] == 0.0 and result["n"] == 5
    assert (result["ci_low"], result["ci_high"]) == (None, None)
    assert bootstrap_ci([1.5]) == (None, None)


# --- fault 3: what a random ordering gives -----------------------------------------------------


def test_chance_figures_are_exact_over_every_ordering():
    # Outcomes bunched on a 0-2 scale far from 0, like the demo's: raw-gain NDCG is high whatever the order.
    x = np.array([0.80, 0.70, 0.60, 0.50, 0.40])
    y = np.array([0.97, 0.95, 0.90, 0.84, 0.70])
    orders = list(itertools.permutations(range(5)))
    ndcgs = np.array([ndcg_score([y], [x[list(o)]]) for o in orders])
    shifted = np.array([ndcg_score([y - y.min()], [x[list(o)]]) for o in orders])
    rbos = np.array([rbo(sorted(range(5), key=lambda i: -x[list(o)][i]), list(range(5))) for o in orders])
    report = chance(x, y)
    assert report["orderings"] == 120 and report["exact"] and report["method"] == "exact, all 120 orderings"
    assert report["ndcg"]["mean"] == pytest.approx(ndcgs.mean()) and report["ndcg"]["sd"] == pytest.approx(ndcgs.std())
    assert report["ndcg"]["worst"] == pytest.approx(ndcgs.min())
    assert report["ndcg"]["worst"] == pytest.approx(ndcg_score([y], [-y]))  # the reversed ordering
    assert report["ndcg"]["mean"] > 0.95  # a random ordering already scores > 0.95 with raw gains
    assert report["ndcg_shifted"]["mean"] == pytest.approx(shifted.mean())
    assert report["ndcg_shifted"]["worst"] == pytest.approx(shifted.min())
    assert report["rbo"]["mean"] == pytest.approx(rbos.mean())
    # Null moments in closed form (no ties): E = 0; Var(rho) = 1 / (n - 1); Var(tau) = 2(2n + 5) / (9n(n - 1)).
    assert report["spearman"]["mean"] == pytest.approx(0, abs=1e-12)
    assert report["spearman"]["sd"] == pytest.approx(math.sqrt(1 / 4))
    assert report["kendall"]["mean"] == pytest.approx(0, abs=1e-12)
    assert report["kendall"]["sd"] == pytest.approx(math.sqrt(2 * 15 / (9 * 5 * 4)))
    assert report["weighted_tau"] is None


def test_every_correlation_carries_n_and_its_chance_figures():
    bench = dict(zip("abcde", (0.61, 0.55, 0.70, 0.52, 0.66)))
    outcome = dict(zip("abcde", (1.20, 1.05, 1.41, 0.99, 1.30)))
    report = correlate(bench, outcome)
    assert report["n"] == 5 and report["chance_method"] == "exact, all 120 orderings"
    for name in ("spearman", "kendall", "pearson", "ndcg", "ndcg_shifted", "rbo"):
        assert set(report[name]["chance"]) >= {"mean", "sd", "low", "high", "share_at_least"}, name
    assert report["ndcg"]["chance"]["worst"] == pytest.approx(ndcg_score([[1.20, 1.05, 1.41, 0.99, 1.30]],
                                                                         [[-1.20, -1.05, -1.41, -0.99, -1.30]]))


# --- fault 4: ties, rank stability, calibration, alpha, precision ------------------------------


def test_rbo_of_tied_rms_does_not_depend_on_their_names():
    outcome = {"a": 2.0, "b": 1.0, "c": 0.5, "d": 0.1}
    bench = {"a": 0.8, "b": 0.8, "c": 0.6, "d": 0.5}  # a and b tie on accuracy
    renamed_b = {"z" if k == "b" else k: v for k, v in bench.items()}
    renamed_o = {"z" if k == "b" else k: v for k, v in outcome.items()}
    first, second = correlate(bench, outcome)["rbo"]["value"], correlate(renamed_b, renamed_o)["rbo"]["value"]
    # The mean over both orders of the tie, by the reference rbo: (1 + rbo(bacd, abcd)) / 2.
    expected = (rbo(list("abcd"), list("abcd")) + rbo(list("bacd"), list("abcd"))) / 2
    assert first == pytest.approx(expected) and second == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(6))
def test_tie_aware_rbo_is_the_mean_over_every_ordering_of_the_ties_of_one_ranking(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 3, 6).astype(float), rng.permutation(6).astype(float)  # ties in x only

    def rankings(v):
        groups = sorted({*v}, reverse=True)
        for combo in itertools.product(*[itertools.permutations(np.flatnonzero(v == g)) for g in groups]):
            yield [int(i) for group in combo for i in group]

    values = [rbo(a, b, p=0.8) for a in rankings(x) for b in rankings(y)]
    assert rbo_scores(x, y, p=0.8) == pytest.approx(sum(values) / len(values), abs=1e-12)


def test_a_ranking_with_ties_has_rbo_1_with_itself_and_ties_in_both_count_fractionally():
    x = [3.0, 3.0, 2.0, 1.0]
    assert rbo_scores(x, x) == pytest.approx(1.0)
    # By hand, p = 0.5, four items: x ties items 0 and 1 at positions 1-2, y ties items 1 and 2 at 2-3.
    # Memberships of the top 1 / 2 / 3 / 4: x: i0 .5 1 1 1, i1 .5 1 1 1, i2 0 0 1 1, i3 0 0 0 1;
    # y (order 0, {1, 2}, 3): i0 1 1 1 1, i1 0 .5 1 1, i2 0 .5 1 1, i3 0 0 0 1.
    # X_d = sum of minima: X_1 = .5, X_2 = 1 + .5 + 0 = 1.5, X_3 = 3, X_4 = 4.
    y = [3.0, 2.0, 2.0, 1.0]
    p = 0.5
    expected = 4 / 4 * p ** 4 + (1 - p) / p * (0.5 / 1 * p + 1.5 / 2 * p ** 2 + 3 / 3 * p ** 3 + 4 / 4 * p ** 4)
    assert rbo_scores(x, y, p=p) == pytest.approx(expected)


def test_rank_stability_needs_three_rms():
    two = rank_stability({"bon": {"a": 1.0, "b": 2.0}, "ppo": {"a": 1.5, "b": 2.5}})
    assert two["pairwise"][0]["tau"] is None and two["mean_tau"] is None
    assert two["reason"] == "need at least 3 RMs with an outcome under every policy, got 2"
    three = rank_stability({"bon": {"a": 1.0, "b": 2.0, "c": 3.0}, "ppo": {"a": 1.5, "b": 2.5, "c": 3.5}})
    assert three["pairwise"][0]["tau"] == pytest.approx(1.0) and three["reason"] is None
    assert three["pairwise"][0]["p_value"] == pytest.approx(1 / 3)  # 2 of 6 orderings as extreme


def test_a_judge_always_answering_a_gets_no_credit_from_the_verdict_calibration():
    # Over both orders, "A" picks the chosen answer once and the rejected once: share 0.5 per pair.
    constant = verdict_calibration([0.5] * 20)
    assert constant["ece"] is None  # it used to be 0: perfectly calibrated
    assert constant["brier"] == pytest.approx(0.25) and constant["brier_skill"] == pytest.approx(0.0)
    perfect = verdict_calibration([1.0] * 20)
    assert perfect["brier"] == pytest.approx(0.0) and perfect["brier_skill"] == pytest.approx(1.0)
    good = verdict_calibration([0.8] * 20)  # Brier (0.2^2 + 0.2^2) / 2 = 0.04; skill 1 - 0.04/0.25
    assert good["brier_skill"] == pytest.approx(0.84) and good["brier_skill"] > constant["brier_skill"]
    backwards = verdict_calibration([0.0] * 20)
    assert backwards["brier_skill"] == pytest.approx(-3.0)


def test_alpha_is_reported_pooled_and_within_chosen_and_within_rejected():
    import krippendorff

    from prblib.stats.agreement import agreement

    # Three annotators, six pairs: chosen answers rated 4-5, rejected 1-2, with disagreement inside each role.
    chosen = [[5, 4, 5], [4, 5, 4], [5, 5, 4], [4, 4, 5], [5, 4, 4], [4, 5, 5]]
    rejected = [[1, 2, 1], [2, 1, 2], [1, 1, 2], [2, 2, 1], [1, 2, 2], [2, 1, 1]]
    rows = []
    for p, (c, r) in enumerate(zip(chosen, rejected)):
        for a in range(3):
            rows.append({"annotator": f"u{a}", "pair": f"p{p}", "domain": "d", "role": "chosen",
                         "dimension": "personal_rubrics", "value": c[a]})
            rows.append({"annotator": f"u{a}", "pair": f"p{p}", "domain": "d", "role": "rejected",
                         "dimension": "personal_rubrics", "value": r[a]})
    got = agreement(rows, ["personal_rubrics"])["personal_rubrics"]
    # Reference: coders x units matrices built here (units: pair-chosen then pair-rejected).
    c, r = np.array(chosen).T.astype(float), np.array(rejected).T.astype(float)

    def alpha(matrix):
        return krippendorff.alpha(reliability_data=matrix, level_of_measurement="ordinal", value_domain=[1, 2, 3, 4, 5])

    assert got["alpha"] == pytest.approx(alpha(np.hstack([c, r])))
    assert got["alpha_chosen"] == pytest.approx(alpha(c))
    assert got["alpha_rejected"] == pytest.approx(alpha(r))
    assert got["alpha"] > 0.6 and got["alpha_chosen"] < 0.1 and got["alpha_rejected"] < 0.1


def test_correlate_text_prints_a_value_and_its_interval_to_the_same_decimals():
    from leaderboard.management.commands.correlate import _f

    assert _f({"value": 0.998, "ci_low": 0.9951, "ci_high": 1.0}) == "0.998[0.995,1.000]"  # was 0.998[1.00,1.00]
    assert _f({"value": 1.0, "ci_low": None, "ci_high": None,
               "ci_reason": "not enough data: every bootstrap resample gives 1"}) == "1.000[not enough data]"
    from leaderboard.management.commands.correlate import _chance

    # A chance mean of -1e-17 (rounding of an exact 0) reads 0.000, the sd to the same decimals.
    assert _chance({"chance": {"mean": -1e-17, "sd": 0.5}}) == "0.000±0.500"
    assert _chance({"chance": {"mean": 0.9612, "sd": 0.0261, "worst": 0.9158}}) == "0.961±0.026,worst=0.916"
