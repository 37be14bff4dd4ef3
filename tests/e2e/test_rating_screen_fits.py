"""The rating screen on one screen (issue 31, fault 1), in real Chromium at a laptop's 1400 x 900
and a phone's 390 x 844: the rating rows in view beside the two answers, tabs on the phone,
Escape out of a text box, drafts kept on the server, skips undone, the revision page being the
rating screen itself, and annotators landing on their queue. Screenshots go to /tmp."""

import re

import pytest
from playwright.sync_api import Page, expect

from annotation.models import Assignment, Rating
from annotation.services.campaigns import campaign_create
from pipeline.services import benchmark_import
from tests.e2e.test_benchmark_browser import elements_wider_than_the_viewport
from tests.factories import PASSWORD, UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("transactional_db")]

LAPTOP, PHONE = {"width": 1400, "height": 900}, {"width": 390, "height": 844}
DIMENSIONS = ("factuality", "relevance", "helpfulness", "personal_rubrics")


@pytest.fixture
def campaign():
    benchmark_import(path=SAMPLE, name="sample")
    staff = UserFactory(is_staff=True)
    return campaign_create(user=staff, benchmark="sample", guidelines="# Rate\n\nRate each answer.",
                           overlap=2)


def sign_in(page: Page, live_server, user):
    """The login form without ?next=: where the app sends this user by itself."""
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".site-user .username")).to_have_text(user.username)


def row(page: Page, response: str, dimension: str):
    return page.locator(f'fieldset[data-field="ratings.{response}.{dimension}"]')


def box(locator) -> dict:
    found = locator.bounding_box()
    assert found is not None, "not rendered"
    return found


def in_viewport(locator, height: int) -> bool:
    b = box(locator)
    return b["y"] >= 0 and b["y"] + b["height"] <= height


def start(page: Page):
    page.get_by_role("button", name="Start rating").click()
    expect(page.locator("#question")).not_to_be_empty()


def test_the_rating_screen_fits_a_laptop_and_a_phone_and_keeps_drafts_on_the_server(
        page: Page, browser, live_server, campaign):
    annotator = UserFactory(roles=["annotator"])
    page.set_viewport_size(LAPTOP)
    sign_in(page, live_server, annotator)
    # Annotators land on their queue, where "Your ratings" is there before the first rating.
    expect(page).to_have_url(re.compile(r"/annotate/$"))
    expect(page.get_by_role("link", name="Your ratings")).to_have_attribute(
        "href", f"/annotate/{campaign.pk}/history/")
    page.get_by_role("link", name="Start rating").click()
    start(page)

    # 1400 x 900, not scrolled: both answers side by side, and every rating row of both in view,
    # with the submit bar.
    assert page.evaluate("window.scrollY") == 0
    one, two = box(page.locator("#response-1")), box(page.locator("#response-2"))
    assert one["x"] + one["width"] <= two["x"] and abs(one["y"] - two["y"]) < 2
    bar = box(page.locator(".ann-submit-bar"))
    assert in_viewport(page.get_by_role("button", name="Submit ratings"), 900)
    for response in "12":
        for dimension in DIMENSIONS:
            rating_row = box(row(page, response, dimension))  # in view, and not under the submit bar
            assert rating_row["y"] >= 0 and rating_row["y"] + rating_row["height"] <= bar["y"], (response, dimension)
    assert in_viewport(page.locator("#question"), 900) and in_viewport(page.locator("#rubric li").first, 900)
    assert elements_wider_than_the_viewport(page) == []
    page.screenshot(path="/tmp/prbench-31-rate-1400x900.png")

    # Question, rubric and posts fold away and come back.
    for name in ("Question", "What matters to this person", "Their past posts"):
        summary = page.locator("summary", has_text=name)
        details = summary.locator("xpath=..")
        expect(details).to_have_attribute("open", "")
        summary.click()
        expect(details).not_to_have_attribute("open", "")
        summary.click()
        expect(details).to_have_attribute("open", "")

    # Escape leaves the comment box: digits rate again instead of typing.
    page.keyboard.press("4")
    page.keyboard.press("5")
    page.get_by_label("Comment").fill("Second one rambles")
    page.keyboard.press("Escape")
    with page.expect_response(lambda r: "/api/annotation/drafts/" in r.url and r.request.method == "PUT"
                              and "Second one rambles" in (r.request.post_data or "")) as saved:
        page.keyboard.press("3")
    assert saved.value.status == 200
    expect(page.get_by_label("Comment")).to_have_value("Second one rambles")
    expect(row(page, "1", "helpfulness").locator('input[value="3"]')).to_be_checked()
    assignment = Assignment.objects.get(annotator=annotator, status=Assignment.Status.LEASED)
    assert assignment.draft["ratings"] == {"1": {"factuality": 4, "relevance": 5, "helpfulness": 3}, "2": {}}
    question = page.locator("#question").text_content()

    # Another browser (nothing in its storage) on a phone: the same pair, the draft restored.
    other = browser.new_context(viewport=PHONE)
    phone = other.new_page()
    try:
        sign_in(phone, live_server, annotator)
        phone.get_by_role("link", name="Continue rating").click() if phone.get_by_role(
            "link", name="Continue rating").count() else phone.get_by_role("link", name="Start rating").click()
        start(phone)
        expect(phone.locator("#question")).to_have_text(question)
        expect(row(phone, "1", "relevance").locator('input[value="5"]')).to_be_checked()
        expect(phone.get_by_label("Comment")).to_have_value("Second one rambles")
        expect(phone.locator("#status")).to_contain_text("draft")
        assert phone.evaluate("Object.keys(localStorage).filter((k) => k.startsWith('prbench.draft.')).length") == 1

        # The phone shows the answers in tabs; the rating rows are a short scroll away.
        tab_1, tab_2 = phone.get_by_role("tab", name=re.compile("Response 1")), \
            phone.get_by_role("tab", name=re.compile("Response 2"))
        expect(tab_1).to_have_attribute("aria-selected", "true")
        expect(phone.locator("#response-2")).to_be_hidden()
        expect(tab_1).to_contain_text("3/4")
        height = phone.evaluate("document.documentElement.scrollHeight")
        assert height < 2600, height  # was 4,360 px with the answers stacked
        assert elements_wider_than_the_viewport(phone) == []
        first = row(phone, "1", "factuality")
        first.scroll_into_view_if_needed()
        assert in_viewport(first, 844)
        phone.screenshot(path="/tmp/prbench-31-rate-390x844.png")
        phone.screenshot(path="/tmp/prbench-31-rate-390x844-full.png", full_page=True)
        phone.keyboard.press("2")  # the last row of response 1: the next field is on tab 2
        expect(tab_2).to_have_attribute("aria-selected", "true")
        expect(phone.locator("#response-1")).to_be_hidden()
        expect(phone.locator("#response-2")).to_be_visible()
        for key in "4321":
            phone.keyboard.press(key)
        expect(phone.locator("#filled-count")).to_have_text("8 of 8 rated")
        phone.keyboard.press("Enter")
        expect(phone.locator("#progress-text")).to_have_text("1 of 30")
    finally:
        other.close()
    assignment.refresh_from_db()
    assert assignment.status == Assignment.Status.SUBMITTED and assignment.draft is None  # cleared on submit
    rating = Rating.objects.get(annotator=annotator)
    assert rating.comment == "Second one rambles"
    shown_1 = rating.chosen if assignment.chosen_first else rating.rejected
    assert shown_1 == {"factuality": 4, "relevance": 5, "helpfulness": 3, "personal_rubrics": 2}


def test_a_skip_is_undone_and_a_rating_revised_on_the_rating_screen(page: Page, live_server, campaign):
    annotator = UserFactory(roles=["annotator"])
    page.set_viewport_size(LAPTOP)
    sign_in(page, live_server, annotator)
    page.goto(f"{live_server.url}/annotate/{campaign.pk}/")
    start(page)
    skipped_question = page.locator("#question").text_content()
    page.keyboard.press("s")
    page.keyboard.type("Cannot judge the second one.")
    page.get_by_label("Why do you skip it?").press("Control+Enter")
    expect(page.locator("#question")).not_to_have_text(skipped_question)
    for key in "54321234":
        page.keyboard.press(key)
    page.keyboard.press("Enter")
    expect(page.locator("#progress-text")).to_have_text("1 of 30")

    # "Your ratings" lists the rating and the skip, with an undo.
    page.get_by_role("link", name="Your ratings").click()
    expect(page).to_have_url(re.compile(rf"/annotate/{campaign.pk}/history/$"))
    skipped = page.locator("#skipped-table tbody tr")
    expect(skipped).to_have_count(1)
    expect(skipped).to_contain_text("Cannot judge the second one.")
    page.screenshot(path="/tmp/prbench-31-history-1400x900.png", full_page=True)
    page.get_by_role("button", name="Undo skip").click()
    expect(page.locator(".messages")).to_contain_text("skip is undone")
    expect(page.locator("#skipped-table")).to_have_count(0)
    page.goto(f"{live_server.url}/annotate/{campaign.pk}/")
    expect(page.locator("#question")).to_have_text(skipped_question)  # it came back

    # Revising is the rating screen, prefilled, with the rubric and the keyboard.
    page.goto(f"{live_server.url}/annotate/{campaign.pk}/history/")
    page.get_by_role("link", name="Revise").click()
    expect(page.get_by_role("heading", name="Revise your rating")).to_be_visible()
    expect(page.get_by_role("dialog", name="Guidelines")).to_be_hidden()
    expect(page.locator("#rubric li").first).not_to_be_empty()
    expect(page.locator("#filled-count")).to_have_text("8 of 8 rated")
    expect(row(page, "1", "factuality").locator('input[value="5"]')).to_be_checked()
    expect(row(page, "1", "factuality")).to_contain_text("Mostly wrong")  # the anchors' labels
    assert in_viewport(row(page, "2", "personal_rubrics"), 900)
    page.screenshot(path="/tmp/prbench-31-revise-1400x900.png")
    page.keyboard.press("1")  # the first row is current: 5 -> 1, then the next row
    expect(row(page, "1", "relevance")).to_have_class(re.compile(r"\bis-current\b"))
    page.get_by_label("Comment").fill("Looked again")
    page.keyboard.press("Escape")
    page.set_viewport_size(PHONE)
    assert elements_wider_than_the_viewport(page) == []
    page.screenshot(path="/tmp/prbench-31-revise-390x844.png")
    page.keyboard.press("Enter")
    expect(page.locator(".messages")).to_contain_text("Your revised rating is saved")
    rating = Rating.objects.get(annotator=annotator)
    shown_1 = rating.chosen if rating.assignment.chosen_first else rating.rejected
    assert shown_1 == {"factuality": 1, "relevance": 4, "helpfulness": 3, "personal_rubrics": 2}
    assert rating.comment == "Looked again" and rating.revisions.count() == 1
    page.screenshot(path="/tmp/prbench-31-history-390x844.png", full_page=True)


def test_staff_assign_annotators_preview_guidelines_and_step_through_pairs(page: Page, live_server, campaign):
    staff = UserFactory(is_staff=True)
    UserFactory(username="fay", roles=["annotator"])
    page.set_viewport_size(LAPTOP)
    sign_in(page, live_server, staff)
    page.goto(live_server.url + "/annotation/campaigns/new/")
    guidelines = page.get_by_role("textbox", name="Guidelines")
    expect(guidelines).to_have_value(re.compile(r"^# How to rate"))  # the template, not an empty box
    page.get_by_label("Start the guidelines from").select_option(label=f"Copy from {campaign.name} (sample)")
    page.get_by_role("button", name="Use").click()
    expect(guidelines).to_have_value("# Rate\n\nRate each answer.")
    guidelines.fill("# Pilot\n\nRead **both** answers first.")
    page.get_by_role("button", name="Preview guidelines").click()
    preview = page.locator("#guidelines-preview")
    expect(preview.get_by_role("heading", name="Pilot")).to_be_visible()
    expect(preview.locator("strong")).to_have_text("both")
    page.screenshot(path="/tmp/prbench-31-campaign-new-1400x900.png", full_page=True)
    page.get_by_label("fay").check()
    page.get_by_role("button", name="Open campaign").click()
    expect(page.locator(".messages")).to_contain_text("is open")
    page.goto(live_server.url + "/annotation/campaigns/")
    expect(page.locator("#campaigns-table")).to_contain_text("Rated by fay only")

    # The pair view: the rubric with its evidence, and previous / next.
    first = campaign.pairs.order_by("item__position").first().item
    page.goto(f"{live_server.url}/annotation/campaigns/{campaign.pk}/pairs/{first.source_id}/")
    expect(page.locator("#pair-rubric")).to_contain_text(first.rubric_aspects[0]["aspect"])
    expect(page.get_by_text("Pair 1 of 30 in benchmark order")).to_be_visible()
    page.get_by_role("link", name="Next pair →").click()
    expect(page.get_by_text("Pair 2 of 30 in benchmark order")).to_be_visible()
    page.screenshot(path="/tmp/prbench-31-pair-1400x900.png", full_page=True)
    page.set_viewport_size(PHONE)
    assert elements_wider_than_the_viewport(page) == []
    page.screenshot(path="/tmp/prbench-31-pair-390x844.png", full_page=True)
    page.get_by_role("link", name="← Previous pair").click()
    expect(page.get_by_text("Pair 1 of 30 in benchmark order")).to_be_visible()
    page.goto(live_server.url + "/annotation/campaigns/new/")
    assert elements_wider_than_the_viewport(page) == []
    page.screenshot(path="/tmp/prbench-31-campaign-new-390x844.png", full_page=True)
