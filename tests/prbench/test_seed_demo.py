import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from pipeline.models import Benchmark
from prbench.management.commands.seed_demo import synthetic_offset

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
    # Two baselines and three flipped-overlap references succeed, spread along the accuracy
    # axis; the demo RM at max length 64 fails.
    assert sorted((r.submission.display_name, r.status, round(30 * (r.metrics or {}).get("accuracy", 0)))
                  for r in runs) == [
        ("Baseline: length", "SUCCEEDED", 14), ("Baseline: profile overlap", "SUCCEEDED", 26),
        ("Demo RM, max length 64 (fails)", "FAILED", 0), ("Demo: overlap, 15% flipped", "SUCCEEDED", 23),
        ("Demo: overlap, 30% flipped", "SUCCEEDED", 19), ("Demo: overlap, 45% flipped", "SUCCEEDED", 10)]
    length = runs.get(submission__display_name="Baseline: length")
    # The sample's answers are length-balanced, so preferring the longer one is near chance.
    assert 0.3 <= length.metrics["accuracy"] <= 0.7

    call_command("seed_demo")  # idempotent: no second benchmark or evaluation, the same passwords
    assert Benchmark.objects.count() == 1 and runs.count() == 6
    researcher.refresh_from_db()
    assert researcher.check_password(password)
    assert "researcher  (password unchanged: `manage.py seed_demo --reset-passwords` prints new ones)" in \
        capsys.readouterr().out

    call_command("seed_demo", "--reset-passwords")
    out = capsys.readouterr().out
    new = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("researcher"))
    researcher.refresh_from_db()
    assert new != password and researcher.check_password(new) and not researcher.check_password(password)


def test_a_second_seed_demo_keeps_the_demo_accounts_signed_in(settings, client):
    """set_password changes the session hash, which signs a user out: a second run must not."""
    settings.DEBUG = True
    call_command("seed_demo")
    client.force_login(User.objects.get(username="annotator"))
    assert client.get("/annotate/").status_code == 200
    call_command("seed_demo")
    assert client.get("/annotate/").status_code == 200  # still signed in: not sent to the login page


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


def test_a_second_seed_demo_names_its_own_campaign_not_a_users(settings, capsys):
    from annotation.models import Campaign
    from annotation.services.campaigns import campaign_create

    settings.DEBUG = True
    call_command("seed_demo")
    mine = campaign_create(user=User.objects.create(username="lead", is_staff=True), benchmark="prb-sample",
                           name="My pilot", guidelines="g", overlap=1)
    Campaign.objects.filter(name="Sample validation").update(created_at=mine.created_at)  # no order to lean on
    capsys.readouterr()
    call_command("seed_demo")
    out = capsys.readouterr().out
    assert "annotation campaign 'Sample validation'" in out and "My pilot" not in out
    assert Campaign.objects.count() == 2


def test_seed_demo_builds_a_random_demo_model_that_passes_the_submission_checks(settings, tmp_path, capsys):
    from leaderboard import services
    from prblib.modelcheck import inspect_model_folder

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
    assert outcomes.count() == 30  # two baselines and three flipped references x (five Best-of-k + one PPO)
    overlap = outcomes.get(rm_name="Baseline: profile overlap", kind="best_of_n", k=16)
    accuracy = overlap.submission.runs.get().metrics["accuracy"]
    assert overlap.outcome == pytest.approx(0.8 + 0.6 * (accuracy - 0.5) + synthetic_offset("Baseline: profile overlap"))
    response = client.get("/correlations/")
    html = response.content.decode()
    assert 'id="correlation-table"' in html and 'id="synthetic-note"' in html and "plotly" in html
    # Five RMs: every figure has a value and a CI, so a newcomer sees no dashes and no empty chart.
    (row,) = response.context["report"]["correlations"]
    assert (row["benchmark"], row["setting"], row["n"], row["reason"]) == ("prb-sample", "profile", 5, None)
    for metric in ("spearman", "kendall", "pearson"):
        assert row[metric]["value"] is not None and row[metric]["ci_low"] is not None, metric
    # The offsets swap one pair of neighbours at k=16 (overlap baseline and "15% flipped"): ρ = 1 - 6*2/(5*24).
    assert row["spearman"]["value"] == pytest.approx(0.9)
    assert "no figures" not in html
    call_command("seed_demo")
    assert DownstreamOutcome.objects.count() == 30


def test_the_synthetic_offset_is_fixed_per_name_and_small():
    assert synthetic_offset("Baseline: length") == synthetic_offset("Baseline: length")
    offsets = {synthetic_offset(f"model {i}") for i in range(2000)}
    assert min(offsets) == -0.08 and max(offsets) == 0.08 and len(offsets) == 161


def test_seed_demo_leaves_the_researcher_a_failed_submission_with_its_reason(settings, client, tmp_path):
    from leaderboard.models import Submission

    settings.DEBUG = True
    settings.MODELS_ROOT = tmp_path
    call_command("seed_demo")
    failed = Submission.objects.get(display_name="Demo RM, max length 64 (fails)")
    run = failed.runs.get()
    assert (failed.owner.username, run.status, run.setting) == ("researcher", "FAILED", "no_profile")
    assert "does not fit the model's 64 tokens" in run.error
    client.force_login(failed.owner)
    html = client.get("/submissions/?status=FAILED").content.decode()
    assert "Demo RM, max length 64 (fails)" in html and "does not fit the model&#x27;s 64 tokens" in html
    call_command("seed_demo")  # made once
    assert Submission.objects.filter(display_name="Demo RM, max length 64 (fails)").count() == 1


def test_the_word_overlap_baseline_does_not_top_the_sample_at_100_percent(settings, tmp_path):
    from leaderboard.models import EvaluationRun

    settings.DEBUG = True
    settings.MODELS_ROOT = tmp_path
    call_command("seed_demo")
    overlap = EvaluationRun.objects.get(submission__display_name="Baseline: profile overlap")
    # The sample's rejected answers also draw on the user's posts (as generated ones do), so
    # lexical overlap alone gets 26 of 30 pairs.
    assert overlap.metrics["accuracy"] == pytest.approx(26 / 30)


def test_a_second_seed_demo_gives_a_researchers_own_published_model_no_made_up_outcomes(settings, client):
    """Issue 28, fault 9: run again, seed_demo gave every published model in the profile setting
    made-up Best-of-N and PPO outcomes, shown on its page unmarked."""
    from leaderboard import services
    from leaderboard.models import DownstreamOutcome
    from prblib.registry import KS
    from tests.leaderboard.test_submissions import scores_upload

    settings.DEBUG = True
    call_command("seed_demo")
    researcher = User.objects.get(username="researcher")
    bench = Benchmark.objects.get(name="prb-sample")
    mine = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="My own RM", benchmark="prb-sample", kind="scores", settings=("profile",),
        scores_file=scores_upload(bench, wrong=set(bench.items.order_by("position").values_list(
            "source_id", flat=True)[:3]))))
    services.run_execute(run_id=mine.runs.get().pk)
    services.submission_publish(user=researcher, submission=mine)
    DownstreamOutcome.objects.create(submission=mine, rm_name="My own RM", kind="ppo", outcome=1.0, n=30,
                                     source="synthetic demo (seed_demo)")  # as an earlier version left it

    call_command("seed_demo")
    assert not DownstreamOutcome.objects.filter(submission=mine).exists()
    made_up = DownstreamOutcome.objects.filter(synthetic=True)
    references = {"Baseline: length", "Baseline: profile overlap", "Demo: overlap, 15% flipped",
                  "Demo: overlap, 30% flipped", "Demo: overlap, 45% flipped"}
    assert set(made_up.values_list("rm_name", flat=True)) == references
    assert made_up.count() == 5 * (len(KS) + 1) == DownstreamOutcome.objects.count()  # Best-of-k per k, and PPO

    reference = made_up.first().submission
    api = client.get(f"/api/submissions/{reference.pk}/").json()
    assert api["outcomes"] and all(o["synthetic"] for o in api["outcomes"])
    page = client.get(f"/submissions/{reference.pk}/").content.decode()
    assert page.count('class="badge badge-synthetic"') >= len(KS) + 1
    report = client.get("/api/correlations/").json()
    assert set(report["synthetic"]) == references
    assert all(p["synthetic"] for r in report["correlations"] for p in r["points"])
    csv = b"".join(client.get("/correlations.csv").streaming_content).decode().splitlines()
    assert "synthetic_rms" in csv[0] and "Baseline: length" in csv[1]
