"""What goes wrong in a page under test, collected as readable lines."""

from collections.abc import Callable

from playwright.sync_api import Page


def watch_page(page: Page, *, console_ignored: Callable[[str], bool] = lambda text: False) -> list[str]:
    """From now on, every console error (unless `console_ignored(text)`), uncaught exception
    and failed request of `page`, appended to the list returned. A request Chromium dropped
    itself because the page navigated on (net::ERR_ABORTED: the favicon, mid-load, when a form
    is sent) is not a failure of the page."""
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and not console_ignored(m.text)
            and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: r.failure != "net::ERR_ABORTED"
            and problems.append(f"request failed: {r.url} {r.failure}"))
    return problems
