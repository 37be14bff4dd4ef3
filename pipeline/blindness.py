"""Who may read a benchmark's per-pair data while people rate its pairs blind.

A human-validation campaign shows annotators a pair's two answers without saying which one is
chosen. Per-pair data of the same benchmark gives that away: a published model's per-pair
scores next to the pair's id (the length baseline's scores are the answers' word counts, which
an annotator can count on the rating screen), the benchmark browser's answer key, a comparison's
list of the pairs two models disagree on. So while a campaign on a benchmark is open, its
per-pair data is withheld from

- anyone who may rate in it: members of the annotator group (any of them can rate any open
  campaign) and anyone who holds an assignment in it, even a researcher;
- anonymous visitors (who could be either of those, signed out).

Staff see everything: they run the campaigns and the benchmarks. Aggregates (accuracy per
setting and domain, correlations, reports) stay public: they describe many pairs at once; the
per-bin reliability tables of a calibration do not (a bin holding one pair tells its label) and
are withheld with the rest (`metrics_shown`).

The rule is keyed on the pairs, not on a benchmark id: a benchmark holding any pair of a
benchmark under an open campaign (the same two answers, `models.pair_key`: another name or
version, another id or question, the labels swapped) is withheld as that benchmark is.

Reads are remembered: every per-pair answer served to a signed-in user is logged
(`per_pair_access` writes a `PerPairRead`), and the annotation room refuses to lease a pair to
someone who was shown it (`per_pair_read_refusal`, `pair_keys_read`), so rating after reading
is refused as reading while rating is.

The rule reads the campaigns through the ORM's reverse relations (`Benchmark.campaigns`,
`Campaign.assignments`) by name, so this module below the annotation app imports nothing of it.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from core.roles import ANNOTATOR, has_role

from .models import Benchmark, BenchmarkItem, PerPairRead


def _keys_of(benchmark_id: Any) -> QuerySet:
    """The pair keys of a benchmark's items (a subquery); items without a key match nothing."""
    return BenchmarkItem.objects.filter(benchmark_id=benchmark_id).exclude(pair_key="").values("pair_key")


def _sharing(benchmark_id: int, **campaigns: Any) -> dict[int, str]:
    """{id: name} of the benchmarks with an open campaign (narrowed by `campaigns` lookups on
    that campaign) that are `benchmark_id` itself or hold one of its pairs. One filter() call:
    the campaign open and the narrowing are the same campaign."""
    return dict(Benchmark.objects.filter(Q(pk=benchmark_id) | Q(items__pair_key__in=_keys_of(benchmark_id)),
                                         campaigns__is_open=True,
                                         **{f"campaigns__{k}": v for k, v in campaigns.items()})
                .values_list("pk", "name").distinct())


def per_pair_withheld(user: AbstractBaseUser | AnonymousUser, benchmark_id: int) -> str | None:
    """The one-line reason per-pair data of benchmark `benchmark_id` is withheld from `user`,
    or None when it is not (no open campaign on it or on a benchmark sharing one of its pairs,
    or the user is staff, or a signed-in user who neither has the annotator role nor holds an
    assignment in such a campaign)."""
    if user.is_authenticated and user.is_staff:
        return None
    if not Benchmark.objects.filter(campaigns__is_open=True).exists():  # the common case: one cheap query
        return None
    if not user.is_authenticated or has_role(user, ANNOTATOR):
        rated = _sharing(benchmark_id)
    else:
        rated = _sharing(benchmark_id, assignments__annotator=user)
    if not rated:
        return None
    name = Benchmark.objects.filter(pk=benchmark_id).values_list("name", flat=True).first()
    if benchmark_id in rated:
        why = f"Per-pair results of benchmark '{name}' are withheld while a blind rating campaign on it is open"
    else:
        why = (f"Per-pair results of benchmark '{name}' are withheld while a blind rating campaign on benchmark "
               f"'{min(rated.values())}', which holds the same pairs, is open")
    if not user.is_authenticated:
        return why + ": sign in as a researcher who does not rate in it."
    return why + ", and you may rate in it: they come back when the campaign closes."


def per_pair_access(user: AbstractBaseUser | AnonymousUser, benchmark_id: int, *, what: str,
                    pair_key: str = "") -> str | None:
    """What a view serving per-pair data calls before reading a row: the reason it is withheld
    (per_pair_withheld), or None after logging that `user` was shown `what` of the benchmark
    (`pair_key`: one pair's key for a one-pair page; blank: every pair). Anonymous reads are
    not logged (nobody to refuse later). One UPDATE, or an INSERT the first time."""
    withheld = per_pair_withheld(user, benchmark_id)
    if withheld or not user.is_authenticated:
        return withheld
    seen = PerPairRead.objects.filter(user_id=user.pk, benchmark_id=benchmark_id, pair_key=pair_key)
    if not seen.update(last_read_at=timezone.now()):
        try:
            with transaction.atomic():
                PerPairRead.objects.create(user_id=user.pk, benchmark_id=benchmark_id, pair_key=pair_key,
                                           what=what[:60])
        except IntegrityError:  # a concurrent request of theirs logged it first
            pass
    return None


def _whole_reads(user: AbstractBaseUser, benchmark_id: int | None = None, ref: str = "benchmark_id") -> QuerySet:
    """`user`'s reads of every pair of benchmark `benchmark_id` or of a benchmark holding one of
    its pairs; with benchmark_id None, of the benchmark at `ref` of the row this is a subquery of
    (a Campaign's "benchmark_id", an Assignment's "campaign__benchmark_id")."""
    if benchmark_id is None:  # from inside a subquery of the outer query
        own, campaign_keys = OuterRef(ref), _keys_of(OuterRef(OuterRef(OuterRef(ref))))
    else:
        own, campaign_keys = benchmark_id, _keys_of(benchmark_id)
    shares = BenchmarkItem.objects.filter(benchmark_id=OuterRef("benchmark_id"), pair_key__in=campaign_keys)
    return PerPairRead.objects.filter(user_id=user.pk, pair_key="").filter(Q(benchmark_id=own) | Exists(shares))


def per_pair_read_exists(user: AbstractBaseUser, ref: str = "benchmark_id") -> Exists:
    """An annotation for a Campaign queryset (or, with `ref` "campaign__benchmark_id", an
    Assignment queryset): whether `user` was shown every pair of a benchmark holding pairs of
    the campaign's benchmark (then per_pair_read_refusal says so)."""
    return Exists(_whole_reads(user, ref=ref))


def per_pair_read_refusal(user: AbstractBaseUser, benchmark_id: int) -> str | None:
    """Why `user` may not rate pairs of benchmark `benchmark_id` blind: they were shown per-pair
    data (model predictions, exports, the items API) of it or of a benchmark holding its pairs.
    None when they were not."""
    read = _whole_reads(user, benchmark_id).select_related("benchmark").order_by("first_read_at").first()
    if read is None:
        return None
    return (f"You were shown per-pair results of benchmark '{read.benchmark.name}' ({read.what}, "
            f"{read.first_read_at:%Y-%m-%d}), which hold the pairs of this campaign, so you cannot rate them blind; "
            "staff can point you to another campaign.")


def pair_keys_read(user: AbstractBaseUser) -> QuerySet:
    """The keys of the single pairs `user` was shown on a one-pair page (a subquery): those
    pairs are never leased to them."""
    return PerPairRead.objects.filter(user_id=user.pk).exclude(pair_key="").values("pair_key")


def pair_read_exists(user: AbstractBaseUser, ref: str = "pair__item__pair_key") -> Exists:
    """An annotation for an Assignment queryset (`ref`: the path to its item's pair key):
    whether `user` was shown that one pair on a one-pair page (then pair_read_refusal says so)."""
    return Exists(pair_keys_read(user).filter(pair_key=OuterRef(ref)))


def pair_read_refusal(user: AbstractBaseUser, key: str) -> str | None:
    """Why `user` may not rate (or revise) the pair whose `models.pair_key` is `key` blind:
    they were shown it on a one-pair page (the benchmark browser's item page) of any benchmark.
    None when they were not, or when the pair has no key."""
    if not key:
        return None
    read = (PerPairRead.objects.filter(user_id=user.pk, pair_key=key).select_related("benchmark")
            .order_by("first_read_at").first())
    if read is None:
        return None
    return (f"You were shown this pair with its answer key ({read.what} of benchmark '{read.benchmark.name}', "
            f"{read.first_read_at:%Y-%m-%d}), so you cannot rate it blind; it is not offered to you again.")


# Keys of a calibration (prblib.stats.correlation.calibration / verdict_calibration) that list
# single bins; a bin of one pair gives its label away to anyone who can compute its score.
_PER_BIN = ("reliability",)


def metrics_shown(metrics: dict | None, withheld: str | None) -> dict | None:
    """A run's metrics as `withheld` allows: unchanged when None, else with the calibration's
    per-bin reliability tables (its own and raw's) replaced by None and `withheld` as the
    calibration's `withheld` reason. The summary figures (ECE, Brier, slope) stay."""
    if not withheld or not isinstance(metrics, dict) or not isinstance(metrics.get("calibration"), dict):
        return metrics
    calibration = {k: (None if k in _PER_BIN else v) for k, v in metrics["calibration"].items()}
    if isinstance(calibration.get("raw"), dict):
        calibration["raw"] = {k: (None if k in _PER_BIN else v) for k, v in calibration["raw"].items()}
    calibration["withheld"] = withheld
    return {**metrics, "calibration": calibration}
