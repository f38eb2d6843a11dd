"""Browser test: a user picks a compute template, a node pool (shown with its free GPUs) and a
GPU model in the spawn form; the workspace runs with that template's resources in that pool."""

import re
import shutil

import pytest
from hubclient import HubClient, call
from hubproc import TWO_POOLS_CONFIG, USER_PW, Hub

from tests.waits import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]



@pytest.fixture(scope="module")
def thub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("thub"), config=TWO_POOLS_CONFIG).start()
    yield h
    h.stop()


def test_template_pool_and_model_chosen_in_the_form(thub, browser, shots):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    page.goto(thub.url + "/hub/login")
    page.fill("#username_input", "alice")
    page.fill("#password_input", USER_PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
    page.goto(thub.url + "/hub/spawn")
    page.select_option("#gp-project", "nlp")
    assert "fast: 2 of 2 GPUs free" in page.inner_text("#gp-pool")
    page.select_option("#gp-template", "small")  # fills 0.25 GPU, 2 CPU, 8 GiB
    assert page.input_value("#gp-fraction") == "0.25"
    assert page.input_value("input[name=cpu]") == "2"
    assert page.input_value("input[name=memory_gib]") == "8"
    page.select_option("#gp-pool", "fast")
    page.select_option("#gp-gpu-model", "NVIDIA B200")
    page.check("#gp-preemptible")  # nlp has no quota in pool fast: over quota
    page.screenshot(path=str(shots / "spawn-form-template-pool.png"), full_page=True)
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=180_000)
    token = HubClient(thub.url).login("alice", USER_PW).token("alice")
    w = wait_for(lambda: (lambda r: r[1] if r[0] == 200 and r[1]["placement"] else None)(
        call(thub.url, token, "GET", "/workloads/ws-alice")), "the workspace placed")
    assert (w["spec"]["template"], w["spec"]["node_pool"], w["spec"]["gpu_model"]) == \
        ("small", "fast", "NVIDIA B200")
    assert (w["spec"]["cpu"], w["spec"]["memory_gib"], w["spec"]["gpu_fraction"]) == (2, 8, 0.25)
    assert {p["node"] for p in w["placement"]} == {"b"}
    ctx.close()
