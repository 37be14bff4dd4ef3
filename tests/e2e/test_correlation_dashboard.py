"""The correlation dashboard draws its charts in real Chromium."""

import pytest
from playwright.sync_api import Page, expect

from leaderboard.models import DownstreamOutcome
from tests.leaderboard.test_correlations import OUTCOMES

pytestmark = [pytest.mark.e2e]


def test_the_dashboard_shows_scatter_bars_and_scaling_curves(page: Page, live_server, transactional_db, researcher):
    from leaderboard import services
    from pipeline.services import benchmark_import
    from tests.leaderboard.test_correlations import RMS
    from tests.leaderboard.test_submissions import scores_upload
    from tests.pipeline.test_formats import SAMPLE

    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    ids = list(bench.items.order_by("position").values_list("source_id", flat=True))
    for name, wrong in RMS.items():
        submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=("profile",),
            scores_file=scores_upload(bench, wrong=set(ids[:wrong]), name=f"{name}.jsonl")))
        services.run_execute(run_id=submission.runs.get().pk)
    for rm, value in OUTCOMES.items():
        for k, shift in ((1, -0.3), (4, -0.1), (16, 0.0)):
            DownstreamOutcome.objects.create(rm_name=rm, kind="best_of_n", k=k, outcome=value + shift, n=30)

    page.goto(f"{live_server.url}/correlations/")
    expect(page.locator("#correlation-table tbody tr")).to_have_count(1)
    for chart in ("#chart-scatter", "#chart-bars", "#chart-curves"):
        expect(page.locator(f"{chart} .main-svg").first).to_be_attached()
    expect(page.locator("#chart-scatter .textpoint")).to_have_count(5)  # one labelled point per RM
    page.screenshot(path="/tmp/prbench-correlations.png", full_page=True)
