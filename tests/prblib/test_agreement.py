"""prblib.stats.agreement (the annotation report's statistics) on a fixed, hand-made set of ratings.

Expected figures are worked out by hand (fractions) or computed directly with scipy and
krippendorff on the same numbers, never through prblib.stats.agreement itself.
"""

import json
import statistics
from fractions import Fraction as F

import krippendorff
import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from prblib.stats import agreement as stats

DIMS = ["factuality", "relevance", "helpfulness", "personal_rubrics"]
ANNOTATORS = ["a1", "a2", "a3"]
DOMAIN = {"p1": "arts", "p2": "arts", "p3": "arts", "p4": "society", "p5": "society", "p6": "society"}

# pair -> dimension -> (chosen values of a1, a2, a3), (rejected values of a1, a2, a3)
TABLE = {
    "p1": {
        "factuality": ((5, 5, 4), (5, 4, 4)),
        "relevance": ((5, 5, 5), (5, 5, 5)),
        "helpfulness": ((4, 5, 4), (4, 4, 4)),
        "personal_rubrics": ((5, 5, 5), (1, 2, 1)),
    },
    "p2": {
        "factuality": ((4, 4, 4), (4, 4, 4)),
        "relevance": ((5, 4, 5), (4, 4, 5)),
        "helpfulness": ((5, 5, 4), (4, 4, 4)),
        "personal_rubrics": ((5, 4, 5), (1, 1, 2)),
    },
    "p3": {  # too small a gap on the personal rubrics
        "factuality": ((5, 5, 5), (5, 5, 4)),
        "relevance": ((4, 4, 4), (4, 5, 4)),
        "helpfulness": ((4, 4, 5), (4, 4, 4)),
        "personal_rubrics": ((3, 4, 3), (2, 2, 2)),
    },
    "p4": {  # differs on helpfulness too
        "factuality": ((5, 4, 5), (5, 4, 5)),
        "relevance": ((5, 5, 5), (4, 5, 5)),
        "helpfulness": ((5, 5, 5), (3, 4, 3)),
        "personal_rubrics": ((5, 5, 4), (1, 1, 1)),
    },
    "p5": {
        "factuality": ((4, 5, 5), (5, 5, 5)),
        "relevance": ((4, 4, 5), (4, 4, 4)),
        "helpfulness": ((4, 4, 4), (4, 4, 4)),
        "personal_rubrics": ((5, 5, 5), (2, 1, 1)),
    },
    "p6": {  # rubric gap exactly 2 (passes), relevance gap exactly 1 (fails)
        "factuality": ((5, 5, 5), (5, 5, 5)),
        "relevance": ((5, 5, 4), (4, 4, 3)),
        "helpfulness": ((4, 4, 4), (4, 4, 4)),
        "personal_rubrics": ((4, 4, 4), (2, 2, 2)),
    },
}

# seconds for the whole pair, per annotator; a1 has no time for p6
SECONDS = {
    "a1": {"p1": 30.0, "p2": 40.0, "p3": 50.0, "p4": 60.0, "p5": 70.0, "p6": None},
    "a2": {p: 20.0 for p in TABLE},
    "a3": {p: 100.0 for p in TABLE},
}


def rows_from(table, annotators=ANNOTATORS, seconds=SECONDS, domain=DOMAIN):
    rows = []
    for pair, dims in table.items():
        for dim, (chosen, rejected) in dims.items():
            for role, values in (("chosen", chosen), ("rejected", rejected)):
                for annotator, value in zip(annotators, values):
                    if value is None:
                        continue
                    rows.append(
                        {
                            "annotator": annotator,
                            "pair": pair,
                            "domain": domain.get(pair, "arts"),
                            "role": role,
                            "dimension": dim,
                            "value": value,
                            "seconds": (seconds or {}).get(annotator, {}).get(pair),
                        }
                    )
    return rows


RATINGS = rows_from(TABLE)


def fmean(values):
    return F(sum(values), len(values))


def hand_diffs(dim, table=TABLE):
    """Per-pair chosen mean - rejected mean as exact fractions, pairs in sorted order."""
    return [fmean(table[p][dim][0]) - fmean(table[p][dim][1]) for p in sorted(table)]


def hand_matrix(dim, table=TABLE, annotators=ANNOTATORS):
    """Coders x units reliability matrix, units = (pair, role), np.nan for missing."""
    units = [(p, r) for p in sorted(table) for r in (0, 1)]
    return np.array(
        [
            [np.nan if table[p][dim][r][i] is None else float(table[p][dim][r][i]) for p, r in units]
            for i in range(len(annotators))
        ]
    )


# --------------------------------------------------------------------------- pair means


def test_pair_means_average_the_annotators_per_pair_and_role():
    pm = stats.pair_means(RATINGS)
    assert list(pm.columns) == ["chosen", "rejected", "n_annotators"]
    assert pm.index.names == ["pair", "domain", "dimension"]
    assert len(pm) == 6 * 4
    row = pm.loc[("p1", "arts", "personal_rubrics")]
    assert row["chosen"] == 5.0
    assert row["rejected"] == float(F(4, 3))
    assert row["n_annotators"] == 3


def test_a_dataframe_input_gives_the_same_pair_means_as_a_list_of_dicts():
    pd.testing.assert_frame_equal(stats.pair_means(pd.DataFrame(RATINGS)), stats.pair_means(RATINGS))


def test_a_value_off_the_five_point_scale_is_refused():
    bad = [dict(RATINGS[0], value=6)]
    with pytest.raises(ValueError, match="1..5"):
        stats.pair_means(bad)


# --------------------------------------------------------------------------- summary


def test_summary_means_are_the_means_of_the_pair_means():
    summary = stats.dimension_summary(RATINGS, DIMS)
    pr = summary["personal_rubrics"]["overall"]
    # chosen pair means 5, 14/3, 10/3, 14/3, 5, 4; rejected 4/3, 4/3, 2, 1, 4/3, 2
    assert pr["n_pairs"] == 6
    assert pr["chosen_mean"] == pytest.approx(float(F(40, 9)))
    assert pr["rejected_mean"] == pytest.approx(1.5)
    assert pr["mean_diff"] == pytest.approx(float(F(53, 18)))
    arts = summary["personal_rubrics"]["by_domain"]["arts"]
    assert arts["n_pairs"] == 3
    assert arts["chosen_mean"] == pytest.approx(float(F(13, 3)))
    assert arts["rejected_mean"] == pytest.approx(float(F(14, 9)))
    assert sorted(summary["personal_rubrics"]["by_domain"]) == ["arts", "society"]


@pytest.mark.parametrize("dim", DIMS)
def test_the_wilcoxon_test_equals_scipy_on_the_per_pair_mean_differences(dim):
    diffs = [float(d) for d in hand_diffs(dim)]
    expected = sps.wilcoxon(diffs, zero_method="wilcox")
    got = stats.dimension_summary(RATINGS, DIMS)[dim]["overall"]["wilcoxon"]
    assert got["statistic"] == float(expected.statistic)
    assert got["p_value"] == float(expected.pvalue)
    assert got["n_zero_dropped"] == sum(1 for d in diffs if d == 0)
    assert got["n_nonzero"] == sum(1 for d in diffs if d != 0)
    assert got["reason"] is None


def test_zero_differences_are_dropped_and_counted():
    fact = stats.dimension_summary(RATINGS, DIMS)["factuality"]["overall"]["wilcoxon"]
    # factuality diffs: 1/3, 0, 1/3, 0, -1/3, 0
    assert fact["n_zero_dropped"] == 3
    assert fact["n_nonzero"] == 3
    assert fact["method"] == "permutation (exhaustive sign flips)"


def test_the_rank_biserial_correlation_equals_a_hand_computation():
    summary = stats.dimension_summary(RATINGS, DIMS)
    # relevance diffs: 0, 1/3, -1/3, 1/3, 1/3, 1 -> zero dropped; the four |1/3| share
    # ranks 1..4 (2.5 each), 1 gets rank 5: R+ = 3 * 2.5 + 5 = 12.5, R- = 2.5
    rel = summary["relevance"]["overall"]
    assert rel["wilcoxon"]["r_plus"] == 12.5
    assert rel["wilcoxon"]["r_minus"] == 2.5
    assert rel["rank_biserial"] == pytest.approx((12.5 - 2.5) / 15)
    # factuality: 1/3, 1/3, -1/3 all rank 2 -> (4 - 2) / 6
    assert summary["factuality"]["overall"]["rank_biserial"] == pytest.approx(1 / 3)
    # every personal-rubrics difference favours the chosen answer
    assert summary["personal_rubrics"]["overall"]["rank_biserial"] == 1.0


def test_cohens_dz_is_the_mean_difference_over_the_sd_of_differences():
    diffs = [float(d) for d in hand_diffs("relevance")]
    expected = statistics.mean(diffs) / statistics.stdev(diffs)
    got = stats.dimension_summary(RATINGS, DIMS)["relevance"]["overall"]["cohens_dz"]
    assert got == pytest.approx(expected)


def test_the_bootstrap_ci_resamples_whole_pairs_with_the_given_seed():
    diffs = np.array([float(d) for d in hand_diffs("personal_rubrics")])
    rng = np.random.default_rng(7)
    idx = rng.integers(0, len(diffs), size=(500, len(diffs)))
    expected = np.percentile(diffs[idx].mean(axis=1), [2.5, 97.5])
    pr = stats.dimension_summary(RATINGS, DIMS, seed=7, resamples=500)["personal_rubrics"]["overall"]
    assert pr["diff_ci"] == pytest.approx(list(expected))
    assert pr["chosen_ci"][0] <= pr["chosen_mean"] <= pr["chosen_ci"][1]
    again = stats.dimension_summary(RATINGS, DIMS, seed=7, resamples=500)["personal_rubrics"]["overall"]
    assert again == pr


def test_a_single_pair_has_means_but_no_ci():
    one = [r for r in RATINGS if r["pair"] == "p1"]
    pr = stats.dimension_summary(one, DIMS)["personal_rubrics"]["overall"]
    assert pr["n_pairs"] == 1
    assert pr["chosen_mean"] == 5.0
    assert pr["chosen_ci"] is None and pr["diff_ci"] is None
    assert pr["wilcoxon"]["p_value"] is None
    assert "fewer than 2 non-zero" in pr["wilcoxon"]["reason"]
    assert pr["cohens_dz"] is None


def test_all_zero_differences_give_no_p_value_and_say_why():
    same = {p: {"helpfulness": ((4, 5, 4), (4, 5, 4))} for p in TABLE}
    summary = stats.dimension_summary(rows_from(same), ["helpfulness"])["helpfulness"]["overall"]
    assert summary["mean_diff"] == 0.0
    assert summary["wilcoxon"]["p_value"] is None
    assert summary["wilcoxon"]["statistic"] is None
    assert summary["wilcoxon"]["n_zero_dropped"] == 6
    assert "zero" in summary["wilcoxon"]["reason"]
    assert summary["rank_biserial"] is None
    assert summary["cohens_dz"] is None


# --------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("dim", DIMS)
def test_alpha_equals_krippendorff_ordinal_on_a_hand_built_matrix(dim):
    expected = krippendorff.alpha(
        reliability_data=hand_matrix(dim), level_of_measurement="ordinal", value_domain=[1, 2, 3, 4, 5]
    )
    got = stats.agreement(RATINGS, DIMS)[dim]
    assert got["alpha"] == pytest.approx(expected, abs=1e-12)
    assert got["alpha_reason"] is None


def test_alpha_treats_a_missing_rating_as_missing():
    table = {p: {"personal_rubrics": TABLE[p]["personal_rubrics"]} for p in TABLE}
    c, r = table["p6"]["personal_rubrics"]
    table["p6"] = {"personal_rubrics": ((c[0], c[1], None), (r[0], r[1], None))}
    table["p3"] = {"personal_rubrics": ((3, 4, 3), (2, 5, 2))}
    expected = krippendorff.alpha(
        reliability_data=hand_matrix("personal_rubrics", table),
        level_of_measurement="ordinal",
        value_domain=[1, 2, 3, 4, 5],
    )
    got = stats.agreement(rows_from(table), ["personal_rubrics"])["personal_rubrics"]
    assert got["alpha"] == pytest.approx(expected, abs=1e-12)
    assert got["n_units"] == 12


def test_percent_agreement_equals_a_hand_count_of_agreeing_annotator_pairs():
    # personal rubrics, agreeing pairs of the 3 per unit:
    # p1 3+1, p2 1+1, p3 1+3, p4 1+3, p5 3+1, p6 3+3 = 24 of 12 * 3 = 36
    got = stats.agreement(RATINGS, DIMS)["personal_rubrics"]
    assert got["percent_agreement"] == pytest.approx(24 / 36)
    assert got["n_units"] == 12
    assert got["n_comparisons"] == 36


def test_a_single_annotator_gives_no_alpha_and_a_reason():
    solo = [r for r in RATINGS if r["annotator"] == "a1"]
    got = stats.agreement(solo, DIMS)["personal_rubrics"]
    assert got["alpha"] is None
    assert "fewer than 2 annotators" in got["alpha_reason"]
    assert got["percent_agreement"] is None
    assert got["n_units"] == 0


def test_ratings_without_variation_give_no_alpha_but_full_percent_agreement():
    flat = {p: {"factuality": ((5, 5, 5), (5, 5, 5))} for p in TABLE}
    got = stats.agreement(rows_from(flat), ["factuality"])["factuality"]
    assert got["alpha"] is None
    assert "variation" in got["alpha_reason"]
    assert got["percent_agreement"] == 1.0


def test_each_annotator_is_compared_with_the_rounded_mean_of_the_others():
    a1 = stats.annotator_agreement(RATINGS, DIMS)["a1"]
    # a1 on personal rubrics vs the others' mean (rounded half up):
    # exact on p1C p2C p3R p4C p4R p5C p6C p6R = 8 of 12;
    # |a1 - others| = 0 .5 .5 .5 .5 0 .5 0 0 1 0 0 -> 3.5 / 12
    pr = a1["by_dimension"]["personal_rubrics"]
    assert pr["n_compared"] == 12
    assert pr["exact_agreement"] == pytest.approx(8 / 12)
    assert pr["mean_abs_diff"] == pytest.approx(3.5 / 12)
    assert a1["n_shared_units"] == 12
    assert a1["n_compared"] == 48


# --------------------------------------------------------------------------- time and gold


def test_time_per_item_counts_each_pair_once_and_ignores_missing_seconds():
    times = stats.time_per_item(RATINGS)
    assert times["by_annotator"]["a1"] == {"median_seconds": 50.0, "mean_seconds": 50.0, "n_pairs": 5}
    assert times["by_annotator"]["a2"]["n_pairs"] == 6
    overall = times["overall"]
    assert overall["n_pairs"] == 17
    assert overall["median_seconds"] == 50.0
    assert overall["mean_seconds"] == pytest.approx(970 / 17)


GOLD = {"p1": {"chosen": {"personal_rubrics": 5, "factuality": 3}, "rejected": {"personal_rubrics": 3}}}


def test_gold_accuracy_counts_ratings_within_the_tolerance():
    # a1 gives 5, 5, 1; a2 5, 5, 2; a3 5, 4, 1 against 5, 3, 3
    got = stats.gold_accuracy(RATINGS, GOLD, tolerance=1)
    assert got["a1"] == {"accuracy": pytest.approx(1 / 3), "n_correct": 1, "n": 3}
    assert got["a2"] == {"accuracy": pytest.approx(2 / 3), "n_correct": 2, "n": 3}
    assert got["a3"] == {"accuracy": pytest.approx(2 / 3), "n_correct": 2, "n": 3}
    strict = stats.gold_accuracy(RATINGS, GOLD, tolerance=0)
    assert [strict[a]["n_correct"] for a in ANNOTATORS] == [1, 1, 1]


def test_an_annotator_without_gold_ratings_has_no_accuracy():
    got = stats.gold_accuracy(RATINGS, {"p9": {"chosen": {"factuality": 5}}})
    assert got["a1"] == {"accuracy": None, "n_correct": 0, "n": 0}


# --------------------------------------------------------------------------- validation


def test_validation_accepts_pairs_that_differ_only_on_the_personal_rubrics():
    verdicts = {v["pair"]: v for v in stats.validate_pairs(RATINGS, DIMS)}
    assert [p for p, v in verdicts.items() if v["valid"]] == ["p1", "p2", "p5"]
    assert verdicts["p1"]["reasons"] == []
    assert verdicts["p1"]["diffs"]["personal_rubrics"] == float(F(11, 3))
    assert verdicts["p1"]["domain"] == "arts"


def test_validation_names_each_failing_dimension_with_its_numbers():
    verdicts = {v["pair"]: v for v in stats.validate_pairs(RATINGS, DIMS)}
    assert verdicts["p3"]["reasons"] == ["personal_rubrics: chosen-rejected 1.33 < 2.0"]
    assert verdicts["p4"]["reasons"] == ["helpfulness: |diff| 1.67 >= 1.0"]
    # a rubric gap of exactly 2 passes; an other gap of exactly 1 fails
    assert verdicts["p6"]["diffs"]["personal_rubrics"] == 2.0
    assert verdicts["p6"]["reasons"] == ["relevance: |diff| 1.00 >= 1.0"]


def test_validation_lists_every_failure_of_a_pair_with_custom_thresholds():
    crafted = {
        "q1": {
            "factuality": ((4, 4), (4, 4)),
            "relevance": ((5, 4), (4, 4)),
            "helpfulness": ((5, 5), (4, 3)),
            "personal_rubrics": ((4, 3), (2, 2)),
        }
    }
    rows = rows_from(crafted, annotators=["x", "y"], seconds=None)
    (verdict,) = stats.validate_pairs(rows, DIMS, rubric_min_diff=2.0, other_max_diff=0.5)
    assert verdict["valid"] is False
    assert verdict["reasons"] == [
        "relevance: |diff| 0.50 >= 0.5",
        "helpfulness: |diff| 1.50 >= 0.5",
        "personal_rubrics: chosen-rejected 1.50 < 2.0",
    ]


def test_a_dimension_rated_on_one_answer_only_makes_the_pair_invalid():
    rows = [r for r in RATINGS if r["pair"] == "p1"]
    rows = [r for r in rows if not (r["dimension"] == "relevance" and r["role"] == "rejected")]
    (verdict,) = stats.validate_pairs(rows, DIMS)
    assert verdict["valid"] is False
    assert verdict["reasons"] == ["relevance: not rated on both answers"]
    assert verdict["diffs"]["relevance"] is None


# --------------------------------------------------------------------------- distribution and report


def test_the_distribution_counts_every_rating_per_role_and_value():
    dist = stats.rating_distribution(RATINGS, DIMS)
    assert dist["personal_rubrics"]["rejected"] == {"1": 9, "2": 9, "3": 0, "4": 0, "5": 0}
    assert dist["personal_rubrics"]["chosen"] == {"1": 0, "2": 0, "3": 2, "4": 6, "5": 10}
    assert sum(sum(c.values()) for d in dist.values() for c in d.values()) == len(RATINGS)


def test_the_report_is_plain_json_without_nan():
    report = stats.build_report(RATINGS, dimensions=DIMS, gold=GOLD)
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text) == report
    assert set(report) >= {
        "n_ratings", "n_pairs", "n_annotators", "dimensions", "agreement", "annotators",
        "time", "validation", "distribution", "method",
    }
    assert (report["n_ratings"], report["n_pairs"], report["n_annotators"]) == (144, 6, 3)
    assert report["validation"]["valid"] == 3 and report["validation"]["invalid"] == 3
    assert report["annotators"]["a2"]["gold"]["n_correct"] == 2
    assert report["annotators"]["a1"]["time"]["n_pairs"] == 5
    assert report["annotators"]["a1"]["agreement"]["n_shared_units"] == 12
    assert report["headline"]["rubric_rejected_mean"] == pytest.approx(1.5)
    assert all(isinstance(v, str) for v in report["method"].values())


def test_the_report_figures_match_the_single_functions():
    report = stats.build_report(RATINGS, dimensions=DIMS, seed=3)
    diffs = [float(d) for d in hand_diffs("personal_rubrics")]
    assert report["dimensions"]["personal_rubrics"]["overall"]["wilcoxon"]["p_value"] == float(
        sps.wilcoxon(diffs, zero_method="wilcox").pvalue
    )
    assert report["agreement"] == stats.agreement(RATINGS, DIMS)
    assert report["time"] == stats.time_per_item(RATINGS)["overall"]


def test_an_empty_campaign_gives_a_report_of_zeros_and_nones():
    report = stats.build_report([], dimensions=DIMS)
    json.dumps(report, allow_nan=False)
    assert (report["n_ratings"], report["n_pairs"], report["n_annotators"]) == (0, 0, 0)
    assert report["dimensions"]["personal_rubrics"]["overall"]["chosen_mean"] is None
    assert report["agreement"]["personal_rubrics"]["alpha"] is None
    assert report["validation"] == {
        "valid": 0, "invalid": 0, "rubric_dimension": "personal_rubrics",
        "rubric_min_diff": 2.0, "other_max_diff": 1.0, "pairs": [],
    }
    assert report["annotators"] == {}
    assert report["time"] == {"median_seconds": None, "mean_seconds": None, "n_pairs": 0}


def test_the_bootstrap_ci_keeps_the_figures_pinned_before_scipy_drew_it():
    # Drawn by prblib.stats.metrics.bootstrap_over_items (scipy.stats.bootstrap) since; the
    # resamples are the same, so the figures are those of the hand-written loop it replaced.
    rng = np.random.default_rng(42)
    rng.random(37), rng.random(40), rng.random(40)
    chosen = rng.integers(1, 6, 25).astype(float)
    rejected = rng.integers(1, 6, 25).astype(float)
    got = stats._bootstrap_ci(chosen, rejected, chosen - rejected, seed=0, resamples=1000)
    assert got[0] == pytest.approx([2.08, 3.04], abs=1e-12)
    assert got[1] == pytest.approx([2.32, 3.32], abs=1e-12)
    assert got[2] == pytest.approx([-0.921, 0.441], abs=1e-12)
