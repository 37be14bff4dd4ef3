"""Statistics for the human-annotation report (agreement, Krippendorff's alpha, Wilcoxon,
validation of pairs, position bias).

Plain Python over plain data (numpy, scipy, pandas, krippendorff); no Django imports, so
the maths can be tested without a database and reused by the management command, the
report page and the API alike (annotation.services.reports and annotation.selectors call it).

Input rows
----------
Every public function takes ``ratings``: a sequence of dicts, or a pandas DataFrame built
from them, with the keys

    annotator (str), pair (str, an opaque pair id), domain (str),
    role ("chosen" | "rejected"), dimension (str), value (int 1..5),
    seconds (float | None: active time for the whole pair, repeated on every row of
    that (annotator, pair)).

Rows are normalised once (``_frame``): annotator, pair, domain and dimension become
``str``; a value that is not an integer in 1..5 or a role other than chosen/rejected
raises ``ValueError``; if one annotator rated the same (pair, role, dimension) twice the
last row wins; a pair that carries several domains keeps the first one seen.

The unit of analysis for the chosen/rejected comparison is the *pair*: annotators are
averaged per pair first (``pair_means``), so a pair rated by three people weighs the same
as a pair rated by one.  A pair's difference chosen - rejected is computed from integer
sums and counts in one division, so differences that are equal as fractions (e.g.
13/3 - 7/3 and 2) are the same float: they tie in rank-based tests and compare exactly
against thresholds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import krippendorff
import numpy as np
import pandas as pd
from scipy import stats as sps

from prblib.stats.metrics import bootstrap_over_items

DIMENSIONS: tuple[str, ...] = ("factuality", "relevance", "helpfulness", "personal_rubrics")
ROLES: tuple[str, ...] = ("chosen", "rejected")
SCALE: tuple[int, ...] = (1, 2, 3, 4, 5)
RUBRIC_DIMENSION = "personal_rubrics"
RUBRIC_MIN_DIFF = 2.0
OTHER_MAX_DIFF = 1.0
GOLD_TOLERANCE = 1
BOOTSTRAP_RESAMPLES = 1000
CI_LEVEL = 0.95

_COLUMNS = ["annotator", "pair", "domain", "role", "dimension", "value", "seconds"]

METHOD = {
    "unit": "pair: each annotator's ratings are averaged per pair and role first; every pair weighs the same",
    "ci": "95% percentile bootstrap over pairs (scipy.stats.bootstrap, 1000 resamples by default, numpy's seeded random generator, "
    "resampling whole pairs so chosen, rejected and their difference stay paired); "
    "no t-interval; CI is None (not enough data) with fewer than 2 pairs or when every pair has the same value",
    "test": "two-sided Wilcoxon signed-rank test on per-pair mean differences (chosen - rejected), "
    "scipy.stats.wilcoxon(zero_method='wilcox', method='auto'): exact null distribution without "
    "ties or zeros (n <= 50), exhaustive sign-flip permutation test when ties or zeros are present "
    "(n <= 13), otherwise the normal approximation with continuity and tie correction",
    "zero_differences": "zero_method='wilcox': pairs with a zero difference are dropped before ranking "
    "and counted as pairs with zero difference dropped; p is None when fewer than 2 non-zero differences remain",
    "effect_sizes": "matched-pairs rank-biserial correlation r = (R+ - R-) / (R+ + R-) over the "
    "average ranks of the non-zero |differences| (in [-1, 1], positive = chosen higher); "
    "effect size (Cohen's d_z) = mean difference / sample SD of differences (ddof=1), None when SD is 0",
    "agreement": "Krippendorff's alpha, ordinal level, value domain 1..5, units = (pair, role), "
    "coders = annotators, computed per dimension, pooled over both roles and within chosen answers and "
    "within rejected answers alone (the pooled alpha also counts the designed chosen/rejected contrast "
    "as agreement); percent agreement = share of annotator pairs "
    "within a unit that gave the same value, pooled over units rated by 2 or more annotators",
    "annotator_agreement": "per annotator, on units shared with others: share of ratings equal to the "
    "others' mean rounded half up, and mean absolute difference to the others' mean",
    "validation": "on pair means: valid when chosen - rejected on the rubric dimension is at least the campaign's "
    "minimum rubric gap and |chosen - rejected| is below the campaign's largest gap allowed on every other dimension",
    "gold": "a rating counts as correct when |value - expected| <= tolerance",
}


# --------------------------------------------------------------------------- helpers


def _frame(ratings: Any) -> pd.DataFrame:
    """Normalise ``ratings`` into a DataFrame with the columns of ``_COLUMNS``."""
    if isinstance(ratings, pd.DataFrame):
        df = ratings.copy()
    else:
        df = pd.DataFrame(list(ratings or []))
    if df.empty:
        return pd.DataFrame(
            {
                "annotator": pd.Series([], dtype=object),
                "pair": pd.Series([], dtype=object),
                "domain": pd.Series([], dtype=object),
                "role": pd.Series([], dtype=object),
                "dimension": pd.Series([], dtype=object),
                "value": pd.Series([], dtype="int64"),
                "seconds": pd.Series([], dtype="float64"),
            }
        )
    missing = [c for c in _COLUMNS if c != "seconds" and c not in df.columns]
    if missing:
        raise ValueError(f"ratings lack required keys: {', '.join(missing)}")
    if "seconds" not in df.columns:
        df["seconds"] = np.nan
    df = df[_COLUMNS].copy()
    for column in ("annotator", "pair", "domain", "role", "dimension"):
        df[column] = df[column].map(str).astype(object)
    bad_roles = sorted(set(df["role"]) - set(ROLES))
    if bad_roles:
        raise ValueError(f"role must be 'chosen' or 'rejected', got {bad_roles}")
    values = pd.to_numeric(df["value"], errors="coerce")
    ok = values.notna() & values.isin(SCALE)
    if not ok.all():
        bad = df.loc[~ok, "value"].tolist()[:5]
        raise ValueError(f"value must be an integer in 1..5, got {bad}")
    df["value"] = values.astype("int64")
    df["seconds"] = pd.to_numeric(df["seconds"], errors="coerce").astype("float64")
    # One domain per pair (the first seen) so groupings by pair never split a pair.
    df["domain"] = df["pair"].map(df.drop_duplicates("pair").set_index("pair")["domain"])
    # One rating per (annotator, pair, role, dimension): the last row wins.
    df = df.drop_duplicates(["annotator", "pair", "role", "dimension"], keep="last")
    return df.reset_index(drop=True)


def _restrict(df: pd.DataFrame, dimensions: Sequence[str] | None) -> pd.DataFrame:
    if dimensions is None:
        return df
    return df[df["dimension"].isin(list(dimensions))]


def _dims(dimensions: Sequence[str] | None) -> list[str]:
    return list(DIMENSIONS if dimensions is None else dimensions)


def _float(x: Any) -> float | None:
    """A JSON-safe float: None for None/NaN/inf."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(np.asarray(x, dtype=float) + 0.5)


def _fmt_threshold(x: float) -> str:
    return repr(float(x))


# --------------------------------------------------------------------------- 1. pair means


def _pair_table(df: pd.DataFrame) -> pd.DataFrame:
    """Integer rating sums and counts per (pair, domain, dimension) and role."""
    keys = ["pair", "domain", "dimension"]
    index = pd.MultiIndex.from_tuples([], names=keys)
    columns = ["chosen_sum", "chosen_n", "rejected_sum", "rejected_n", "n_annotators"]
    if df.empty:
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in columns}, index=index)
    agg = df.groupby(keys + ["role"])["value"].agg(["sum", "count"]).unstack("role", fill_value=0)
    table = pd.DataFrame(index=agg.index)
    for role in ROLES:
        table[f"{role}_sum"] = agg[("sum", role)] if ("sum", role) in agg.columns else 0
        table[f"{role}_n"] = agg[("count", role)] if ("count", role) in agg.columns else 0
    table["n_annotators"] = df.groupby(keys)["annotator"].nunique()
    return table.astype("int64").sort_index()


def _exact_diff(table: pd.DataFrame) -> pd.Series:
    """chosen mean - rejected mean as one correctly rounded division of integers.

    (sum_c * n_r - sum_r * n_c) / (n_c * n_r) is exact up to the final rounding, so two
    differences that are equal as fractions (13/3 - 7/3 and 2/1) are the same float and
    tie in rank tests and threshold comparisons.  NaN where a role is unrated.
    """
    num = table["chosen_sum"] * table["rejected_n"] - table["rejected_sum"] * table["chosen_n"]
    den = table["chosen_n"] * table["rejected_n"]
    return (num / den.where(den > 0)).astype(float)


def pair_means(ratings: Any) -> pd.DataFrame:
    """Per-pair mean rating of each role, annotators averaged per pair first.

    Returns a DataFrame indexed by (pair, domain, dimension), sorted, with columns

    - ``chosen``: mean over annotators of the chosen answer's rating (NaN if no one
      rated the chosen answer on that dimension),
    - ``rejected``: likewise for the rejected answer,
    - ``n_annotators``: number of distinct annotators who rated either role of that pair
      on that dimension.

    Duplicate ratings by one annotator count once (the last row); the mean is the plain
    arithmetic mean of the remaining integer ratings.
    """
    table = _pair_table(_frame(ratings))
    out = pd.DataFrame(index=table.index)
    for role in ROLES:
        n = table[f"{role}_n"]
        out[role] = (table[f"{role}_sum"] / n.where(n > 0)).astype(float)
    out["n_annotators"] = table["n_annotators"].astype("int64")
    return out


def _complete_pairs(df: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Pair means for one dimension, only pairs with both roles rated, plus an exact diff."""
    table = _pair_table(df[df["dimension"] == dimension])
    pm = pair_means(df[df["dimension"] == dimension])
    pm["diff"] = _exact_diff(table)
    return pm.dropna(subset=list(ROLES)).reset_index()


# --------------------------------------------------------------------------- 2. summary


def _bootstrap_ci(
    chosen: np.ndarray, rejected: np.ndarray, diff: np.ndarray, *, seed: int, resamples: int
) -> tuple[list | None, list | None, list | None]:
    """95% percentile CIs of the means of chosen, rejected and diff over the same resampled pairs
    (prblib.stats.metrics.bootstrap_over_items: scipy.stats.bootstrap, default_rng(seed))."""
    n = len(diff)
    if n < 2 or resamples < 1:
        return None, None, None
    columns = np.stack([chosen, rejected, diff])  # (3, n)
    low, high, _ = bootstrap_over_items(n, lambda idx: columns[:, idx].mean(axis=-1), resamples=resamples,
                                        seed=seed, confidence=CI_LEVEL)
    # A column whose pairs all have the same value gives that value on every resample: not
    # enough data for an interval (None), never the point [x, x].
    return tuple(None if np.ptp(column) == 0 else [float(lo), float(hi)]
                 for column, lo, hi in zip(columns, low, high))


def signed_rank_effect(diffs: Iterable[float]) -> dict:
    """Signed-rank sums and the matched-pairs rank-biserial correlation of ``diffs``.

    Zero differences are dropped (Wilcoxon's convention, like ``zero_method="wilcox"``);
    the absolute values of the remaining differences get average ranks (ties share the
    mean of the ranks they span); R+ and R- are the rank sums of the positive and the
    negative differences; r = (R+ - R-) / (R+ + R-), in [-1, 1], positive when chosen is
    rated higher.  r is None when no non-zero difference is left.
    """
    d = np.asarray(list(diffs), dtype=float)
    nonzero = d[d != 0]
    if nonzero.size == 0:
        return {"r_plus": 0.0, "r_minus": 0.0, "n_nonzero": 0, "rank_biserial": None}
    ranks = sps.rankdata(np.abs(nonzero), method="average")
    r_plus = float(ranks[nonzero > 0].sum())
    r_minus = float(ranks[nonzero < 0].sum())
    return {
        "r_plus": r_plus,
        "r_minus": r_minus,
        "n_nonzero": int(nonzero.size),
        "rank_biserial": (r_plus - r_minus) / (r_plus + r_minus),
    }


def _wilcoxon(diff: np.ndarray) -> dict:
    n_zero = int(np.sum(diff == 0))
    effect = signed_rank_effect(diff)
    n_nonzero = effect["n_nonzero"]
    result = {
        "statistic": None,
        "p_value": None,
        "method": None,
        "r_plus": effect["r_plus"],
        "r_minus": effect["r_minus"],
        "n_nonzero": n_nonzero,
        "n_zero_dropped": n_zero,
        "reason": None,
    }
    if len(diff) == 0:
        result["reason"] = "no pairs rated on both answers"
    elif n_nonzero == 0:
        result["reason"] = "every chosen-rejected difference is zero"
    elif n_nonzero < 2:
        result["reason"] = f"fewer than 2 non-zero differences ({n_nonzero} after dropping {n_zero} zero)"
    if result["reason"]:
        return result
    # Label the branch scipy's method="auto" takes, so the report says which p it shows.
    nz = np.abs(diff[diff != 0])
    has_ties = len(np.unique(nz)) < len(nz)
    if len(diff) > 50:
        method = "asymptotic"
    elif not (has_ties or n_zero > 0):
        method = "exact"
    elif len(diff) <= 13:
        method = "permutation (exhaustive sign flips)"
    else:
        method = "asymptotic"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = sps.wilcoxon(diff, zero_method="wilcox", alternative="two-sided", method="auto")
    result.update(statistic=_float(res.statistic), p_value=_float(res.pvalue), method=method)
    if result["p_value"] is None:
        result["reason"] = "scipy returned no p-value"
    return result


def _summarise(group: pd.DataFrame, *, seed: int, resamples: int) -> dict:
    chosen = group["chosen"].to_numpy(dtype=float)
    rejected = group["rejected"].to_numpy(dtype=float)
    diff = group["diff"].to_numpy(dtype=float)
    n = len(diff)
    chosen_ci, rejected_ci, diff_ci = _bootstrap_ci(chosen, rejected, diff, seed=seed, resamples=resamples)
    wilcoxon = _wilcoxon(diff)
    dz = None
    if n >= 2:
        sd = float(np.std(diff, ddof=1))
        if sd > 0:
            dz = float(np.mean(diff)) / sd
    return {
        "n_pairs": int(n),
        "chosen_mean": _float(chosen.mean()) if n else None,
        "chosen_ci": chosen_ci,
        "rejected_mean": _float(rejected.mean()) if n else None,
        "rejected_ci": rejected_ci,
        "mean_diff": _float(diff.mean()) if n else None,
        "diff_ci": diff_ci,
        "wilcoxon": wilcoxon,
        "rank_biserial": _float(signed_rank_effect(diff)["rank_biserial"]),
        "cohens_dz": _float(dz),
    }


def dimension_summary(
    ratings: Any,
    dimensions: Sequence[str] | None = None,
    *,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict:
    """Chosen vs rejected per dimension, overall and per domain, on per-pair means.

    Only pairs where both roles were rated on the dimension count.  Returns
    ``{dimension: {"overall": S, "by_domain": {domain: S}}}`` in ``dimensions`` order
    (domains sorted), where S is::

        n_pairs, chosen_mean, rejected_mean, mean_diff   (means of pair means; diff = chosen - rejected)
        chosen_ci, rejected_ci, diff_ci                  ([low, high] or None)
        wilcoxon: {statistic, p_value, method, r_plus, r_minus, n_nonzero, n_zero_dropped, reason}
        rank_biserial, cohens_dz

    Confidence intervals: 95% percentile bootstrap over pairs (no t-interval), by
    ``scipy.stats.bootstrap`` (``prblib.stats.metrics.bootstrap_over_items``).  Each
    group draws ``resamples`` resamples of whole pairs from ``numpy.random.default_rng(seed)``
    created afresh for that group, so a figure does not depend on which other groups exist;
    chosen, rejected and diff use the same resampled pairs.  With fewer than 2 pairs the
    CIs are None, and so is a CI whose pairs all share one value (not enough data: every
    resample would give that value).

    Test: ``scipy.stats.wilcoxon(diffs, zero_method="wilcox", method="auto")``, two-sided.
    Zero differences are dropped before ranking ("wilcox") and counted in
    ``n_zero_dropped``; ``statistic`` is scipy's min(R+, R-).  When no pair is left, every
    difference is zero, or fewer than 2 non-zero differences remain, ``p_value`` and
    ``statistic`` are None and ``reason`` says why.  ``method`` names the branch scipy's
    "auto" takes: "exact" (no ties, no zeros, n <= 50), "permutation (exhaustive sign
    flips)" (ties or zeros, n <= 13), else "asymptotic".

    Effect sizes: ``rank_biserial`` = (R+ - R-) / (R+ + R-) over average ranks of the
    non-zero |differences| (ties share average ranks; zeros dropped as in the test), in
    [-1, 1], positive = chosen higher, None with no non-zero difference.  ``cohens_dz`` =
    mean difference / sample SD of differences (ddof=1, zeros included), None when fewer
    than 2 pairs or the SD is 0.
    """
    df = _restrict(_frame(ratings), dimensions)
    out: dict = {}
    for dimension in _dims(dimensions):
        pairs = _complete_pairs(df, dimension)
        entry = {"overall": _summarise(pairs, seed=seed, resamples=resamples), "by_domain": {}}
        for domain in sorted(pairs["domain"].unique()) if len(pairs) else []:
            entry["by_domain"][str(domain)] = _summarise(
                pairs[pairs["domain"] == domain], seed=seed, resamples=resamples
            )
        out[dimension] = entry
    return out


# --------------------------------------------------------------------------- 3. agreement


def reliability_matrix(ratings: Any, dimension: str) -> tuple[np.ndarray, list[str], list[tuple[str, str]]]:
    """Coders x units matrix for one dimension: rows = annotators (sorted), columns =
    (pair, role) units (sorted), np.nan where an annotator did not rate a unit."""
    df = _frame(ratings)
    df = df[df["dimension"] == dimension]
    if df.empty:
        return np.empty((0, 0)), [], []
    wide = df.pivot(index="annotator", columns=["pair", "role"], values="value").sort_index()
    wide = wide.reindex(sorted(wide.columns), axis=1)
    return wide.to_numpy(dtype=float), [str(a) for a in wide.index], [tuple(map(str, c)) for c in wide.columns]


def _percent_agreement(df: pd.DataFrame) -> tuple[float | None, int, int]:
    """Pooled share of agreeing annotator pairs within units (pair, role)."""
    counts = df.groupby(["pair", "role", "value"]).size()
    per_unit = df.groupby(["pair", "role"]).size()
    shared = per_unit[per_unit >= 2]
    if shared.empty:
        return None, 0, 0
    total = int((shared * (shared - 1) // 2).sum())
    same_counts = counts[counts.index.droplevel("value").isin(shared.index)]
    same = int((same_counts * (same_counts - 1) // 2).sum())
    return same / total, int(len(shared)), total


def _ordinal_alpha(sub: pd.DataFrame, dimension: str) -> tuple[float | None, str | None]:
    """Krippendorff's ordinal alpha of one dimension's rows (value domain 1..5), or None and why."""
    n_annotators = int(sub["annotator"].nunique())
    _, n_units, _ = _percent_agreement(sub) if len(sub) else (None, 0, 0)
    if n_annotators < 2:
        return None, f"fewer than 2 annotators rated this dimension ({n_annotators})"
    if n_units == 0:
        return None, "no unit (pair, role) was rated by 2 or more annotators"
    matrix, _, _ = reliability_matrix(sub, dimension)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            value = krippendorff.alpha(reliability_data=matrix, level_of_measurement="ordinal",
                                       value_domain=list(SCALE))
    except (ValueError, ZeroDivisionError) as exc:
        return None, f"alpha undefined: {exc}"
    alpha = _float(value)
    if alpha is None:
        return None, "alpha undefined: no variation in the ratings (expected disagreement is 0)"
    return alpha, None


def agreement(ratings: Any, dimensions: Sequence[str] | None = None) -> dict:
    """Inter-annotator agreement per dimension.

    Returns ``{dimension: {alpha, alpha_reason, alpha_chosen, alpha_chosen_reason,
    alpha_rejected, alpha_rejected_reason, percent_agreement, n_units, n_comparisons,
    n_annotators}}``:

    - ``alpha``: Krippendorff's alpha, ``krippendorff.alpha(reliability_data=M,
      level_of_measurement="ordinal", value_domain=[1, 2, 3, 4, 5])`` with M the coders x
      units matrix of ``reliability_matrix`` (units = (pair, role), coders = annotators,
      np.nan for missing).  None, with ``alpha_reason``, when fewer than 2 annotators
      rated the dimension, no unit was rated by 2 or more annotators, or alpha is
      undefined because the pairable ratings show no variation (krippendorff raises or
      returns NaN).
    - ``alpha_chosen`` / ``alpha_rejected``: the same alpha over the chosen answers' units
      only / the rejected answers' only (None with a reason as above).  The pooled alpha
      counts the chosen/rejected contrast the benchmark was built to have as agreement (a
      chosen answer rated 5 and a rejected one rated 1 by everyone agree across units); within
      one role only the raters' agreement about answers of that kind is left.
    - ``percent_agreement``: over units rated by 2 or more annotators, the number of
      unordered annotator pairs within a unit that gave the same value divided by the
      number of such pairs, pooled over units (a unit with k raters contributes
      k(k-1)/2 pairs).  None when no unit has 2 ratings.
    - ``n_units``: units with 2 or more ratings; ``n_comparisons``: annotator pairs.

    Why both: alpha compares observed to expected disagreement.  When ratings bunch at
    the ends of the scale (chosen answers nearly all 5, rejected ones nearly all 1 on
    Personal Rubrics, or everything 5 on Factuality) the expected disagreement is tiny,
    so a handful of off-by-one ratings drives alpha towards 0 or below, and with no
    variation at all it is undefined, although raters agree almost always.  Percent
    agreement reports that raw agreement beside it.
    """
    df = _restrict(_frame(ratings), dimensions)
    out: dict = {}
    for dimension in _dims(dimensions):
        sub = df[df["dimension"] == dimension]
        n_annotators = int(sub["annotator"].nunique())
        pct, n_units, n_comparisons = _percent_agreement(sub) if len(sub) else (None, 0, 0)
        alpha, reason = _ordinal_alpha(sub, dimension)
        alpha_chosen, chosen_reason = _ordinal_alpha(sub[sub["role"] == "chosen"], dimension)
        alpha_rejected, rejected_reason = _ordinal_alpha(sub[sub["role"] == "rejected"], dimension)
        out[dimension] = {
            "alpha": alpha,
            "alpha_reason": reason,
            "alpha_chosen": alpha_chosen,
            "alpha_chosen_reason": chosen_reason,
            "alpha_rejected": alpha_rejected,
            "alpha_rejected_reason": rejected_reason,
            "percent_agreement": _float(pct),
            "n_units": n_units,
            "n_comparisons": n_comparisons,
            "n_annotators": n_annotators,
        }
    return out


# --------------------------------------------------------------------------- 4. per annotator


def _agreement_stats(part: pd.DataFrame) -> dict:
    n = int(len(part))
    if n == 0:
        return {"n_compared": 0, "exact_agreement": None, "mean_abs_diff": None}
    return {
        "n_compared": n,
        "exact_agreement": float(part["exact"].mean()),
        "mean_abs_diff": float(part["abs_diff"].mean()),
    }


def annotator_agreement(ratings: Any, dimensions: Sequence[str] | None = None) -> dict:
    """Each annotator against the others, on the ratings they share.

    For every rating (pair, role, dimension) that at least one other annotator also gave,
    the others' mean is the mean of the other annotators' values.  Returns
    ``{annotator: {n_shared_units, n_compared, exact_agreement, mean_abs_diff,
    by_dimension: {dimension: {n_compared, exact_agreement, mean_abs_diff}}}}``
    (annotators sorted), where

    - ``exact_agreement``: share of the annotator's ratings equal to the others' mean
      rounded half up (3.5 -> 4, 2.5 -> 3),
    - ``mean_abs_diff``: mean of |own value - others' mean| (unrounded),
    - ``n_shared_units``: number of (pair, role) units shared with someone else,
    - ``n_compared``: number of ratings compared.

    Figures are None when the annotator shares nothing.
    """
    df = _restrict(_frame(ratings), dimensions)
    dims = _dims(dimensions)
    out: dict = {}
    if df.empty:
        return out
    keys = ["pair", "role", "dimension"]
    grouped = df.groupby(keys)["value"]
    df = df.assign(unit_sum=grouped.transform("sum"), unit_n=grouped.transform("count"))
    shared = df[df["unit_n"] >= 2].copy()
    others = (shared["unit_sum"] - shared["value"]) / (shared["unit_n"] - 1)
    shared["exact"] = (shared["value"].to_numpy() == _round_half_up(others.to_numpy())).astype(float)
    shared["abs_diff"] = (shared["value"] - others).abs()
    for annotator in sorted(df["annotator"].unique()):
        mine = shared[shared["annotator"] == annotator]
        entry = {"n_shared_units": int(mine[["pair", "role"]].drop_duplicates().shape[0])}
        entry.update(_agreement_stats(mine))
        entry["by_dimension"] = {d: _agreement_stats(mine[mine["dimension"] == d]) for d in dims}
        out[str(annotator)] = entry
    return out


# --------------------------------------------------------------------------- 5. time


def _time_stats(seconds: pd.Series) -> dict:
    s = seconds.dropna()
    if s.empty:
        return {"median_seconds": None, "mean_seconds": None, "n_pairs": 0}
    return {"median_seconds": float(s.median()), "mean_seconds": float(s.mean()), "n_pairs": int(len(s))}


def time_per_item(ratings: Any) -> dict:
    """Active seconds per rated pair.

    A pair's time is taken once per (annotator, pair): the first non-missing ``seconds``
    of that annotator's rows for the pair; None/NaN are ignored (an (annotator, pair)
    without any time is not counted).  Returns
    ``{"overall": T, "by_annotator": {annotator: T}}`` with
    T = ``{median_seconds, mean_seconds, n_pairs}`` (None figures when n_pairs is 0).
    Every annotator present in ``ratings`` appears in by_annotator.
    """
    df = _frame(ratings)
    if df.empty:
        return {"overall": _time_stats(pd.Series([], dtype=float)), "by_annotator": {}}
    per_item = df.groupby(["annotator", "pair"])["seconds"].first()  # first non-NaN
    by_annotator = {
        str(a): _time_stats(per_item.xs(a, level="annotator")) for a in sorted(df["annotator"].unique())
    }
    return {"overall": _time_stats(per_item), "by_annotator": by_annotator}


# --------------------------------------------------------------------------- 6. gold


def gold_accuracy(
    ratings: Any, gold: Mapping[str, Mapping[str, Mapping[str, int]]] | None, tolerance: int = GOLD_TOLERANCE
) -> dict:
    """Per-annotator accuracy on gold pairs.

    ``gold`` maps pair -> {role -> {dimension -> expected int}}.  Every rating whose
    (pair, role, dimension) has an expected value counts; it is correct when
    |value - expected| <= tolerance.  Returns ``{annotator: {accuracy, n_correct, n}}`` for
    every annotator in ``ratings`` (sorted); accuracy is None when the annotator gave no
    gold rating (n = 0) or ``gold`` is empty/None.
    """
    df = _frame(ratings)
    expected_rows = [
        {"pair": str(p), "role": str(r), "dimension": str(d), "expected": int(v)}
        for p, roles in (gold or {}).items()
        for r, dims in roles.items()
        for d, v in dims.items()
    ]
    out: dict = {}
    if df.empty:
        return out
    if expected_rows:
        expected = pd.DataFrame(expected_rows).drop_duplicates(["pair", "role", "dimension"], keep="last")
        merged = df.merge(expected, on=["pair", "role", "dimension"], how="inner")
        merged["correct"] = (merged["value"] - merged["expected"]).abs() <= tolerance
    else:
        merged = df.iloc[0:0].assign(correct=pd.Series([], dtype=bool))
    for annotator in sorted(df["annotator"].unique()):
        mine = merged[merged["annotator"] == annotator]
        n = int(len(mine))
        n_correct = int(mine["correct"].sum()) if n else 0
        out[str(annotator)] = {"accuracy": (n_correct / n) if n else None, "n_correct": n_correct, "n": n}
    return out


# --------------------------------------------------------------------------- 7. validation


def validate_pairs(
    ratings: Any,
    dimensions: Sequence[str] | None = None,
    *,
    rubric_dimension: str = RUBRIC_DIMENSION,
    rubric_min_diff: float = RUBRIC_MIN_DIFF,
    other_max_diff: float = OTHER_MAX_DIFF,
) -> list[dict]:
    """Verdict per pair on its pair means (annotators averaged first).

    A pair is valid when diff = chosen - rejected on ``rubric_dimension`` is >=
    ``rubric_min_diff`` AND |diff| < ``other_max_diff`` on every other dimension of
    ``dimensions`` (``rubric_dimension`` is checked even if absent from ``dimensions``).
    Differences come from one division of integer sums (see ``_exact_diff``), so a
    difference of exactly 2 is 2.0, never 1.9999999999999996.  A dimension without a
    rating of both answers fails with "<dim>: not rated on both answers".  Reasons name each failing dimension with its numbers, e.g.
    "personal_rubrics: chosen-rejected 1.33 < 2.0" or "helpfulness: |diff| 1.50 >= 1.0".

    Returns a list sorted by pair of ``{pair, domain, valid, reasons, diffs,
    n_annotators}`` where diffs maps every checked dimension to chosen - rejected (None
    when not rated on both answers).
    """
    df = _frame(ratings)
    dims = _dims(dimensions)
    if rubric_dimension not in dims:
        dims = dims + [rubric_dimension]
    df = df[df["dimension"].isin(dims)]
    table = _pair_table(df)
    out: list[dict] = []
    if table.empty:
        return out
    table = table.assign(diff=_exact_diff(table))
    for (pair, domain), rows in table.groupby(level=["pair", "domain"], sort=True):
        rows = rows.droplevel(["pair", "domain"])
        diffs: dict[str, float | None] = {}
        reasons: list[str] = []
        for dim in dims:
            d = _float(rows.at[dim, "diff"]) if dim in rows.index else None
            diffs[dim] = d
            if d is None:
                reasons.append(f"{dim}: not rated on both answers")
            elif dim == rubric_dimension:
                if not d >= rubric_min_diff:
                    reasons.append(f"{dim}: chosen-rejected {d:.2f} < {_fmt_threshold(rubric_min_diff)}")
            elif not abs(d) < other_max_diff:
                reasons.append(f"{dim}: |diff| {abs(d):.2f} >= {_fmt_threshold(other_max_diff)}")
        out.append(
            {
                "pair": str(pair),
                "domain": str(domain),
                "valid": not reasons,
                "reasons": reasons,
                "diffs": diffs,
                "n_annotators": int(rows["n_annotators"].max()),
            }
        )
    return out


# --------------------------------------------------------------------------- 8. distribution


def rating_distribution(ratings: Any, dimensions: Sequence[str] | None = None) -> dict:
    """Counts of each value per dimension and role: ``{dimension: {"chosen": {"1": n, ...,
    "5": n}, "rejected": {...}}}``.  Keys are strings so the dict survives a JSON round
    trip unchanged; every value 1..5 is present (0 when unused).  Counts are ratings
    (one per annotator, pair, role, dimension), not pairs."""
    df = _restrict(_frame(ratings), dimensions)
    counts = df.groupby(["dimension", "role", "value"]).size()
    out: dict = {}
    for dimension in _dims(dimensions):
        out[dimension] = {
            role: {str(v): int(counts.get((dimension, role, v), 0)) for v in SCALE} for role in ROLES
        }
    return out


# --------------------------------------------------------------------------- 9. report


def _headline(summary: dict, rubric_dimension: str) -> dict:
    rubric = summary.get(rubric_dimension, {}).get("overall", {})
    others = {
        d: s["overall"]["mean_diff"]
        for d, s in summary.items()
        if d != rubric_dimension and s["overall"]["mean_diff"] is not None
    }
    worst = max(others, key=lambda d: abs(others[d])) if others else None
    return {
        "rubric_dimension": rubric_dimension,
        "rubric_chosen_mean": rubric.get("chosen_mean"),
        "rubric_rejected_mean": rubric.get("rejected_mean"),
        "rubric_mean_diff": rubric.get("mean_diff"),
        "max_abs_other_diff": abs(others[worst]) if worst else None,
        "max_abs_other_dimension": worst,
    }


def build_report(
    ratings: Any,
    *,
    dimensions: Sequence[str] | None = None,
    gold: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
    gold_tolerance: int = GOLD_TOLERANCE,
    rubric_dimension: str = RUBRIC_DIMENSION,
    rubric_min_diff: float = RUBRIC_MIN_DIFF,
    other_max_diff: float = OTHER_MAX_DIFF,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict:
    """Everything above as one JSON-serialisable dict (only dict, list, str, int, float,
    bool and None; no NaN).  Keys:

    - n_ratings, n_pairs, n_annotators: counts over the rows on ``dimensions`` (after
      dropping duplicate ratings),
    - dimensions: ``dimension_summary``,
    - headline: rubric-dimension chosen/rejected means and the largest |mean diff| on
      the other dimensions,
    - agreement: ``agreement``,
    - annotators: ``{annotator: {"agreement": ..., "time": ..., "gold": ...}}`` from
      ``annotator_agreement``, ``time_per_item`` and ``gold_accuracy`` (gold is None when
      no gold is given),
    - time: overall ``time_per_item`` figures {median_seconds, mean_seconds, n_pairs},
    - validation: {valid, invalid, rubric_dimension, rubric_min_diff, other_max_diff,
      pairs: ``validate_pairs``},
    - distribution: ``rating_distribution``,
    - method: short strings naming each method.

    Empty input gives zero counts, None figures and empty collections.
    """
    dims = _dims(dimensions)
    full = _frame(ratings)
    df = _restrict(full, dims)
    summary = dimension_summary(df, dims, seed=seed, resamples=resamples)
    times = time_per_item(df)
    agree = annotator_agreement(df, dims)
    golds = gold_accuracy(df, gold, tolerance=gold_tolerance) if gold else {}
    annotators = {
        str(a): {
            "agreement": agree.get(str(a)),
            "time": times["by_annotator"].get(str(a)),
            "gold": golds.get(str(a)) if gold else None,
        }
        for a in sorted(df["annotator"].unique())
    }
    pairs = validate_pairs(
        full, dims, rubric_dimension=rubric_dimension, rubric_min_diff=rubric_min_diff, other_max_diff=other_max_diff
    )
    n_valid = sum(1 for p in pairs if p["valid"])
    method = dict(METHOD)
    method["ci"] = method["ci"].replace("1000 resamples by default", f"{resamples} resamples, seed {seed}")
    method["gold"] = f"{METHOD['gold']} (tolerance {gold_tolerance})"
    report = {
        "n_ratings": int(len(df)),
        "n_pairs": int(df["pair"].nunique()),
        "n_annotators": int(df["annotator"].nunique()),
        "dimensions": summary,
        "headline": _headline(summary, rubric_dimension),
        "agreement": agreement(df, dims),
        "annotators": annotators,
        "time": times["overall"],
        "validation": {
            "valid": n_valid,
            "invalid": len(pairs) - n_valid,
            "rubric_dimension": rubric_dimension,
            "rubric_min_diff": float(rubric_min_diff),
            "other_max_diff": float(other_max_diff),
            "pairs": pairs,
        },
        "distribution": rating_distribution(df, dims),
        "method": method,
    }
    return _jsonable(report)


def _jsonable(x: Any) -> Any:
    """Turn numpy scalars into Python ones and NaN/inf into None, recursively."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return _float(x)
    return x


# --------------------------------------------------------------------------- 10. position bias

POSITION_BIAS_METHOD = (
    "per annotator: b = (mean of (chosen - rejected) over pairs where the chosen answer was shown as "
    "Response 1 - the same mean where it was shown as Response 2) / 2, in rating points; positive = "
    "Response 1 rated higher. If a rating is quality + b for the first position, the two means are q + b and "
    "q - b, so b is free of the chosen/rejected gap. None when either position has no pair; the overall figure "
    "averages the dimensions' differences per pair first"
)


def _bias(diffs: pd.Series, first: pd.Series) -> dict:
    n_first, n_second = int(first.sum()), int((~first).sum())
    bias = None
    if n_first and n_second:
        bias = float((diffs[first].mean() - diffs[~first].mean()) / 2.0)
    return {"bias": bias, "n_chosen_first": n_first, "n_chosen_second": n_second}


def position_bias(ratings: Iterable[Mapping[str, Any]], dimensions: Sequence[str] | None = None) -> dict:
    """How much each annotator favours the answer shown first (see POSITION_BIAS_METHOD).

    ``ratings``: rows as for the other functions plus ``position`` (1 or 2: where that
    row's role was shown). Returns ``{"overall": B, "by_annotator": {annotator: {"overall":
    B, "by_dimension": {dimension: B}}}}`` with B = ``{bias, n_chosen_first,
    n_chosen_second}`` (counts are pairs). Rows without a position are ignored; the last
    row of a repeated (annotator, pair, role, dimension) wins.
    """
    rows = [r for r in ratings if r.get("position") in (1, 2)]
    dims = _dims(dimensions)
    empty = {"bias": None, "n_chosen_first": 0, "n_chosen_second": 0}
    if not rows:
        return {"overall": dict(empty), "by_annotator": {}}
    df = pd.DataFrame(rows)
    df = df[df["dimension"].isin(dims)]
    df = df.assign(annotator=df["annotator"].map(str), pair=df["pair"].map(str))
    df = df.drop_duplicates(["annotator", "pair", "role", "dimension"], keep="last")
    wide = df.pivot_table(index=["annotator", "pair", "dimension"], columns="role", values="value", aggfunc="last")
    first = df[df["role"] == "chosen"].set_index(["annotator", "pair", "dimension"])["position"].eq(1)
    wide = wide.dropna(subset=[r for r in ROLES if r in wide.columns])
    if not set(ROLES) <= set(wide.columns) or wide.empty:
        return {"overall": dict(empty), "by_annotator": {}}
    wide = wide.assign(diff=wide["chosen"] - wide["rejected"], first=first.reindex(wide.index).fillna(False))
    per_pair = wide.groupby(level=["annotator", "pair"]).agg(diff=("diff", "mean"), first=("first", "first"))
    out = {"overall": _bias(per_pair["diff"], per_pair["first"].astype(bool)), "by_annotator": {}}
    for annotator in sorted(per_pair.index.get_level_values("annotator").unique()):
        mine = per_pair.xs(annotator, level="annotator")
        by_dim = {}
        for dim in dims:
            part = wide.xs(annotator, level="annotator")
            part = part[part.index.get_level_values("dimension") == dim]
            by_dim[dim] = _bias(part["diff"], part["first"].astype(bool)) if len(part) else dict(empty)
        out["by_annotator"][str(annotator)] = {"overall": _bias(mine["diff"], mine["first"].astype(bool)),
                                               "by_dimension": by_dim}
    return _jsonable(out)
