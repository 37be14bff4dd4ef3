import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from pipeline.models import Benchmark

pytestmark = pytest.mark.django_db


def test_seed_demo_loads_the_sample_and_prints_fresh_passwords(settings, capsys):
    settings.DEBUG = True
    call_command("seed_demo")
    out = capsys.readouterr().out
    bench = Benchmark.objects.get(name="prb-sample")
    assert bench.item_count == 30 and bench.is_synthetic
    researcher = User.objects.get(username="researcher")
    password = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("researcher"))
    assert researcher.check_password(password)
    assert researcher.groups.filter(name="researcher").exists()
    assert User.objects.get(username="admin").is_staff

    from leaderboard.models import EvaluationRun

    runs = EvaluationRun.objects.filter(submission__benchmark=bench)
    assert runs.count() == 2 and {r.status for r in runs} == {"SUCCEEDED"}
    length = runs.get(submission__display_name="Baseline: length")
    # The sample's answers are length-balanced, so preferring the longer one is near chance.
    assert 0.3 <= length.metrics["accuracy"] <= 0.7

    call_command("seed_demo")  # idempotent: no second benchmark or evaluation, new passwords
    assert Benchmark.objects.count() == 1 and runs.count() == 2
    researcher.refresh_from_db()
    assert not researcher.check_password(password)


def test_seed_demo_creates_no_accounts_when_debug_is_off(settings, capsys):
    settings.DEBUG = False
    call_command("seed_demo")
    assert not User.objects.exists()
    assert "no demo accounts" in capsys.readouterr().out


def test_seed_demo_opens_one_annotation_campaign(settings):
    from annotation.models import Campaign

    settings.DEBUG = True
    call_command("seed_demo")
    call_command("seed_demo")
    campaign = Campaign.objects.get()
    assert campaign.is_open and campaign.pairs.count() == 30 and "Personal Rubrics" in campaign.guidelines
