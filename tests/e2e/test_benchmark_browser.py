import pytest
from playwright.sync_api import Page, expect

from pipeline.models import Domain
from tests.factories import PASSWORD, BenchmarkFactory, BenchmarkItemFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("transactional_db")]

PROFILE = [
    {"id": "post-17", "category": "Lifestyle_and_Personal_Development",
     "text": "I started running last spring and now do three short runs a week before work."},
    {"id": "post-4", "category": "Lifestyle_and_Personal_Development",
     "text": "Money is tight this year, so I look for free or second-hand options first."},
    {"id": "post-9", "category": "Society_and_Culture",
     "text": "I volunteer at the community garden on Saturdays and love meeting neighbours there."},
]
CHOSEN = ("Since you already run three times a week, add one longer, slow run on Saturday after the "
          "garden and keep the weekday runs short.\n\nA used GPS watch or a free phone app is enough; "
          "skip paid plans.")
REJECTED = ("Sign up for a premium coaching subscription and buy a new pair of carbon-plated racing shoes. "
            "Train six days a week, including two interval sessions.")


@pytest.fixture
def benchmark_with_items():
    benchmark = BenchmarkFactory(
        name="lamp-synthetic-v1", description="A small synthetic sample in the Personalized RewardBench schema.",
        metadata={"synthetic": True, "generator": "demo"}, item_count=4,
        stats={"overall": {"items": 4, "mean_chosen_words": 38.0, "mean_rejected_words": 27.5,
                           "mean_length_ratio": 1.38, "mean_profile_posts": 3.0, "mean_rubric_aspects": 2.0},
               "by_domain": {
                   Domain.ARTS: {"items": 2, "mean_chosen_words": 40.0, "mean_rejected_words": 30.0,
                                 "mean_length_ratio": 1.333, "mean_profile_posts": 3.0, "mean_rubric_aspects": 2.0},
                   Domain.LIFESTYLE: {"items": 1, "mean_chosen_words": 36.0, "mean_rejected_words": 25.0,
                                      "mean_length_ratio": 1.44, "mean_profile_posts": 3.0, "mean_rubric_aspects": 2.0},
                   Domain.SOCIETY: {"items": 1, "mean_chosen_words": 36.0, "mean_rejected_words": 25.0,
                                    "mean_length_ratio": 1.44, "mean_profile_posts": 3.0, "mean_rubric_aspects": 2.0},
               }},
    )
    BenchmarkItemFactory(benchmark=benchmark, source_id="arts-1", domain=Domain.ARTS,
                         question="Which classic films should I watch to understand film noir?")
    BenchmarkItemFactory(benchmark=benchmark, source_id="arts-2", domain=Domain.ARTS,
                         question="How can I get better at sketching people in cafés?")
    target = BenchmarkItemFactory(
        benchmark=benchmark, source_id="life-1", domain=Domain.LIFESTYLE,
        category="Lifestyle_and_Personal_Development",
        question="How should I train for my first half marathon without spending much?",
        profile=PROFILE,
        narrative="A budget-conscious beginner runner with a fixed weekly routine and weekend volunteering.",
        rubric_aspects=[
            {"aspect": "Builds on the current routine", "evidence": "three short runs a week before work",
             "reason": "a plan that fits existing habits is more likely to be followed"},
            {"aspect": "Low cost", "evidence": "money is tight this year",
             "reason": "paid coaching or gear would not fit the user's situation"},
        ],
        chosen=CHOSEN, rejected=REJECTED,
    )
    BenchmarkItemFactory(benchmark=benchmark, source_id="soc-1", domain=Domain.SOCIETY,
                         question="How do I start a neighbourhood book club?")
    return benchmark, target


def log_in(page: Page, live_server, user):
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".site-user .username")).to_have_text(user.username)


def elements_wider_than_the_viewport(page: Page) -> list[str]:
    """Empty when the page has no horizontal scrollbar; otherwise the elements that stick out
    (ignoring those inside a scrollable container, which scroll on their own)."""
    return page.evaluate("""() => {
        const root = document.documentElement;
        if (root.scrollWidth <= root.clientWidth) return [];
        const width = root.clientWidth;
        const scrollsOnItsOwn = (el) => {
            for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
                const overflow = getComputedStyle(p).overflowX;
                if (overflow === "auto" || overflow === "scroll" || overflow === "hidden") return true;
            }
            return false;
        };
        return [...document.body.querySelectorAll("*")]
            .filter((el) => el.getBoundingClientRect().right > width + 0.5 && !scrollsOnItsOwn(el))
            .map((el) => `${el.tagName.toLowerCase()}.${el.className} right=${Math.round(el.getBoundingClientRect().right)}`)
            .concat([`scrollWidth=${root.scrollWidth} clientWidth=${width}`]);
    }""")


def test_a_researcher_browses_to_an_item_and_sees_its_profile_and_both_answers(page: Page, live_server,
                                                                              benchmark_with_items):
    benchmark, target = benchmark_with_items
    researcher = UserFactory(roles=["researcher"])
    page.set_viewport_size({"width": 1280, "height": 900})

    log_in(page, live_server, researcher)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Benchmarks").click()

    expect(page.get_by_role("heading", name="Benchmarks", level=1)).to_be_visible()
    page.get_by_role("link", name=benchmark.name).click()

    expect(page.get_by_role("heading", name=benchmark.name, level=1)).to_be_visible()
    expect(page.locator("#item-table tbody tr")).to_have_count(4)
    page.screenshot(path="/tmp/prbench-benchmark.png", full_page=True)

    page.get_by_label("Domain").select_option(Domain.LIFESTYLE)
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#item-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("life-1")

    rows.first.get_by_role("link", name="View").click()
    expect(page.locator("#item-source-id")).to_have_text("life-1")
    posts = page.locator("#profile li.profile-post")
    expect(posts).to_have_count(3)
    for rank, post in enumerate(PROFILE, start=1):
        entry = posts.nth(rank - 1)
        expect(entry.locator(".rank")).to_have_text(str(rank))
        expect(entry.locator(".post-id")).to_have_text(post["id"])
        expect(entry.locator(".post-text")).to_have_text(post["text"])
    expect(page.locator("#answer-chosen")).to_contain_text("Chosen")
    expect(page.locator("#answer-chosen .answer-text")).to_have_text(CHOSEN)
    expect(page.locator("#answer-rejected")).to_contain_text("Rejected")
    expect(page.locator("#answer-rejected .answer-text")).to_have_text(REJECTED)
    expect(page.locator("#rubric")).to_contain_text("Builds on the current routine")
    # Side by side on a wide screen.
    chosen_box = page.locator("#answer-chosen").bounding_box()
    rejected_box = page.locator("#answer-rejected").bounding_box()
    assert chosen_box["x"] < rejected_box["x"] and abs(chosen_box["y"] - rejected_box["y"]) < 2
    page.screenshot(path="/tmp/prbench-item.png", full_page=True)

    # A phone-width viewport stacks everything without a horizontal scrollbar.
    page.set_viewport_size({"width": 390, "height": 844})
    assert elements_wider_than_the_viewport(page) == []
    page.screenshot(path="/tmp/prbench-item-narrow.png", full_page=True)
    page.goto(live_server.url + benchmark.get_absolute_url())
    page.screenshot(path="/tmp/prbench-benchmark-narrow.png", full_page=True)
    assert elements_wider_than_the_viewport(page) == []
    for path in ("/", "/benchmarks/", "/accounts/login/"):
        page.goto(live_server.url + path)
        assert elements_wider_than_the_viewport(page) == [], path


def test_an_annotator_cannot_open_the_benchmark_browser(page: Page, live_server, benchmark_with_items):
    benchmark, target = benchmark_with_items
    annotator = UserFactory(roles=["annotator"])

    log_in(page, live_server, annotator)
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Benchmarks")).to_have_count(0)
    response = page.goto(live_server.url + target.get_absolute_url())
    assert response.status == 403
    assert CHOSEN.split(",")[0] not in page.content()
