"""The correlation dashboard draws its charts in real Chromium."""

import pytest
from playwright.sync_api import Page, expect

from leaderboard.models import DownstreamOutcome, Submission
from tests.leaderboard.test_correlations import OUTCOMES, evaluate_rms

pytestmark = [pytest.mark.e2e]


def test_the_dashboard_shows_scatter_bars_and_scaling_curves(page: Page, live_server, transactional_db, researcher):
    evaluate_rms(researcher)
    for rm, value in OUTCOMES.items():
        for k, shift in ((1, -0.3), (4, -0.1), (16, 0.0)):
            # Outcomes belong to a submission (identity), not to a display name.
            DownstreamOutcome.objects.create(rm_name=rm, submission=Submission.objects.get(display_name=rm),
                                             kind="best_of_n", k=k, outcome=value + shift, n=30)

    page.goto(f"{live_server.url}/correlations/")
    expect(page.locator("#correlation-table tbody tr")).to_have_count(1)
    for chart in ("#chart-scatter", "#chart-bars", "#chart-curves"):
        expect(page.locator(f"{chart} .main-svg").first).to_be_attached()
    expect(page.locator("#chart-scatter .textpoint")).to_have_count(5)  # one labelled point per RM
    page.screenshot(path="/tmp/prbench-correlations.png", full_page=True)
