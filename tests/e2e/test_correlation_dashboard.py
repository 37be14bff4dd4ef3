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
    expect(page.locator("#correlation-table tbody tr[data-benchmark]")).to_have_count(1)
    # Under it, what a random ordering of the same five RMs gives (exact over the 120 orderings).
    expect(page.locator("#correlation-table tbody tr.chance-row")).to_contain_text("exact, all 120 orderings")
    for chart in ("#chart-scatter", "#chart-bars", "#chart-curves"):
        expect(page.locator(f"{chart} .main-svg").first).to_be_attached()
    expect(page.locator("#chart-scatter .textpoint")).to_have_count(5)  # one labelled point per RM
    page.screenshot(path="/tmp/prbench-correlations.png", full_page=True)


def test_markup_in_a_display_name_is_shown_as_text_in_the_charts(page: Page, live_server, transactional_db,
                                                                  researcher):
    """Plotly reads <a href>, <b>... in its strings: a model named with markup must not become a
    link (or bold text) in the public charts; its name is shown as written."""
    evaluate_rms(researcher)
    evil = '<a href="https://evil.example/">Evil</a><b>bold</b>'
    first = next(iter(OUTCOMES))
    Submission.objects.filter(display_name=first).update(display_name=evil)
    for rm, value in OUTCOMES.items():
        submission = Submission.objects.get(display_name=evil if rm == first else rm)
        for k in (1, 16):
            DownstreamOutcome.objects.create(rm_name=rm, submission=submission, kind="best_of_n", k=k,
                                             outcome=value, n=30)

    page.goto(f"{live_server.url}/correlations/")
    for chart in ("#chart-scatter", "#chart-curves"):
        expect(page.locator(f"{chart} .main-svg").first).to_be_attached()
        assert page.locator(f"{chart} a").count() == 0  # Plotly draws an <a> for a link in a label
        assert page.locator(f"{chart} text[style*='font-weight: bold'], {chart} tspan[style*='bold']").count() == 0
    texts = page.locator("#chart-scatter .textpoint").all_text_contents()
    assert any(evil in text for text in texts), texts
    legend = page.locator("#chart-curves .legendtext").all_text_contents()
    assert any(evil in text for text in legend), legend
