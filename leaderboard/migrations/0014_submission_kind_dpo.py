# The dpo kind (issue 30): Submission.kind's choices follow prblib.registry.KINDS.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0013_bon_run_protocol'),
    ]

    operations = [
        migrations.AlterField(
            model_name='submission',
            name='kind',
            field=models.CharField(choices=[('scalar', 'Scalar (sequence classification)'), ('pairwise', 'Generative judge, pairwise'), ('pointwise', 'Generative judge, pointwise'), ('scores', 'Uploaded scores'), ('pgenrm', 'P-GenRM personalised judge'), ('dpo', 'DPO implicit reward (policy vs reference)')], max_length=16),
        ),
    ]
