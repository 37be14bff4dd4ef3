"""Staff find and steer campaigns from the navigation; annotators revise their own ratings.
Real Chromium against the live server."""

import re

import pytest
from playwright.sync_api import Page, expect

from annotation.models import Campaign, Rating, RatingRevision
from annotation.services.campaigns import campaign_create
from annotation.services.leases import assignment_next
from annotation.services.ratings import rating_submit
from pipeline.services import benchmark_import
from tests.e2e.test_benchmark_browser import log_in
from tests.e2e.watch import watch_page
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("transactional_db")]

DIMS = ("factuality", "relevance", "helpfulness", "personal_rubrics")
CHOSEN, REJECTED = dict(zip(DIMS, (4, 4, 4, 5))), dict(zip(DIMS, (4, 4, 4, 1)))


def rate(user, campaign, chosen=CHOSEN, rejected=REJECTED):
    assignment = assignment_next(user=user, campaign_id=campaign.pk).assignment
    shown = {"1": chosen, "2": rejected} if assignment.chosen_first else {"1": rejected, "2": chosen}
    rating_submit(user=user, token=assignment.token, ratings=shown, seconds=42)
    return assignment


@pytest.fixture
def campaign():
    benchmark_import(path=SAMPLE, name="sample")
    staff = UserFactory(username="boss", is_staff=True)
    campaign = campaign_create(user=staff, benchmark="sample", guidelines="Rate.", name="Pilot", overlap=2)
    return staff, campaign


def test_staff_reach_the_dashboard_from_the_navigation_close_with_confirmation_and_open_a_pair(
        page: Page, live_server, campaign):
    staff, campaign = campaign
    a, b = UserFactory(username="ann-a", roles=["annotator"]), UserFactory(username="ann-b", roles=["annotator"])
    first = rate(a, campaign)
    # The same pair (closest to completion), rated very differently: Personal Rubrics 1 vs 3.
    rate(b, campaign, chosen={**CHOSEN, "personal_rubrics": 1}, rejected={**REJECTED, "personal_rubrics": 3})
    assignment_next(user=a, campaign_id=campaign.pk)  # a holds a lease now
    problems = watch_page(page)
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, live_server, staff)

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Campaigns").click()
    expect(page).to_have_url(re.compile(r"/annotation/campaigns/$"))
    expect(page.get_by_role("link", name="New campaign")).to_be_visible()
    row = page.locator(f'tr[data-campaign="{campaign.pk}"]')
    expect(row).to_contain_text("2 of 60 ratings (3.3%) · 1 of 30 pairs complete")
    expect(row).to_contain_text("ann-a: 1")
    expect(row).to_contain_text("ann-b: 1")
    expect(row).to_contain_text("ann-a until")
    expect(row.locator("progress")).to_have_attribute("value", "2")

    # Dismissing the confirmation changes nothing; accepting closes it and says so.
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_role("button", name="Close").click()
    expect(row.get_by_role("button", name="Close")).to_be_visible()
    assert Campaign.objects.get(pk=campaign.pk).is_open
    messages = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    row.get_by_role("button", name="Close").click()
    expect(page.locator(".messages")).to_contain_text("Campaign 'Pilot' is closed")
    expect(row.get_by_role("button", name="Reopen")).to_be_visible()
    assert messages and messages[0].startswith("Close 'Pilot'?")
    assert not Campaign.objects.get(pk=campaign.pk).is_open

    # The report: ratings and pairs counted apart, the failing pair opens the side-by-side view.
    row.get_by_role("link", name="Report").click()
    expect(page.locator("#rating-counts")).to_have_text("2 ratings of 1 distinct pair")
    page.wait_for_load_state("load")  # plotly is large: let it arrive before leaving the page
    failing = page.locator("#failing-pairs a")
    expect(failing).to_have_count(1)
    expect(page.locator("#failing-pairs")).to_contain_text("the chosen answer is rated 1.00 points above")
    failing.click()
    expect(page).to_have_url(re.compile(rf"/pairs/{first.pair.item.source_id}/$"))
    expect(page.locator("#pair-ratings tbody tr")).to_have_count(2)
    expect(page.locator("#pair-ratings td.disagree")).to_have_count(4)  # both answers' Personal Rubrics, 2 rows
    page.screenshot(path="/tmp/prbench-campaign-pair.png", full_page=True)
    assert problems == []


def test_an_annotator_revises_a_rating_from_their_history(page: Page, live_server, campaign):
    _, campaign = campaign
    annotator = UserFactory(username="rater", roles=["annotator"])
    assignment = rate(annotator, campaign)
    problems = watch_page(page)
    log_in(page, live_server, annotator)
    page.goto(live_server.url + "/annotate/")
    page.get_by_role("link", name="Your ratings").click()
    expect(page).to_have_url(re.compile(rf"/annotate/{campaign.pk}/history/$"))
    expect(page.locator("#history-table tbody tr")).to_have_count(1)
    page.get_by_role("link", name="Revise").click()

    # The rating screen shows the pair blind, with the current ratings checked.
    first_shown = CHOSEN if assignment.chosen_first else REJECTED
    fieldset = page.locator('fieldset[data-field="ratings.1.personal_rubrics"]')
    expect(fieldset.locator(f'input[value="{first_shown["personal_rubrics"]}"]')).to_be_checked()
    assert "chosen" not in page.content().lower()
    fieldset.locator("label", has_text="3").click()
    page.get_by_label("Comment").fill("Read it again")
    page.get_by_role("button", name="Save revision").click()

    expect(page.locator(".messages")).to_contain_text("Your revised rating is saved")
    expect(page.locator("#history-table")).to_contain_text("1 earlier version kept")
    rating = Rating.objects.get(annotator=annotator)
    role = "chosen" if assignment.chosen_first else "rejected"
    assert getattr(rating, role)["personal_rubrics"] == 3 and rating.comment == "Read it again"
    assert RatingRevision.objects.get(rating=rating).chosen == CHOSEN
    assert problems == []
