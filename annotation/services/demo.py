"""Demo data for `seed_demo`: ratings from two demo annotators, so the demo report has
something to show."""

from __future__ import annotations

import random

from django.contrib.auth.models import Group, User

from core.roles import ANNOTATOR

from ..models import Campaign, Rating
from ..selectors import rubric_dimension
from .leases import assignment_next
from .ratings import rating_submit


DEMO_ANNOTATORS = ("demo-annotator-1", "demo-annotator-2")


def campaign_seed_demo_ratings(*, campaign: Campaign, pairs: int | None = None) -> int:
    """Ratings from two demo annotator accounts (no usable password) on the first `pairs`
    pairs each gets (None: every pair it is offered), so the demo report has something to show:
    with every pair rated by both, each pair has the ratings validation needs, on any database. Values are synthetic and
    seeded: chosen answers score high on the rubric dimension and rejected ones low, other
    dimensions alike with a little noise, so most pairs pass validation and some fail.
    Idempotent: an annotator who already rated is left alone. Returns ratings added."""
    group, _ = Group.objects.get_or_create(name=ANNOTATOR)
    rubric = rubric_dimension(campaign)
    added = 0
    for i, username in enumerate(DEMO_ANNOTATORS):
        user, created = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        user.groups.add(group)
        if Rating.objects.filter(campaign=campaign, annotator=user).exists():
            continue
        rng = random.Random(f"prbench-demo:{campaign.pk}:{i}")
        for _ in range(pairs if pairs is not None else campaign.pairs.count()):
            lease = assignment_next(user=user, campaign_id=campaign.pk)
            if lease is None:
                break
            chosen, rejected = {}, {}
            for key in campaign.dimension_keys:
                if key == rubric:
                    chosen[key], rejected[key] = rng.choice((5, 5, 4, 3)), rng.choice((1, 1, 2, 3))
                else:
                    chosen[key] = rng.choice((4, 4, 5))
                    rejected[key] = max(1, min(5, chosen[key] + rng.choice((0, 0, 0, -1, 1, -2))))
            shown = {"1": chosen, "2": rejected} if lease.assignment.chosen_first else {"1": rejected, "2": chosen}
            rating_submit(user=user, token=lease.assignment.token, ratings=shown,
                          seconds=round(rng.uniform(40, 180), 1))
            added += 1
    return added
