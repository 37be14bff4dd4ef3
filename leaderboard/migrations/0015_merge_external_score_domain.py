from django.db import migrations


class Migration(migrations.Migration):
    """Joins the reported-figures migration (issue 30, committed first as 0012) with the chain
    0012_outcome_identity -> 0013 -> 0014 made beside it."""

    dependencies = [
        ("leaderboard", "0012_external_score_domain"),
        ("leaderboard", "0014_submission_kind_dpo"),
    ]

    operations = []
