"""Debian's chromium for the browser tests, started headless through Playwright (never
``playwright install``: it downloads)."""

from __future__ import annotations

import re
import shutil

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def launch(playwright):
    return playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=ARGS)


def login(browser, url: str, user: str, password: str):
    """A new page of a fresh context, logged in to the hub at ``url`` as ``user``."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(60_000)
    page.goto(url + "/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
    return page
