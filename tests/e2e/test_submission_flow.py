"""The newcomer's flow (d) end to end: a researcher submits the demo model that `seed_demo`
builds through the submit form on a live server, watches its progress move while a real
Celery worker scores it, and finds it ranked on the leaderboard with its accuracy and CI."""

import json
import re

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from leaderboard.models import RunStatus, Submission
from prblib.rewards.demo_model import DEMO_MODEL_DIR, build_random_scalar_rm
from pipeline.services import benchmark_import
from prbench.management.commands.seed_demo import SAMPLE_NAME, SAMPLE_PATH
from tests.factories import PASSWORD, UserFactory
from tests.leaderboard.test_pages import finished_scores

pytestmark = [pytest.mark.e2e]

# The page polls every 2 s; here every 0.1 s, so a run of a few seconds shows its steps.
FAST_POLL = "(() => { const st = window.setTimeout; window.setTimeout = (f, ms, ...a) => st(f, ms === 2000 ? 100 : ms, ...a); })();"


def test_the_demo_model_is_submitted_runs_on_the_worker_and_is_ranked(page: Page, live_server, celery_worker_process):
    sample = benchmark_import(path=SAMPLE_PATH, name=SAMPLE_NAME).benchmark
    build_random_scalar_rm(settings.MODELS_ROOT / DEMO_MODEL_DIR)  # exactly what seed_demo builds
    user = UserFactory(roles=["researcher"])
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    finished_scores(user, sample, "Reference RM", ids[:3])  # 27 of 30 right: 90.0, ranked first

    seen: list[list[tuple[str, int]]] = []  # every status the page polled: [(status, pairs done) per run]
    page.on("response", lambda r: re.search(r"/api/submissions/\d+/$", r.url) and r.ok and seen.append(
        [(run["status"], run["progress"]["done"]) for run in json.loads(r.text())["runs"]]))
    page.add_init_script(FAST_POLL)

    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name=re.compile("log in", re.I)).click()
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Submit").click()
    expect(page.get_by_label("Benchmark")).to_have_value(SAMPLE_NAME)  # the defaults are the demo's
    expect(page.get_by_label("Kind")).to_have_value("scalar")
    expect(page.get_by_label("Other options (JSON)")).to_have_value("")  # an empty box, not "null"
    page.get_by_label("Display name").fill("My demo RM")
    page.get_by_label("Model path").fill(DEMO_MODEL_DIR)
    page.get_by_role("button", name="Submit for evaluation").click()

    expect(page).to_have_url(re.compile(r"/submissions/\d+/$"))
    expect(page.locator(".message")).to_contain_text("queued for evaluation")
    expect(page.locator(".run")).to_have_count(2)  # without and with profile
    # The page reloads with the results once no run is active.
    expect(page.locator("#results-table")).to_be_visible(timeout=120_000)
    submission = Submission.objects.get(display_name="My demo RM")
    assert set(submission.runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    expect(page.locator(".run-status")).to_have_text(["Succeeded", "Succeeded"])  # words, not the API value
    expect(page.locator(".run-status").first).to_have_attribute("data-status", "SUCCEEDED")
    for bar in page.locator("progress.run-progress").all():
        assert bar.get_attribute("value") == bar.get_attribute("max") == "30"
    expect(page.locator("#domain-chart .main-svg").first).to_be_attached()  # plotly drew the per-domain chart
    expect(page.locator("#cancel-button")).to_have_count(0)  # nothing left to cancel or retry
    expect(page.locator("#retry-button")).to_have_count(0)

    # Progress moved: the page showed work in flight (0 of 60 pairs) and part of it done
    # before the end. The worker runs one setting at a time, so the second setting is
    # still queued or running after the first finished, for at least its model's loading.
    totals = [sum(done for _, done in snapshot) for snapshot in seen]
    assert totals and totals[0] < 60 and totals == sorted(totals), seen
    assert any(0 < t < 60 for t in totals), seen
    assert any(status in ("QUEUED", "RUNNING") for snapshot in seen for status, _ in snapshot), seen

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Leaderboard").click()
    profile = page.locator(".leaderboard-table[data-setting=profile]")
    reference = profile.locator("tbody tr", has_text="Reference RM")
    mine = profile.locator("tbody tr", has_text="My demo RM")
    expect(reference.locator(".rank")).to_have_text("1")
    expect(reference).to_contain_text("90.0")
    run = submission.runs.get(setting="profile")
    accuracy = f"{100 * run.metrics['accuracy']:.1f}"
    ci = f"{100 * run.metrics['ci_low']:.1f}–{100 * run.metrics['ci_high']:.1f}"
    expect(mine.locator(".rank")).to_have_text("2")  # random weights: far below the reference
    expect(mine.locator("td.num strong")).to_have_text(accuracy)
    expect(mine.locator("td[data-col=ci]")).to_have_text(ci)
    expect(mine).to_contain_text("private")  # its owner sees it before publishing
    expect(page.locator(".leaderboard-table[data-setting=no_profile] tbody tr", has_text="My demo RM")).to_have_count(1)
    page.screenshot(path="/tmp/prbench-leaderboard.png", full_page=True)
