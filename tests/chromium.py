"""Debian's chromium for the browser tests, started headless through Playwright (never
``playwright install``: it downloads)."""

from __future__ import annotations

import shutil

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def launch(playwright):
    return playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=ARGS)
