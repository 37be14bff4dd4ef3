"""An annotator rates blind pairs in real Chromium, with the keyboard, and the ratings land in
the database by role (the screen only ever says "Response 1" and "Response 2")."""

import json
import re

import pytest
from playwright.sync_api import Page, expect

from annotation.models import Assignment, Rating
from annotation.services.campaigns import campaign_create
from pipeline.services import benchmark_import
from tests.e2e.test_benchmark_browser import elements_wider_than_the_viewport, log_in
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("transactional_db")]

DIMENSIONS = ("factuality", "relevance", "helpfulness", "personal_rubrics")
GUIDELINES = "# Read me\n\nRate **each** response."
FIRST = {"1": dict(zip(DIMENSIONS, (5, 4, 5, 2))), "2": dict(zip(DIMENSIONS, (3, 2, 1, 4)))}
SECOND = {"1": dict(zip(DIMENSIONS, (4, 5, 3, 1))), "2": dict(zip(DIMENSIONS, (2, 3, 5, 4)))}


@pytest.fixture
def staff():
    benchmark_import(path=SAMPLE, name="sample")
    return UserFactory(is_staff=True)


@pytest.fixture
def annotator():
    return UserFactory(roles=["annotator"])


def field(page: Page, response: str, dimension: str):
    return page.locator(f'fieldset[data-field="ratings.{response}.{dimension}"]')


def type_ratings(page: Page, values: dict[str, int]):
    for dimension in DIMENSIONS:
        page.keyboard.press(str(values[dimension]))


def expect_checked(page: Page, response: str, values: dict[str, int]):
    for dimension, value in values.items():
        expect(field(page, response, dimension).locator(f'input[value="{value}"]')).to_be_checked()


def focused_field(page: Page) -> str | None:
    return page.evaluate("() => document.activeElement.closest('[data-field]')?.dataset.field ?? null")


def drafts(page: Page) -> dict:
    return page.evaluate("""() => Object.fromEntries(Object.keys(localStorage)
        .filter((k) => k.startsWith("prbench.draft.")).map((k) => [k, JSON.parse(localStorage.getItem(k))]))""")


def role_hints_in_markup(page: Page) -> list[str]:
    """Class names, ids and attributes anywhere on the screen that name a response's role."""
    return page.evaluate("""() => [...document.querySelectorAll("#annotate, #annotate *")].flatMap((el) =>
        [...el.attributes].map((a) => `${a.name}=${a.value}`)
            .filter((s) => /(^|[^a-z])(chosen|rejected|winner|loser|preferred)/i.test(s)))""")


def test_an_annotator_rates_two_pairs_with_the_keyboard_and_the_ratings_are_stored_by_role(
        page: Page, live_server, staff, annotator):
    campaign = campaign_create(user=staff, benchmark="sample", guidelines=GUIDELINES, overlap=1,
                               target_per_annotator=2)
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in(page, live_server, annotator)
    page.goto(live_server.url + "/annotate/")
    page.get_by_role("link", name="Start rating").click()
    expect(page).to_have_url(re.compile(rf"/annotate/{campaign.pk}/$"))

    # The guidelines come first, rendered from Markdown, and are dismissed with the keyboard.
    guidelines = page.get_by_role("dialog", name="Guidelines")
    expect(guidelines).to_be_visible()
    expect(guidelines.get_by_role("heading", name="Read me")).to_be_visible()
    expect(guidelines.locator("strong")).to_have_text("each")
    start = guidelines.get_by_role("button", name="Start rating")
    expect(start).to_be_focused()
    page.keyboard.press("Escape")  # the first time, only the button starts rating
    expect(guidelines).to_be_visible()
    page.keyboard.press("Enter")
    expect(guidelines).to_be_hidden()

    # The pair: question, ranked profile, rubric, two neutral responses, progress.
    question = page.locator("#question")
    expect(question).not_to_be_empty()
    first_question = question.text_content()
    expect(page.locator("#profile li")).to_have_count(10)
    expect(page.locator("#rubric li").first).not_to_be_empty()
    expect(page.locator("#response-1-text")).not_to_be_empty()
    expect(page.locator("#response-2-text")).not_to_be_empty()
    expect(page.locator("#progress-text")).to_have_text("0 of 2")
    expect(page.locator("fieldset.ann-dim")).to_have_count(8)
    expect(field(page, "1", "factuality")).to_contain_text("Mostly wrong")  # anchors are visible
    expect(field(page, "1", "factuality")).to_have_class(re.compile(r"\bis-current\b"))
    assert role_hints_in_markup(page) == []
    box_1, box_2 = page.locator("#response-1").bounding_box(), page.locator("#response-2").bounding_box()
    assert box_1["x"] < box_2["x"] and abs(box_1["y"] - box_2["y"]) < 2  # side by side

    # Half the form with digit keys only: each digit rates the current field and moves on.
    type_ratings(page, FIRST["1"])
    expect_checked(page, "1", FIRST["1"])
    expect(field(page, "2", "factuality")).to_have_class(re.compile(r"\bis-current\b"))
    assert focused_field(page) == "ratings.2.factuality"
    expect(page.locator("#filled-count")).to_have_text("4 of 8 rated")
    page.screenshot(path="/tmp/prbench-annotate.png", full_page=True)
    (draft,) = drafts(page).values()
    assert draft["ratings"] == {"1": FIRST["1"], "2": {}}

    # A reload keeps the same pair and restores the draft; the guidelines do not come back.
    page.reload()
    expect(question).to_have_text(first_question)
    expect(page.get_by_role("dialog", name="Guidelines")).to_be_hidden()
    expect_checked(page, "1", FIRST["1"])
    expect(page.locator("#filled-count")).to_have_text("4 of 8 rated")
    expect(page.locator("#status")).to_contain_text("draft")
    expect(field(page, "2", "factuality")).to_have_class(re.compile(r"\bis-current\b"))
    type_ratings(page, FIRST["2"])
    expect_checked(page, "2", FIRST["2"])
    expect(page.get_by_role("button", name="Submit ratings")).to_be_focused()
    (first_draft_key,) = drafts(page)
    page.keyboard.press("Enter")

    # The next pair arrives without a page load.
    expect(page.locator("#progress-text")).to_have_text("1 of 2")
    expect(question).not_to_have_text(first_question)
    expect(question).not_to_be_empty()
    second_question = question.text_content()
    expect(page.locator("#filled-count")).to_have_text("0 of 8 rated")
    expect(page.locator("fieldset.ann-dim input:checked")).to_have_count(0)
    assert first_draft_key not in drafts(page)  # the submitted draft is gone
    assert Rating.objects.filter(annotator=annotator).count() == 1

    # Phone width: one response at a time, in tabs (the digits move on to response 2's tab);
    # no sideways scrolling.
    page.set_viewport_size({"width": 390, "height": 844})
    type_ratings(page, SECOND["1"])
    assert elements_wider_than_the_viewport(page) == []
    expect(page.locator("#response-1")).to_be_hidden()
    expect(page.locator("#response-2")).to_be_visible()
    expect(page.get_by_role("tab", name=re.compile("Response 2"))).to_have_attribute("aria-selected", "true")
    page.screenshot(path="/tmp/prbench-annotate-narrow.png", full_page=True)

    # Leave one field out (Tab past it): the submit is refused loudly, on that field.
    page.keyboard.press(str(SECOND["2"]["factuality"]))
    page.keyboard.press(str(SECOND["2"]["relevance"]))
    assert focused_field(page) == "ratings.2.helpfulness"
    page.keyboard.press("Tab")
    assert focused_field(page) == "ratings.2.personal_rubrics"
    page.keyboard.press(str(SECOND["2"]["personal_rubrics"]))
    page.keyboard.press("Enter")
    missing = field(page, "2", "helpfulness")
    expect(missing).to_have_class(re.compile(r"\bis-missing\b"))
    expect(missing).to_contain_text("Rate this")
    expect(missing).to_be_in_viewport()
    assert focused_field(page) == "ratings.2.helpfulness"
    expect(page.locator("#form-error")).to_contain_text("not rated")
    assert Rating.objects.filter(annotator=annotator).count() == 1  # nothing was sent
    page.set_viewport_size({"width": 1280, "height": 900})
    page.keyboard.press(str(SECOND["2"]["helpfulness"]))
    expect(missing).not_to_have_class(re.compile(r"\bis-missing\b"))
    expect(missing).not_to_contain_text("Rate this")
    expect_checked(page, "2", SECOND["2"])
    page.keyboard.press("Enter")

    # Target reached: a calm "no work left" state, not an error.
    no_work = page.locator("#no-work")
    expect(no_work).to_be_visible()
    expect(no_work).to_contain_text("No work left")
    expect(page.locator("#progress-text")).to_have_text("2 of 2")
    expect(page.locator("#load-error")).to_be_hidden()
    page.screenshot(path="/tmp/prbench-annotate-done.png", full_page=True)

    ratings = {r.item.question: r for r in Rating.objects.filter(annotator=annotator)
               .select_related("assignment", "item")}
    assert set(ratings) == {first_question, second_question}
    for question_text, typed in ((first_question, FIRST), (second_question, SECOND)):
        rating = ratings[question_text]
        chosen_key, rejected_key = ("1", "2") if rating.assignment.chosen_first else ("2", "1")
        assert rating.chosen == typed[chosen_key]
        assert rating.rejected == typed[rejected_key]
        assert rating.assignment.status == Assignment.Status.SUBMITTED
        assert 0 < rating.seconds < 300
        assert rating.comment == "" and rating.flag_reason == ""


def test_server_refusals_keep_the_draft_and_a_skip_needs_a_reason(page: Page, live_server, staff, annotator):
    campaign = campaign_create(user=staff, benchmark="sample", guidelines=GUIDELINES, overlap=2)
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in(page, live_server, annotator)
    page.goto(f"{live_server.url}/annotate/{campaign.pk}/")
    page.get_by_role("button", name="Start rating").click()
    question = page.locator("#question")
    expect(question).not_to_be_empty()
    first_question = question.text_content()

    # The guidelines come back on demand with "?" and go away with it.
    page.keyboard.press("?")
    expect(page.get_by_role("dialog", name="Guidelines")).to_be_visible()
    expect(page.get_by_role("button", name="Back to rating")).to_be_focused()
    page.keyboard.press("?")
    expect(page.get_by_role("dialog", name="Guidelines")).to_be_hidden()

    type_ratings(page, FIRST["1"])
    type_ratings(page, FIRST["2"])
    page.get_by_label("Comment").fill("Both read well.")
    page.get_by_label("Comment").press("Enter")  # a new line, not a submit
    expect(page.get_by_label("Comment")).to_have_value("Both read well.\n")

    # The server's refusals are mocked by one route for the whole test: it answers the queued
    # responses in turn and lets every other request through to the server, so the page's
    # interception never changes between two submits. (With unroute + route between them, about
    # one run in a dozen never showed the 409's message; `answered` now says which submits the
    # mock saw.)
    queued: list[tuple[int, dict]] = []
    answered: list[int] = []

    def refuse(route):
        if not queued:
            route.fallback()
            return
        status, body = queued.pop(0)
        answered.append(status)
        route.fulfill(status=status, json=body)

    page.route("**/api/annotation/ratings/", refuse)

    # A 400 names a field: the message sits on that field, which gets the focus.
    queued.append((400, {"detail": "ratings.2.helpfulness: must be a whole number from 1 to 5.",
                         "field": "ratings.2.helpfulness"}))
    page.get_by_label("Comment").press("Control+Enter")
    target = field(page, "2", "helpfulness")
    expect(target).to_contain_text("must be a whole number from 1 to 5")
    expect(target).to_have_class(re.compile(r"\bhas-error\b"))
    assert focused_field(page) == "ratings.2.helpfulness"
    assert answered == [400]

    # A 409 (time ran out and the pair filled up): the message shows and the draft stays.
    queued.append((409, {"detail": "Your time on this pair ran out and enough people have rated it since; "
                                   "your draft is kept."}))
    page.keyboard.press("Enter")
    expect(page.locator("#form-error")).to_contain_text("ran out")
    assert answered == [400, 409]
    another = page.get_by_role("button", name="Get another pair")
    expect(another).to_be_focused()
    (draft,) = drafts(page).values()
    assert draft["ratings"] == FIRST and draft["comment"] == "Both read well.\n"
    assert Rating.objects.count() == 0

    # Skip with "s": a reason is required; flagging is a checkbox away.
    page.keyboard.press("s")
    skip = page.get_by_role("dialog", name="Skip this pair")
    expect(skip).to_be_visible()
    expect(page.get_by_label("Why do you skip it?")).to_be_focused()
    page.keyboard.press("Control+Enter")
    expect(skip).to_contain_text("Say why you skip this pair.")
    page.keyboard.type("The question is cut off.")
    page.keyboard.press("Tab")
    page.keyboard.press("Space")
    expect(page.get_by_label("Flag it as a problem for the researchers")).to_be_checked()
    page.get_by_label("Why do you skip it?").press("Control+Enter")
    expect(skip).to_be_hidden()
    expect(question).not_to_have_text(first_question)
    expect(question).not_to_be_empty()
    skipped = Assignment.objects.get(annotator=annotator, status=Assignment.Status.SKIPPED)
    assert skipped.skip_reason == "The question is cut off." and skipped.flagged
    assert skipped.pair.item.question == first_question
    expect(page.locator("#progress-text")).to_have_text("0 of 30")
    # A flagged rating carries its reason.
    type_ratings(page, SECOND["1"])
    type_ratings(page, SECOND["2"])
    page.get_by_label("Flag a problem with this pair").check()
    page.keyboard.press("Enter")  # the empty reason is caught in the browser
    expect(page.locator('[data-field="flag_reason"]')).to_contain_text("Say what is wrong")
    expect(page.get_by_label("What is wrong?")).to_be_focused()
    page.keyboard.type("Response 2 repeats itself.")
    page.keyboard.press("Enter")
    expect(page.locator("#progress-text")).to_have_text("1 of 30")
    rating = Rating.objects.get(annotator=annotator)
    assert rating.flag_reason == "Response 2 repeats itself."
    assert answered == [400, 409]  # the last submit reached the server
    assert json.dumps(rating.chosen) != json.dumps(rating.rejected)


def test_active_time_counts_only_while_the_page_is_visible_and_used(page: Page, live_server, staff, annotator):
    campaign = campaign_create(user=staff, benchmark="sample", guidelines=GUIDELINES, overlap=1)
    log_in(page, live_server, annotator)
    page.clock.install()
    page.goto(f"{live_server.url}/annotate/{campaign.pk}/")
    page.get_by_role("button", name="Start rating").click()
    expect(page.locator("#question")).not_to_be_empty()

    def draft_seconds() -> float:
        (draft,) = drafts(page).values()
        return draft["seconds"]

    def set_visibility(state: str):
        page.evaluate("""(state) => {
            Object.defineProperty(document, "visibilityState", {value: state, configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }""", state)

    page.keyboard.press("5")
    page.clock.run_for(3 * 60_000)  # untouched for three minutes: only the first one counts
    assert 58 <= draft_seconds() <= 63
    page.keyboard.press("4")
    set_visibility("hidden")
    page.clock.run_for(30_000)  # another tab: nothing counts
    page.keyboard.press("5")  # (still hidden)
    assert 58 <= draft_seconds() <= 64
    set_visibility("visible")
    for key in "21234":
        page.keyboard.press(key)
    page.clock.run_for(10_000)
    page.keyboard.press("Enter")
    expect(page.locator("#progress-text")).to_have_text("1 of 30")
    rating = Rating.objects.get(annotator=annotator)
    assert 66 <= rating.seconds <= 76
