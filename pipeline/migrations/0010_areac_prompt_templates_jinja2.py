"""Prompt templates moved from str.format syntax ({question}) to jinja2 ({{ question }}), rendered in
jinja2's sandbox: every stored template is converted with prblib.templates.format_to_jinja, which
renders exactly the text str.format rendered. A template that cannot be converted (a positional or
attribute placeholder, malformed braces: already unusable) is left as it is and is refused with its
reason when a build uses it. Going back leaves the texts in jinja2 syntax."""

from django.db import migrations, models


def to_jinja(apps, schema_editor):
    from prblib.templates import TemplateError, format_to_jinja

    PromptTemplate = apps.get_model("pipeline", "PromptTemplate")
    for template in PromptTemplate.objects.all():
        try:
            system, user = format_to_jinja(template.system or ""), format_to_jinja(template.user)
        except TemplateError:
            continue
        if (system, user) != (template.system, template.user):
            PromptTemplate.objects.filter(pk=template.pk).update(system=system, user=user)


class Migration(migrations.Migration):

    dependencies = [
        ("pipeline", "0009_merge_answers_jobs_history"),
    ]

    operations = [
        migrations.AlterField(
            model_name="prompttemplate",
            name="user",
            field=models.TextField(help_text="A jinja2 template, rendered in a sandbox: {{ question }}, {{ profile }}, "
                                             "{{ aspects }} (not for the planner), {{ target_words }}."),
        ),
        migrations.RunPython(to_jinja, migrations.RunPython.noop),
    ]
