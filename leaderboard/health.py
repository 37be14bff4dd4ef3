"""Benchmark health: which pairs of a benchmark version are suspect, from stored results only.

Pure functions over plain data (no Django): `pair_health` takes the pairs and the published
results' per-pair outcomes and returns every figure the health page, its API and its CSV show;
`leaderboard_without` recomputes the ranking without a set of pairs. Nothing here re-runs a
model: a result is a mapping {pair key: right?} as stored in PairScore.correct (a tie counts as
not right, as in the leaderboard's accuracy).

Definitions (one setting at a time; R = the published results in that setting, each result r
with accuracy a_r = share of the pairs it scored that it got right):

- right(i) = number of results in R right on pair i; share(i) = right(i) / n(i), n(i) the
  results that scored i (unweighted).
- weighted share(i) = sum_r a_r * c_ri / sum_r a_r: each result weighs by its accuracy, so a
  pair strong RMs miss scores lower than one weak RMs miss (Sigma a_r = 0: undefined).
- discrimination(i): the item-rest point-biserial correlation, the Pearson correlation across
  results between c_ri (1 right, 0 not) and the result's accuracy on the *other* pairs,
  (S_r - c_ri) / (n_r - 1), S_r its number right. Item-rest rather than item-total because the
  total contains the item itself, which inflates the correlation (most with few pairs);
  see Crocker & Algina, "Introduction to Classical and Modern Test Theory" (1986), ch. 14.
  Undefined (None) with fewer than 3 results or when every result (or every rest score) is
  the same on the pair.
- length ratio(i) = words(chosen) / max(words(rejected), 1), words by whitespace, as the
  benchmark statistics count them.

Flags (FLAGS gives each rule in words; a setting-bound rule holds when it holds in any setting,
and the pair records in which):

- strong_wrong, "most strong RMs wrong": the strong results are those whose accuracy is at
  least the median accuracy of the setting's results; at least MIN_STRONG of them scored the
  pair and more than half of those are not right on it.
- negative_discrimination, "negatively discriminating": discrimination <= NEGATIVE_DISCRIMINATION
  with at least MIN_RESULTS_DISCRIMINATION results: better RMs are *less* often right here.
- humans_disagree, "humans disagree with the label": the pair's recorded human verdict is
  invalid, or its rating gap (chosen minus rejected on the rubric dimension, annotators of its
  latest campaign averaged) is <= 0.
- length_decides, "length decides it": the length ratio is outside LENGTH_BAND (the band
  builds keep) and more than half the results side with the longer answer: right when the
  chosen answer is the longer one, not right when the rejected one is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_STRONG = 2
NEGATIVE_DISCRIMINATION = -0.2
MIN_RESULTS_DISCRIMINATION = 5
LENGTH_BAND = (0.8, 1.25)
DECIMALS = 4  # figures are rounded to this many decimals (the page shows 2 or 3)

FLAGS: dict[str, dict[str, str]] = {
    "strong_wrong": {
        "label": "most strong RMs wrong",
        "rule": (f"Among the results whose accuracy is at least the setting's median (the strong ones), at least "
                 f"{MIN_STRONG} scored the pair and more than half of them are not right on it."),
    },
    "negative_discrimination": {
        "label": "negatively discriminating",
        "rule": (f"Item-rest point-biserial correlation at most {NEGATIVE_DISCRIMINATION} with at least "
                 f"{MIN_RESULTS_DISCRIMINATION} results: the better an RM does on the other pairs, the less often "
                 "it is right on this one."),
    },
    "humans_disagree": {
        "label": "humans disagree with the label",
        "rule": ("The human verdict recorded on the pair is invalid, or annotators rate the rejected answer at least "
                 "as high as the chosen one on the rubric dimension (rating gap <= 0)."),
    },
    "length_decides": {
        "label": "length decides it",
        "rule": (f"The chosen/rejected word ratio is outside {LENGTH_BAND[0]}-{LENGTH_BAND[1]} (the band builds "
                 "keep) and more than half the results side with the longer answer (right when the chosen one is "
                 "longer, not right when the rejected one is)."),
    },
}

DEFINITIONS: dict[str, str] = {
    "right": "Published results in the setting that preferred the chosen answer (a tie is not right).",
    "share": "right / results that scored the pair (unweighted).",
    "weighted_share": "Sum over results of accuracy x right, divided by the sum of their accuracies: results weigh "
                      "by their accuracy on the whole benchmark.",
    "discrimination": "Item-rest point-biserial correlation across results: Pearson r between being right on this "
                      "pair (1/0) and accuracy on the other pairs. Undefined with fewer than 3 results or no "
                      "variation.",
    "length_ratio": "Words in the chosen answer / words in the rejected answer (whitespace-separated).",
    "rejected_variant": "The rubric-avoid prompt that produced the rejected answer (built benchmarks), or the "
                        "variant the source file names; 'not recorded' otherwise.",
    "verdict": "The human validation verdict recorded on the pair (valid / invalid), if any.",
    "rating_gap": "Chosen minus rejected on the rubric dimension, mean over the annotators of the latest campaign "
                  "that rated the pair.",
    "accuracy_spread": "Per setting: the results' accuracies (min, max, mean, population standard deviation).",
    "rank": "Competition ranking by accuracy (1 = best; equal accuracies share the better rank).",
    "rank_change": "Rank with all pairs minus rank without the flagged pairs: positive means the model moves up.",
}

NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Pair:
    """One benchmark pair as health reads it. `key` identifies it in the results (the item's
    primary key); `verdict` None (no verdict), True (valid) or False (invalid); `gap` the
    rating gap in rating points (None: not rated)."""

    key: int
    source_id: str
    domain: str
    chosen_words: int
    rejected_words: int
    variant: str = NOT_RECORDED
    verdict: bool | None = None
    gap: float | None = None


@dataclass(frozen=True)
class Result:
    """One published result: a submission evaluated in one setting. `correct` maps pair keys
    to whether it was right; pairs it did not score are absent."""

    key: int
    name: str
    setting: str
    correct: Mapping[int, bool] = field(default_factory=dict)


def _round(value: float | None) -> float | None:
    if value is None or not np.isfinite(value):
        return None
    return round(float(value), DECIMALS)


def length_ratio(chosen_words: int, rejected_words: int) -> float:
    """words(chosen) / max(words(rejected), 1): the benchmark statistics' ratio (dimensionless)."""
    return chosen_words / max(rejected_words, 1)


def _setting_matrix(pairs: Sequence[Pair], results: Sequence[Result]) -> tuple[np.ndarray, np.ndarray]:
    """(C, M), both results x pairs: C[r, i] = 1.0 when result r is right on pair i, M[r, i]
    whether r scored i."""
    index = {p.key: i for i, p in enumerate(pairs)}
    c = np.zeros((len(results), len(pairs)))
    m = np.zeros((len(results), len(pairs)), dtype=bool)
    for r, result in enumerate(results):
        for key, right in result.correct.items():
            i = index.get(key)
            if i is not None:
                m[r, i] = True
                c[r, i] = 1.0 if right else 0.0
    return c, m


def _item_rest(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Item-rest point-biserial correlation per pair (NaN where undefined), results x pairs in."""
    scored = m.sum(axis=1, keepdims=True).astype(float)  # n_r
    total = (c * m).sum(axis=1, keepdims=True)  # S_r
    with np.errstate(invalid="ignore", divide="ignore"):
        rest = np.where(m, (total - c) / (scored - 1), np.nan)  # accuracy on the other pairs
    n = m.sum(axis=0).astype(float)
    x = np.where(m, c, 0.0)
    y = np.where(m, rest, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = x.sum(axis=0) / n
        my = y.sum(axis=0) / n
        dx = np.where(m, x - mx, 0.0)
        dy = np.where(m, y - my, 0.0)
        sxy = (dx * dy).sum(axis=0)
        sxx = (dx * dx).sum(axis=0)
        syy = (dy * dy).sum(axis=0)
        r = sxy / np.sqrt(sxx * syy)
    tiny = 1e-12
    r[(n < 3) | (sxx <= tiny) | (syy <= tiny)] = np.nan
    return np.clip(r, -1.0, 1.0)


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def pair_health(pairs: Sequence[Pair], results: Sequence[Result]) -> dict[str, Any]:
    """Every pair's health figures and flags (the summary is `summary`, both: `health_report`).

    pairs: the benchmark's pairs in benchmark order; results: the published results of any
    settings. Returns {settings: [names, in first-seen order], results: {setting: [{key, name,
    accuracy, n}]}, spread: {setting: {results, min, max, mean, sd}} of the results' accuracies
    (sd: population standard deviation), pairs: [{key, id, domain, length_ratio, chosen_words, rejected_words,
    variant, verdict, gap, settings: {setting: {n, right, share, weighted_share,
    discrimination, strong_n, strong_wrong}}, flags: [flag names], flag_settings: {flag:
    [settings]}}], flags: FLAGS, definitions: DEFINITIONS}.
    Figures are rounded to DECIMALS; undefined ones are None."""
    settings: list[str] = []
    by_setting: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        if result.setting not in by_setting:
            settings.append(result.setting)
        by_setting[result.setting].append(result)

    rows = [{"key": p.key, "id": p.source_id, "domain": p.domain, "chosen_words": p.chosen_words,
             "rejected_words": p.rejected_words,
             "length_ratio": _round(length_ratio(p.chosen_words, p.rejected_words)), "variant": p.variant,
             "verdict": p.verdict, "gap": _round(p.gap), "settings": {}, "flag_settings": {}} for p in pairs]
    result_rows: dict[str, list[dict[str, Any]]] = {}
    spread: dict[str, dict[str, Any]] = {}
    low, high = LENGTH_BAND
    for setting in settings:
        group = by_setting[setting]
        c, m = _setting_matrix(pairs, group)
        scored = m.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            accuracy = np.where(scored > 0, (c * m).sum(axis=1) / np.maximum(scored, 1), np.nan)
        result_rows[setting] = [{"key": r.key, "name": r.name, "accuracy": _round(a), "n": int(n)}
                                for r, a, n in zip(group, accuracy, scored)]
        known = accuracy[np.isfinite(accuracy)]
        spread[setting] = {"results": len(group),
                           **{name: _round(getattr(np, name)(known)) if known.size else None
                              for name in ("min", "max", "mean")},
                           "sd": _round(np.std(known)) if known.size else None}
        weights = np.where(np.isfinite(accuracy), accuracy, 0.0)[:, None]
        n = m.sum(axis=0)
        right = (c * m).sum(axis=0)
        wsum = (weights * m).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = right / n
            weighted = (weights * c * m).sum(axis=0) / wsum
        weighted[wsum <= 0] = np.nan
        discrimination = _item_rest(c, m)
        finite = [float(a) for a in accuracy if np.isfinite(a)]
        strong = (accuracy >= _median(finite)) if finite else np.zeros(len(group), dtype=bool)
        strong_m = m & strong[:, None]
        strong_n = strong_m.sum(axis=0)
        strong_wrong = (strong_m & (c == 0.0)).sum(axis=0)
        for i, row in enumerate(rows):
            if n[i] == 0:
                continue
            row["settings"][setting] = {
                "n": int(n[i]), "right": int(right[i]), "share": _round(share[i]),
                "weighted_share": _round(weighted[i]), "discrimination": _round(discrimination[i]),
                "strong_n": int(strong_n[i]), "strong_wrong": int(strong_wrong[i])}
            holds = row["flag_settings"]
            if strong_n[i] >= MIN_STRONG and strong_wrong[i] * 2 > strong_n[i]:
                holds.setdefault("strong_wrong", []).append(setting)
            if (n[i] >= MIN_RESULTS_DISCRIMINATION and np.isfinite(discrimination[i])
                    and discrimination[i] <= NEGATIVE_DISCRIMINATION):
                holds.setdefault("negative_discrimination", []).append(setting)
            ratio = length_ratio(pairs[i].chosen_words, pairs[i].rejected_words)
            if not low <= ratio <= high:
                sides_longer = right[i] * 2 > n[i] if ratio > high else (n[i] - right[i]) * 2 > n[i]
                if sides_longer:
                    holds.setdefault("length_decides", []).append(setting)
    for p, row in zip(pairs, rows):
        if p.verdict is False or (p.gap is not None and p.gap <= 0):
            row["flag_settings"]["humans_disagree"] = []
        row["flags"] = [name for name in FLAGS if name in row["flag_settings"]]
    return {"settings": settings, "results": result_rows, "spread": spread, "pairs": rows, "flags": FLAGS,
            "definitions": DEFINITIONS}


def _ranks(accuracies: Sequence[float | None]) -> list[int | None]:
    """Competition ranks (1 = best, ties share the better rank); None for an undefined accuracy."""
    known = sorted((a for a in accuracies if a is not None), reverse=True)
    return [None if a is None else 1 + sum(1 for b in known if b > a) for a in accuracies]


def leaderboard_without(results: Sequence[Result], dropped: Iterable[int], pairs: Sequence[int]) -> list[dict[str, Any]]:
    """The results of one setting ranked on all `pairs` and on the pairs outside `dropped`.

    Returns [{key, name, accuracy, rank, n, accuracy_without, rank_without, n_without,
    rank_change}] in the original rank order (then name); rank_change = rank - rank_without
    (positive: moves up). Accuracies are shares of the scored pairs that are right."""
    keep = set(pairs) - set(dropped)
    everything = set(pairs)
    rows = []
    for result in results:
        scored = [k for k in result.correct if k in everything]
        kept = [k for k in scored if k in keep]
        rows.append({"key": result.key, "name": result.name,
                     "accuracy": _round(sum(result.correct[k] for k in scored) / len(scored)) if scored else None,
                     "n": len(scored),
                     "accuracy_without": _round(sum(result.correct[k] for k in kept) / len(kept)) if kept else None,
                     "n_without": len(kept)})
    for name, ranks in (("rank", _ranks([r["accuracy"] for r in rows])),
                        ("rank_without", _ranks([r["accuracy_without"] for r in rows]))):
        for row, rank in zip(rows, ranks):
            row[name] = rank
    for row in rows:
        row["rank_change"] = (row["rank"] - row["rank_without"]
                              if row["rank"] is not None and row["rank_without"] is not None else None)
    rows.sort(key=lambda r: (r["rank"] if r["rank"] is not None else len(rows) + 1, r["name"]))
    return rows


def _shares(rows: Sequence[dict[str, Any]], by: str) -> dict[str, dict[str, Any]]:
    """{group: {pairs, flagged, share, by_flag {flag: count}}} of pairs grouped by row[by]."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        g = groups.setdefault(str(row[by]), {"pairs": 0, "flagged": 0, "by_flag": {name: 0 for name in FLAGS}})
        g["pairs"] += 1
        g["flagged"] += bool(row["flags"])
        for name in row["flags"]:
            g["by_flag"][name] += 1
    for g in groups.values():
        g["share"] = _round(g["flagged"] / g["pairs"])
    return dict(sorted(groups.items()))


def summary(health: Mapping[str, Any], results: Sequence[Result]) -> dict[str, Any]:
    """The benchmark-level summary of `pair_health(pairs, results)`'s output: {pairs, flagged,
    by_flag {flag: count}, spread (pair_health's), by_domain, by_variant (see `_shares`),
    without {flag or "any": {dropped: pairs left out, settings: {setting: leaderboard_without
    rows}}}}."""
    rows = health["pairs"]
    keys = [r["key"] for r in rows]
    without: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name in [*FLAGS, "any"]:
        dropped = [r["key"] for r in rows if (r["flags"] if name == "any" else name in r["flags"])]
        without[name] = {"dropped": len(dropped), "settings": {}}
        for setting in health["settings"]:
            group = [r for r in results if r.setting == setting]
            without[name]["settings"][setting] = leaderboard_without(group, dropped, keys)
    return {"pairs": len(rows), "flagged": sum(1 for r in rows if r["flags"]),
            "by_flag": {name: sum(1 for r in rows if name in r["flags"]) for name in FLAGS},
            "spread": health["spread"], "by_domain": _shares(rows, "domain"), "by_variant": _shares(rows, "variant"),
            "without": without}


def health_report(pairs: Sequence[Pair], results: Sequence[Result]) -> dict[str, Any]:
    """`pair_health` with the benchmark-level summary under "summary" (`summary`): plain JSON
    (what the cache stores)."""
    health = pair_health(pairs, results)
    health["summary"] = summary(health, results)
    return health
