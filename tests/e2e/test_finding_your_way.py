"""Finding one's way in real Chromium: every page for every role without console errors or
failed requests, the submissions queue, the submit form by kind, model pages, the
leaderboard's search and columns, and charts whose labels fit at 1366 and 390 px."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from annotation.services.campaigns import campaign_create
from leaderboard.models import DownstreamOutcome, ExternalBenchmarkScore, RunStatus
from pipeline.services import benchmark_import
from tests.e2e.watch import watch_page
from tests.factories import PASSWORD, UserFactory
from tests.leaderboard.test_pages import finished_scores
from tests.leaderboard.test_submissions import submit_scores
from tests.pipeline.test_formats import SAMPLE

pytestmark = [pytest.mark.e2e]
SHOTS = Path("/tmp/prbench-screens")


@pytest.fixture
def world(transactional_db):
    sample = benchmark_import(path=SAMPLE, name="sample").benchmark
    users = {"annotator": UserFactory(roles=["annotator"]), "researcher": UserFactory(roles=["researcher"]),
             "staff": UserFactory(is_staff=True)}
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    a = finished_scores(users["researcher"], sample, "Alpha RM", ids[:4])
    b = finished_scores(users["researcher"], sample, "Beta RM", ids[:12])
    failed = submit_scores(users["researcher"], sample, settings=("no_profile",), wrong={"z"})
    failed.runs.update(status=RunStatus.FAILED, error="the worker ran out of memory at pair 12")
    for rm, value in (("Alpha RM", 1.1), ("Beta RM", 0.9)):
        for k in (1, 4, 16):
            DownstreamOutcome.objects.create(rm_name=rm, kind="best_of_n", k=k, outcome=value * (1 + k / 64), n=30)
    campaign = campaign_create(user=users["staff"], benchmark="sample", guidelines="Rate.", overlap=2)
    return {"sample": sample, "users": users, "a": a, "b": b, "failed": failed, "campaign": campaign}


def login(page: Page, base: str, user) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name=re.compile("log in", re.I)).click()
    expect(page).to_have_url(re.compile(r"/$"))


def pages_for(role: str, w) -> list[tuple[str, int]]:
    a, b = w["a"].pk, w["b"].pk
    per_pair = [f"/models/{a}/pairs/", f"/models/{a}/compare/?with={b}&setting=profile"]
    # The world's campaign is open: per-pair pages are withheld (403 with the reason) from those
    # who may rate in it and from anonymous visitors (pipeline/blindness.py).
    blind = 403 if role in ("anonymous", "annotator") else 200
    public = [("/", 200), ("/correlations/", 200), (f"/models/{a}/", 200), *((url, blind) for url in per_pair),
              ("/no/such/page/", 404)]
    research = [("/benchmarks/", 200), ("/benchmarks/sample/", 200), ("/submit/", 200), ("/submissions/", 200),
                (f"/submissions/{w['failed'].pk}/", 200), (f"/submissions/{a}/", 200), ("/jobs/", 200)]
    annotate = [("/annotate/", 200)]
    staff = [("/pipeline/builds/", 200), ("/annotation/campaigns/new/", 200),
             (f"/annotation/campaigns/{w['campaign'].pk}/report/", 200), ("/admin/", 200)]
    if role == "anonymous":
        return public + [("/accounts/login/", 200)]
    if role == "annotator":
        return public + annotate + [("/submit/", 403), ("/admin/", 403), ("/pipeline/builds/", 403)]
    if role == "researcher":
        return public + research + [("/annotate/", 403), ("/admin/", 403)]
    return public + research + annotate + staff


# Each role at one width (both widths for every role would double the time): the phone
# width where pages must not scroll sideways, the laptop width where the staff bar is longest.
WIDTH = {"anonymous": 390, "annotator": 390, "researcher": 390, "staff": 1366}


@pytest.mark.parametrize("role", ["anonymous", "annotator", "researcher", "staff"])
def test_every_page_renders_for_every_role_without_console_errors_or_failed_requests(
        page: Page, live_server, world, role):
    width = WIDTH[role]
    page.set_viewport_size({"width": width, "height": 900})
    # A 403/404 page logs its own status as a console error; the response check below covers
    # every other resource.
    problems = watch_page(page, console_ignored=lambda text: text.startswith(
        "Failed to load resource: the server responded with a status of 40"))
    page.on("response", lambda r: r.request.resource_type != "document" and r.status >= 400
            and problems.append(f"{r.status} for {r.url}"))
    if role != "anonymous":
        login(page, live_server.url, world["users"][role])
    SHOTS.mkdir(exist_ok=True)
    for path, status in pages_for(role, world):
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == status, (role, path)
        if not (path.startswith("/admin/") and status == 200):
            expect(page.locator("header.site-header")).to_be_visible()  # the app's own page, also for 403/404
            # Wide tables scroll inside their card; the page itself never scrolls sideways, also with
            # every <details> (a result's manifest, a definition list) open.
            page.evaluate("document.querySelectorAll('details').forEach(function (d) { d.open = true; })")
            assert page.evaluate("document.documentElement.scrollWidth") <= width, (role, path)
            if width >= 1366:  # the whole navigation and the account fit on one row
                assert page.locator("header.site-header").bounding_box()["height"] <= 64, (role, path)
        page.screenshot(path=str(SHOTS / f"{role}{re.sub(r'[^a-z0-9]+', '-', path)}.png"), full_page=True)
    assert not problems, problems


def test_a_researcher_finds_a_failed_submission_and_cancels_a_queued_one(page: Page, live_server, world):
    queued = submit_scores(world["users"]["researcher"], world["sample"], settings=("profile",), wrong={"q"})
    login(page, live_server.url, world["users"]["researcher"])
    page.get_by_role("link", name="My submissions").click()
    failed_row = page.locator(f"tr[data-submission='{world['failed'].pk}']")
    expect(failed_row.locator(".run-status")).to_have_text("Failed")
    expect(failed_row).to_contain_text("the worker ran out of memory at pair 12")
    row = page.locator(f"tr[data-submission='{queued.pk}']")
    page.once("dialog", lambda dialog: dialog.dismiss())  # "No": nothing happens
    row.get_by_role("button", name="Cancel").click()
    assert queued.runs.get().status == RunStatus.QUEUED
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Cancel").click()
    expect(page.locator(".message")).to_contain_text("Cancelled 1 run(s)")
    assert queued.runs.get().status == RunStatus.CANCELLED


def test_jobs_offer_only_the_actions_a_job_allows_and_cancel_asks_first(page: Page, live_server, world):
    queued = submit_scores(world["users"]["researcher"], world["sample"], settings=("profile",), wrong={"q"})
    login(page, live_server.url, world["users"]["researcher"])
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs").click()
    failed = page.locator(f"#job-evaluation-{world['failed'].runs.get().pk}")
    expect(failed).to_contain_text("the worker ran out of memory at pair 12")
    expect(failed.get_by_role("button", name="Retry")).to_be_visible()
    expect(failed.get_by_role("button", name="Cancel")).to_be_hidden()
    done = page.locator(f"#job-evaluation-{world['a'].runs.get().pk}")
    expect(done.locator("button")).to_have_count(2)  # in the page for live updates, not shown
    expect(done.get_by_role("button", name="Retry")).to_be_hidden()  # a finished job has nothing to act on
    expect(done.get_by_role("button", name="Cancel")).to_be_hidden()
    row = page.locator(f"#job-evaluation-{queued.runs.get().pk}")
    expect(row.get_by_role("button", name="Retry")).to_be_hidden()
    page.once("dialog", lambda dialog: dialog.dismiss())  # "No": nothing happens
    row.get_by_role("button", name="Cancel").click()
    assert queued.runs.get().status == RunStatus.QUEUED
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Cancel").click()
    expect(page.locator(".message")).to_contain_text("Cancelled")
    assert queued.runs.get().status == RunStatus.CANCELLED


def test_the_submit_form_shows_only_the_chosen_kinds_fields(page: Page, live_server, world):
    login(page, live_server.url, world["users"]["researcher"])
    page.goto(f"{live_server.url}/submit/")
    page.get_by_label("Kind").select_option("scores")
    expect(page.locator("#field-scores_file")).to_be_visible()
    expect(page.locator("#field-model_path")).to_be_hidden()
    expect(page.locator("#field-m")).to_be_hidden()
    expect(page.locator("#example-scores")).to_have_attribute("href", re.compile(r"benchmark=sample$"))
    page.get_by_label("Kind").select_option("pgenrm")
    expect(page.locator("#field-m")).to_be_visible()
    expect(page.locator("#field-judge_backend")).to_be_visible()
    expect(page.locator("#field-scores_file")).to_be_hidden()
    expect(page.locator("input[name=settings][value=plan]")).to_be_disabled()  # the sample has no plans
    expect(page.locator("#settings-note")).to_be_visible()
    # A scalar RM whose folder is missing: the error comes back on the field, before anything is queued.
    page.get_by_label("Kind").select_option("scalar")
    page.get_by_label("Display name").fill("Nowhere RM")
    page.get_by_label("Model path").fill("no-such-folder")
    page.get_by_role("button", name="Submit for evaluation").click()
    expect(page.locator("#field-model_path .field-error")).to_contain_text("does not exist")


def test_the_leaderboard_searches_toggles_columns_and_links_public_model_pages(page: Page, live_server, world):
    page.goto(f"{live_server.url}/")
    expect(page.locator("#leaderboard-table tbody tr")).to_have_count(2)
    page.get_by_label("Model name").fill("beta")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#leaderboard-table tbody tr")).to_have_count(1)
    page.locator("#column-toggles summary").click()
    page.locator("#column-toggles input[value=ci]").uncheck()
    expect(page.locator("#leaderboard-table th[data-col=ci]")).to_be_hidden()
    page.reload()
    expect(page.locator("#leaderboard-table th[data-col=ci]")).to_be_hidden()  # remembered
    page.get_by_role("link", name="Beta RM").click()
    expect(page).to_have_url(re.compile(rf"/models/{world['b'].pk}/$"))
    expect(page.locator("#model-card")).to_contain_text("Uploaded scores")
    # While the world's campaign is open, a visitor is told why per-pair pages are not offered;
    # a researcher who does not rate in it compares the two models.
    expect(page.locator("#compare")).to_contain_text("withheld while a blind rating campaign on it is open")
    login(page, live_server.url, world["users"]["researcher"])
    page.goto(f"{live_server.url}/models/{world['b'].pk}/")
    page.get_by_label("Another model on the same pairs").select_option(str(world["a"].pk))
    page.get_by_role("button", name="Compare").click()
    expect(page.locator("#compare-summary")).to_contain_text("McNemar")
    expect(page.locator("#differ-table tbody tr")).to_have_count(8)


def overlap(a: dict, b: dict, slack: float = 1.0) -> bool:
    """Whether two bounding boxes overlap by more than `slack` pixels both ways."""
    return (min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"]) > slack
            and min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"]) > slack)


@pytest.mark.parametrize("width, height", [(1366, 768), (390, 844)])
def test_chart_labels_fit_inside_the_charts(page: Page, live_server, world, width, height):
    # As in the demo: several benchmarks and settings with long names, so the bar chart's tick
    # labels are long and many (they push the plot's margins, where titles and legends live).
    for bench, setting in (("PersonalRewardBench-LaMP-QA", "profile"), ("RewardBench-personalized", "profile"),
                           ("Chatbot-Arena-preferences", "")):
        for i, rm in enumerate(("Gamma RM", "Delta RM", "Epsilon RM", "Zeta RM")):
            ExternalBenchmarkScore.objects.create(benchmark=bench, rm_name=rm, source="lab", setting=setting,
                                                  accuracy=0.55 + 0.07 * i + 0.01 * len(bench) % 3)
    for i, rm in enumerate(("Gamma RM", "Delta RM", "Epsilon RM", "Zeta RM")):
        DownstreamOutcome.objects.create(rm_name=rm, source="lab", kind="best_of_n", k=16, outcome=0.9 + 0.2 * i, n=30)
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{live_server.url}/correlations/")
    expect(page.locator("#chart-bars .xtick text")).to_have_count(3)  # the three benchmarks above
    for chart in ("#chart-scatter", "#chart-bars", "#chart-curves"):
        svg = page.locator(f"{chart} .main-svg").first
        expect(svg).to_be_attached()
        box = svg.bounding_box()
        # Axis titles are whole (not cut by the chart's edge) and the legend covers no title or tick label.
        legend = page.locator(f"{chart} .legend").bounding_box()
        for text in page.locator(f"{chart} .xtitle, {chart} .ytitle, {chart} .xtick text").all():
            t = text.bounding_box()
            assert t is not None and not overlap(legend, t), (chart, width, text.text_content())
        xtitle, ytitle = (page.locator(f"{chart} .{axis}title").bounding_box() for axis in "xy")
        assert not overlap(xtitle, ytitle), chart
        for tick in page.locator(f"{chart} .xtick text").all():
            assert not overlap(tick.bounding_box(), xtitle), (chart, width, tick.text_content())
        for text in page.locator(f"{chart} .xtitle, {chart} .ytitle, {chart} .xtick text, {chart} .ytick text, "
                                 f"{chart} .textpoint text").all():
            t = text.bounding_box()
            if t is None:
                continue
            assert box["x"] - 1 <= t["x"] and t["x"] + t["width"] <= box["x"] + box["width"] + 1, (chart, text.text_content())
            assert box["y"] - 1 <= t["y"] and t["y"] + t["height"] <= box["y"] + box["height"] + 1, (chart, text.text_content())
        assert page.locator(f"{chart} .xtitle").count() == 1 and page.locator(f"{chart} .ytitle").count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= width + 1  # no sideways scrolling
    page.screenshot(path=f"/tmp/prbench-correlations-{width}.png", full_page=True)
