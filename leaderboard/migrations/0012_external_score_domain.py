from django.db import migrations, models


class Migration(migrations.Migration):
    """Reported figures per domain and RM type (issue 30: the paper's table)."""

    dependencies = [
        ("leaderboard", "0011_submission_attempts"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="externalbenchmarkscore", name="external_unique_submission"),
        migrations.RemoveConstraint(model_name="externalbenchmarkscore", name="external_unique_rm"),
        migrations.AddField(
            model_name="externalbenchmarkscore", name="domain",
            field=models.CharField(blank=True, default="", help_text="Empty: all pairs.", max_length=40),
        ),
        migrations.AddField(
            model_name="externalbenchmarkscore", name="rm_type",
            field=models.CharField(blank=True, default="", max_length=16,
                                   help_text="scalar | generative | fine_tuned | other (prblib/rewards/presets.py)."),
        ),
        migrations.AddConstraint(
            model_name="externalbenchmarkscore",
            constraint=models.UniqueConstraint(condition=models.Q(("submission__isnull", False)),
                                               fields=("benchmark", "setting", "domain", "submission"),
                                               name="external_unique_submission_domain"),
        ),
        migrations.AddConstraint(
            model_name="externalbenchmarkscore",
            constraint=models.UniqueConstraint(condition=models.Q(("submission__isnull", True)),
                                               fields=("benchmark", "setting", "domain", "source", "rm_name"),
                                               name="external_unique_rm_domain"),
        ),
    ]
