"""The admin panel in chromium against a real hub: the Usage page writes its range as
readable times, the overview chart keeps its labels inside it, and a refused quota puts
the stored value back in its field."""

import re
import shutil

import pytest
from hubclient import call
from hubproc import ADMIN_PW

from tests import chromium
from tests.waits import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]
MOMENT = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"


@pytest.fixture
def admin(hub, browser):
    page = chromium.login(browser, hub.url, "admin", ADMIN_PW)
    yield page
    page.context.close()


def test_usage_writes_its_range_as_readable_times(hub, admin):
    admin.goto(hub.url + "/services/gpupool/usage")
    title = admin.inner_text("#usage-title")
    assert re.fullmatch(rf"GPU-hours by project, {MOMENT} to {MOMENT}", title), title
    admin.goto(hub.url + "/services/gpupool/usage?from=2026-11-01&to=2026-11-28&by=user")
    assert admin.inner_text("#usage-title") == "GPU-hours by user, 2026-11-01 00:00 UTC to 2026-11-29 00:00 UTC"


def test_the_overview_charts_labels_lie_inside_it(hub, admin, shots):
    def times_shown():
        admin.goto(hub.url + "/services/gpupool/")
        return admin.text_content("#chart").count("UTC") == 2
    wait_for(times_shown, "the overview chart to show its first and last time")
    admin.screenshot(path=str(shots / "overview-chart.png"))
    svg, labels = admin.evaluate("""() => {
        const svg = document.getElementById('chart'), box = e => e.getBoundingClientRect();
        const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
        const s = box(svg);
        return [[s.left, s.top, s.right, s.bottom],
                texts.map(t => [t.textContent, box(t).left, box(t).top, box(t).right, box(t).bottom])];
    }""")
    assert len(labels) == 4  # capacity, 0, the first and the last time
    for text, left, top, right, bottom in labels:
        assert svg[0] <= left and right <= svg[2] and svg[1] <= top and bottom <= svg[3], (text, svg)


def test_a_refused_quota_shows_the_stored_value_again(hub, admin):
    stored = call(hub.url, hub.tokens["admin"], "GET", "/projects/vision")[1]["gpus"]
    admin.goto(hub.url + "/services/gpupool/org")
    row = admin.locator("#projects tr[data-name=vision]")
    row.locator("input[name=gpus]").fill("9")
    row.locator("button", has_text="Save").click()
    admin.wait_for_function("document.getElementById('msg').className === 'err'")
    assert "gpus: must be from 0 to" in admin.inner_text("#msg")
    assert float(row.locator("input[name=gpus]").input_value()) == stored
    assert call(hub.url, hub.tokens["admin"], "GET", "/projects/vision")[1]["gpus"] == stored
