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

    call_command("seed_demo")  # idempotent: no second benchmark, new passwords
    assert Benchmark.objects.count() == 1
    researcher.refresh_from_db()
    assert not researcher.check_password(password)


def test_seed_demo_creates_no_accounts_when_debug_is_off(settings, capsys):
    settings.DEBUG = False
    call_command("seed_demo")
    assert not User.objects.exists()
    assert "no demo accounts" in capsys.readouterr().out
