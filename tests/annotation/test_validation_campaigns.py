"""Validation verdicts keep their campaign, and recording weaker ones over stronger ones asks
first (issue 28, fault 9): "Record validation" from a campaign with one rating per pair used to
replace verdicts from a three-annotator campaign without a word."""

import pytest
from django.core.management import CommandError, call_command

from annotation.services.campaigns import campaign_create
from annotation.services.leases import assignment_next
from annotation.services.ratings import rating_submit
from annotation.services.reports import WeakerVerdicts, campaign_record_validation
from pipeline.models import BenchmarkItem
from tests.annotation.test_report import rated_campaign  # noqa: F401 (3 annotators x the same 6 pairs)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def one_rating_campaign(staff_user):
    """A second campaign on the same benchmark: one annotator rates every pair once, rubric gap 4."""
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=1,
                               name="quick pass", target_per_annotator=30)
    user = UserFactory(roles=["annotator"])
    while (lease := assignment_next(user=user, campaign_id=campaign.pk)) is not None:
        a = lease.assignment
        chosen = {"factuality": 4, "relevance": 4, "helpfulness": 4, "personal_rubrics": 5}
        rejected = {"factuality": 4, "relevance": 4, "helpfulness": 4, "personal_rubrics": 1}
        first, second = (chosen, rejected) if a.chosen_first else (rejected, chosen)
        rating_submit(user=user, token=a.token, ratings={"1": first, "2": second}, seconds=5)
    return campaign


def test_weaker_verdicts_ask_first_and_every_verdict_keeps_its_campaign(rated_campaign, staff_user, client):  # noqa: F811
    strong = campaign_record_validation(campaign=rated_campaign)
    assert strong == {"valid": 5, "invalid": 1}
    rated = {i.source_id: i.validation for i in BenchmarkItem.objects.exclude(validation__isnull=True)}
    assert len(rated) == 6 and {v["campaign"] for v in rated.values()} == {rated_campaign.pk}
    assert {v["n_annotators"] for v in rated.values()} == {3}

    quick = one_rating_campaign(staff_user)
    with pytest.raises(WeakerVerdicts) as refused:
        campaign_record_validation(campaign=quick)
    assert refused.value.pairs == 6 and refused.value.stronger == {f"campaign {rated_campaign.pk} (sample validation)": 3}
    assert "as few as 1 rating(s) per pair" in str(refused.value)
    # Nothing was written: the six three-annotator verdicts are untouched, the other 24 pairs still have none.
    assert {i.source_id: i.validation for i in BenchmarkItem.objects.exclude(validation__isnull=True)} == rated

    client.force_login(staff_user)
    page = client.post(f"/annotation/campaigns/{quick.pk}/validate/")
    assert page.status_code == 409 and b"Record them anyway" in page.content and b'name="confirm"' in page.content
    assert BenchmarkItem.objects.exclude(validation__isnull=True).count() == 6
    with pytest.raises(CommandError, match=r"6 pair\(s\) hold verdicts from .*--confirm records them"):
        call_command("annotation_report", "--campaign", str(quick.pk), "--record-validation")

    done = client.post(f"/annotation/campaigns/{quick.pk}/validate/", {"confirm": "1"})
    assert done.status_code == 302
    after = {i.source_id: i.validation for i in BenchmarkItem.objects.exclude(validation__isnull=True)}
    assert len(after) == 30 and {v["campaign"] for v in after.values()} == {quick.pk}
    for source_id, old in rated.items():  # the earlier campaign's verdict stays beside the new one
        assert after[source_id]["n_annotators"] == 1
        assert after[source_id]["earlier"] == {old["source"]: old}

    # The stronger campaign recorded again over the weaker one: no question asked.
    assert campaign_record_validation(campaign=rated_campaign) == {"valid": 5, "invalid": 1}
    back = BenchmarkItem.objects.get(source_id=next(iter(rated))).validation
    assert back["campaign"] == rated_campaign.pk and back["n_annotators"] == 3
    assert set(back["earlier"]) == {f"campaign {quick.pk} (quick pass)"}
