"""The paper's table in real Chromium (issue 30): groups, CIs beneath and on hover, marks, reported rows,
and the LaTeX download; a screenshot is left at /tmp/prbench-paper-table.png."""

import pytest
from playwright.sync_api import Page, expect

from tests.leaderboard.test_paper_table import world  # noqa: F401 (the fixture: two RMs and reported figures)

pytestmark = [pytest.mark.e2e]


def test_the_paper_table_page_and_its_latex(page: Page, live_server, transactional_db, world):  # noqa: F811
    page.set_default_timeout(120_000)  # a loaded CI machine
    page.goto(f"{live_server.url}/paper/?benchmark=paper-bench")
    table = page.locator("#paper-table")
    expect(table.locator("tr.paper-group")).to_have_text(["Scalar classifiers", "Generative judges",
                                                          "Fine-tuned / reasoning RMs"])
    beta = table.locator("tbody tr", has_text="beta_judge")
    # With profile, All: 12 of 12, bold, top group and significantly better than without profile.
    cell = beta.locator("td").nth(7)
    expect(cell).to_contain_text("100.0†▲")
    expect(cell).to_contain_text("[90.0, 100.0]")
    expect(cell.locator("span[title]")).to_have_attribute("title", "95% CI 90.0 – 100.0, n = 12")
    expect(table.locator("tr.paper-reported")).to_have_count(2)
    expect(page.locator("#paper-marks")).to_contain_text("exact McNemar")
    page.screenshot(path="/tmp/prbench-paper-table.png", full_page=True)
    with page.expect_download() as download:
        page.click("#paper-tex")
    latex = open(download.value.path(), encoding="utf-8").read()
    assert latex.startswith("% Personalized RewardBench: paper-bench") and r"\begin{tabular}" in latex
    assert r"\textbf{100.0}$^{\dag\uparrow}$ {\scriptsize[90.0, 100.0]}" in latex
