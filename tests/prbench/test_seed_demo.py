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


def test_seed_demo_builds_a_random_demo_model_that_passes_the_submission_checks(settings, tmp_path, capsys):
    from leaderboard import services
    from pipeline.ml.modelcheck import inspect_model_folder

    settings.DEBUG = True
    settings.MODELS_ROOT = tmp_path
    call_command("seed_demo")
    out = capsys.readouterr().out
    folder = tmp_path / "demo-random-scalar-rm"
    assert "RANDOM weights" in out and "demo-random-scalar-rm" in out
    assert "RANDOM WEIGHTS, NOT TRAINED" in (folder / "README.md").read_text()
    info = inspect_model_folder(folder, models_root=tmp_path)
    assert info.architectures == ("BertForSequenceClassification",) and info.num_labels == 1
    submission = services.submission_create(user=User.objects.get(username="researcher"),
                                            request=services.SubmissionRequest(
        display_name="Demo random RM", benchmark="prb-sample", kind="scalar", settings=("profile",),
        model_path="demo-random-scalar-rm"))
    assert submission.runs.get().status == "QUEUED"
    call_command("seed_demo")
    assert "already there" in capsys.readouterr().out


def test_seed_demo_adds_synthetic_outcomes_so_the_correlations_page_is_not_empty(settings, client, tmp_path):
    from leaderboard.models import DownstreamOutcome

    settings.DEBUG = True
    settings.MODELS_ROOT = tmp_path
    call_command("seed_demo")
    outcomes = DownstreamOutcome.objects.all()
    assert {o.source for o in outcomes} == {"synthetic demo (seed_demo)"}
    assert outcomes.count() == 12  # two baselines x (five Best-of-k + one PPO)
    overlap = outcomes.get(rm_name="Baseline: profile overlap", kind="best_of_n", k=16)
    accuracy = overlap.submission.runs.get().metrics["accuracy"]
    assert overlap.outcome == pytest.approx(0.8 + 0.6 * (accuracy - 0.5))
    html = client.get("/correlations/").content.decode()
    assert 'id="correlation-table"' in html and 'id="synthetic-note"' in html and "plotly" in html
    call_command("seed_demo")
    assert DownstreamOutcome.objects.count() == 12


def test_the_word_overlap_baseline_does_not_top_the_sample_at_100_percent(settings, tmp_path):
    from leaderboard.models import EvaluationRun

    settings.DEBUG = True
    settings.MODELS_ROOT = tmp_path
    call_command("seed_demo")
    overlap = EvaluationRun.objects.get(submission__display_name="Baseline: profile overlap")
    # The sample's rejected answers also draw on the user's posts (as generated ones do), so
    # lexical overlap alone gets 26 of 30 pairs.
    assert overlap.metrics["accuracy"] == pytest.approx(26 / 30)
