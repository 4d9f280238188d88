"""Headless Chromium (Debian's ``chromium``) driven by Playwright, for the console's tests.

Playwright's own browser download is never used: the system Chromium is launched by path
(``RAGWARDEN_CHROMIUM``, else ``chromium`` on PATH). Where none is installed the tests skip with
that reason, unless ``RAGWARDEN_REQUIRE_BROWSER=1`` (set by ``make test``, which installs it) makes
the absence a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# No background traffic: the network here is loopback only, and a test must not wait on lookups.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    """The Chromium binary to drive, or a skip (a failure under ``RAGWARDEN_REQUIRE_BROWSER=1``)."""
    found = os.environ.get("RAGWARDEN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = "no Chromium: install Debian's chromium package (make test does) or set RAGWARDEN_CHROMIUM"
    if os.environ.get("RAGWARDEN_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser for the duration of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
