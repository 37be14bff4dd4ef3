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
setting and domain, correlations, reports) stay public: they describe many pairs at once.

The rule reads the campaigns through the ORM's reverse relations (`Benchmark.campaigns`,
`Campaign.assignments`) by name, so this module below the annotation app imports nothing of it.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from prbench.roles import ANNOTATOR, has_role

from .models import Benchmark


def per_pair_withheld(user: AbstractBaseUser | AnonymousUser, benchmark_id: int) -> str | None:
    """The one-line reason per-pair data of benchmark `benchmark_id` is withheld from `user`,
    or None when it is not (no open campaign on it, or the user is staff, or a signed-in user
    who neither has the annotator role nor holds an assignment in one of its open campaigns)."""
    if user.is_authenticated and user.is_staff:
        return None
    open_campaigns = Benchmark.objects.filter(pk=benchmark_id, campaigns__is_open=True)
    if not open_campaigns.exists():
        return None
    name = Benchmark.objects.filter(pk=benchmark_id).values_list("name", flat=True).first()
    why = (f"Per-pair results of benchmark '{name}' are withheld while a blind rating campaign on it is "
           "open")
    if not user.is_authenticated:
        return why + ": sign in as a researcher who does not rate in it."
    # One filter() call, so the open campaign and the assignment are the same campaign.
    rates = has_role(user, ANNOTATOR) or Benchmark.objects.filter(
        pk=benchmark_id, campaigns__is_open=True, campaigns__assignments__annotator=user).exists()
    if rates:
        return why + ", and you may rate in it: they come back when the campaign closes."
    return None
