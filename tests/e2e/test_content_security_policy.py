"""The pages, their plotly charts and the Swagger UI work under the Content-Security-Policy:
real Chromium reports no violation and draws what it should."""

import pytest
from playwright.sync_api import Page, expect

from leaderboard.models import DownstreamOutcome, Submission
from tests.factories import PASSWORD
from tests.leaderboard.test_correlations import OUTCOMES, evaluate_rms

pytestmark = [pytest.mark.e2e]


def watch(page: Page) -> list[str]:
    """Collect CSP violations (the DOM event and the console message) and page errors."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console: {m.text}")
            if m.type == "error" and "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.add_init_script("""document.addEventListener('securitypolicyviolation', function (e) {
        console.error('Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI);
    });""")
    return problems


def test_pages_charts_and_swagger_run_without_a_single_csp_violation(page: Page, live_server, transactional_db,
                                                                    researcher):
    evaluate_rms(researcher)
    for rm, value in OUTCOMES.items():
        for k, shift in ((1, -0.3), (16, 0.0)):
            DownstreamOutcome.objects.create(rm_name=rm, submission=Submission.objects.get(display_name=rm),
                                             kind="best_of_n", k=k, outcome=value + shift, n=30)
    problems = watch(page)
    submission, private = Submission.objects.order_by("pk")[:2]
    Submission.objects.filter(pk=private.pk).update(published=False, published_at=None)

    page.goto(f"{live_server.url}/")
    expect(page.locator("#leaderboard-table tbody tr").first).to_be_visible()
    page.goto(f"{live_server.url}/correlations/")
    expect(page.locator("#chart-scatter .main-svg").first).to_be_attached()
    page.goto(f"{live_server.url}/submissions/{submission.pk}/")
    expect(page.locator("#domain-chart .main-svg").first).to_be_attached()
    page.goto(f"{live_server.url}/api/docs/")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible(timeout=30_000)

    # The owner publishes from the page: the confirmation comes from our static script, not inline code.
    page.goto(f"{live_server.url}/accounts/login/?next=/submissions/{private.pk}/")
    page.fill("#id_username", researcher.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.click("#publish-button")
    expect(page.locator("#private-badge")).to_have_count(0)
    assert asked and asked[0].startswith("Publish this submission?")
    private.refresh_from_db()
    assert private.published
    assert problems == []
