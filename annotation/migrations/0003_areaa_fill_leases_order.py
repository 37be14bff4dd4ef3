from django.db import migrations
from django.db.models import F, OuterRef, Subquery

from annotation.ordering import stratify


def forwards(apps, schema_editor):
    """Fill the new columns of existing campaigns: each assignment's campaign, the order's
    strata, and at most one live lease per annotator and campaign (older extras expire and
    give their slot back, as the lease sweep would)."""
    Assignment = apps.get_model("annotation", "Assignment")
    Campaign = apps.get_model("annotation", "Campaign")
    CampaignPair = apps.get_model("annotation", "CampaignPair")
    Assignment.objects.update(campaign_id=Subquery(
        CampaignPair.objects.filter(pk=OuterRef("pair_id")).values("campaign_id")[:1]))
    seen = set()
    for pk, campaign_id, annotator_id, pair_id in (Assignment.objects.filter(status="leased")
                                                   .order_by("-leased_at", "-pk")
                                                   .values_list("pk", "campaign_id", "annotator_id", "pair_id")):
        if (campaign_id, annotator_id) in seen:
            Assignment.objects.filter(pk=pk).update(status="expired")
            CampaignPair.objects.filter(pk=pair_id, taken__gt=0).update(taken=F("taken") - 1)
        seen.add((campaign_id, annotator_id))
    for campaign in Campaign.objects.all():
        pairs = list(CampaignPair.objects.filter(campaign=campaign).values_list("pk", "item__domain"))
        strata, places = stratify(pairs, campaign_id=campaign.pk)
        Campaign.objects.filter(pk=campaign.pk).update(strata=strata)
        for pk, (domain_index, stratum_round) in places.items():
            CampaignPair.objects.filter(pk=pk).update(domain_index=domain_index, stratum_round=stratum_round)


class Migration(migrations.Migration):

    dependencies = [('annotation', '0002_areaa_leases_order_revisions')]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
