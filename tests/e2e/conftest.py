"""Playwright against the system's Debian Chromium (browsers are never downloaded)."""

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")

# Playwright's sync API keeps an asyncio event loop running in the test thread, which
# makes Django refuse ORM calls from that thread. The tests only set up data there.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not CHROMIUM.exists():
        pytest.skip(f"end-to-end tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)")
    return {
        **browser_type_launch_args,
        "executable_path": str(CHROMIUM),
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }
