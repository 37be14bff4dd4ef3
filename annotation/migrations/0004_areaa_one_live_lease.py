import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [('annotation', '0003_areaa_fill_leases_order')]

    operations = [
        migrations.AlterField(
            model_name='assignment',
            name='campaign',
            field=models.ForeignKey(help_text="The pair's campaign (kept here so the database can allow one live lease per annotator and campaign).", on_delete=django.db.models.deletion.CASCADE, related_name='assignments', to='annotation.campaign'),
        ),
        migrations.AddIndex(
            model_name='assignment',
            index=models.Index(fields=['campaign', 'annotator', 'status'], name='annotation__campaig_4300cf_idx'),
        ),
        migrations.AddConstraint(
            model_name='assignment',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'leased')), fields=('campaign', 'annotator'), name='assignment_one_live_lease'),
        ),
    ]
