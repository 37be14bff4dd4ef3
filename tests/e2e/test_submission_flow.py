"""A researcher submits a reward model in real Chromium, watches it run on a real worker,
and finds it on the leaderboard."""

import re

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from leaderboard.models import RunStatus, Submission
from pipeline.services import benchmark_import
from tests.factories import PASSWORD, UserFactory
from tests.pipeline.ml.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import SAMPLE

pytestmark = [pytest.mark.e2e]


def test_a_researcher_submits_watches_progress_and_finds_the_row(page: Page, live_server, celery_worker_process):
    benchmark_import(path=SAMPLE, name="sample")
    build_decoder_rm(settings.MODELS_ROOT / "tiny-rm")
    user = UserFactory(roles=["researcher"])

    page.goto(f"{live_server.url}/accounts/login/?next=/submit/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name=re.compile("log in", re.I)).click()
    expect(page).to_have_url(re.compile(r"/submit/$"))

    page.get_by_label("Display name").fill("Tiny RM (browser)")
    page.get_by_label("Benchmark").select_option("sample")
    page.get_by_label("Kind").select_option("scalar")
    page.get_by_label("Model path").fill("tiny-rm")
    page.get_by_label("Batch size").fill("4")
    page.get_by_role("button", name="Submit for evaluation").click()

    expect(page).to_have_url(re.compile(r"/submissions/\d+/$"))
    submission = Submission.objects.get(display_name="Tiny RM (browser)")
    expect(page.locator(".run")).to_have_count(2)
    # The page polls the API and reloads when every run is done.
    expect(page.locator(".run-status").first).to_have_text("SUCCEEDED", timeout=120_000)
    expect(page.locator(".run-status").last).to_have_text("SUCCEEDED", timeout=120_000)
    assert set(submission.runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    for bar in page.locator("progress.run-progress").all():
        assert bar.get_attribute("value") == bar.get_attribute("max") == "30"
    expect(page.locator("#results-table")).to_be_visible()
    expect(page.locator("#domain-chart .main-svg").first).to_be_attached()  # plotly drew the chart
    page.screenshot(path="/tmp/prbench-submission.png", full_page=True)

    page.get_by_role("link", name="Leaderboard").first.click()
    row = page.locator(".leaderboard-table tbody tr", has_text="Tiny RM (browser)")
    expect(row).to_have_count(2)  # one row per setting, each in its setting's ranked table
    expect(page.locator(".leaderboard-table")).to_have_count(2)
    expect(row.first.locator(".rank")).to_have_text("1")
    page.screenshot(path="/tmp/prbench-leaderboard.png", full_page=True)
