"""Quotas per node pool: set through REST and the admin panel, refused with the field and
pool named, bounded per pool by the department, and used by the scheduler (work in one pool
waits at that pool's quota while the project's quota in another pool is free). The spawn
form's free GPUs per pool follow another user's workspace while the form stays open."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hubclient import HubClient, call
from hubproc import ADMIN_PW, TWO_POOLS_CONFIG, USER_PW, Hub

from tests.chromium import login
from tests.waits import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture(scope="module")
def phub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("phub"), config=TWO_POOLS_CONFIG).start()
    yield h
    h.stop()


def _state(hub, token, name):
    status, w = call(hub.url, token, "GET", f"/workloads/{name}")
    assert status == 200, w
    return w


def _error(reply, field):
    status, body = reply
    assert status == 400 and body["error"]["field"] == field, reply
    return body["error"]["message"]


def test_rest_refusals_name_the_field_and_pool(phub):
    admin = HubClient(phub.url).login("admin", ADMIN_PW).token("admin")
    status, d = call(phub.url, admin, "PATCH", "/departments/ops", {"pools": {"fast": {"gpus": 1}}})
    assert status == 200 and d["pools"]["fast"]["gpus"] == 1
    msg = _error(call(phub.url, admin, "PATCH", "/projects/serving", {"pools": {"fast": {"gpus": 1.5}}}),
                 "pools.fast.gpus")
    assert "from 0 to 1: department 'ops' has a quota of 1 GPUs in node pool fast" in msg
    assert call(phub.url, admin, "PATCH", "/projects/serving", {"pools": {"fast": {"gpus": 1}}})[0] == 200
    msg = _error(call(phub.url, admin, "PATCH", "/departments/ops", {"pools": {"fast": {"gpus": 0.5}}}),
                 "pools.fast.gpus")
    assert "sum of the department's project quotas in node pool fast" in msg
    _error(call(phub.url, admin, "PATCH", "/projects/serving", {"pools": {"fast": {"limit": -1}}}),
           "pools.fast.limit")
    _error(call(phub.url, admin, "PATCH", "/projects/serving", {"pools": {"fast": {"weight": 1}}}),
           "pools.fast.weight")
    status, p = call(phub.url, admin, "GET", "/projects/serving")
    assert p["pools"]["fast"] == {"gpus": 1, "over_quota_weight": 1, "limit": None,
                                  "cpu_quota": None, "memory_quota_gib": None}


def test_pool_quota_set_in_the_panel_is_the_one_the_scheduler_uses(phub, browser, shots):
    admin = HubClient(phub.url).login("admin", ADMIN_PW).token("admin")
    bob = HubClient(phub.url).login("bob", USER_PW).token("bob")
    assert call(phub.url, admin, "PATCH", "/departments/research", {"pools": {"fast": {"gpus": 1}}})[0] == 200
    assert call(phub.url, admin, "PATCH", "/projects/nlp", {"pools": {"fast": {"gpus": 1}}})[0] == 200

    # alice's form is open before bob's workspace starts in pool fast
    form = login(browser, phub.url, "alice", USER_PW)
    form.goto(phub.url + "/hub/spawn")
    assert "fast: 2 of 2 GPUs free" in form.inner_text("#gp-pool")
    status, w = call(phub.url, bob, "POST", "/workloads", {
        "kind": "workspace", "project": "nlp", "gpu_mode": "whole", "gpus": 1, "node_pool": "fast",
        "server_name": "p"})
    assert status == 202, w
    wait_for(lambda: _state(phub, bob, "ws-bob-p")["state"] == "running", "bob's workspace running")
    form.wait_for_function("document.getElementById('gp-pool').innerText.includes('fast: 1 of 2 GPUs free')",
                           timeout=60_000)
    assert form.url.endswith("/hub/spawn")  # the same page, not reloaded
    form.screenshot(path=str(shots / "spawn-form-pool-refreshed.png"), full_page=True)

    # nlp's quota in pool fast is used; its free quota in the default pool does not help
    status, w = call(phub.url, bob, "POST", "/workloads", {
        "kind": "training", "project": "nlp", "name": "fast-b", "gpu_mode": "whole", "gpus": 1,
        "node_pool": "fast", "preemptible": False, "command": SLEEP})
    assert status == 201, w
    w = wait_for(lambda: (lambda x: x if x["reason"] else None)(_state(phub, bob, "fast-b")),
                 "fast-b waiting with a reason")
    assert w["state"] == "pending"
    assert w["reason"].startswith("project nlp is at its quota 1/1 GPUs") and "in pool fast" in w["reason"], w

    page = login(browser, phub.url, "admin", ADMIN_PW)
    page.goto(phub.url + "/services/gpupool/org")
    page.wait_for_selector("#pool-quotas")
    nlp = page.locator("#pool-quotas tr[data-kind=projects][data-name=nlp][data-pool=fast]")
    assert float(nlp.locator("input[name=gpus]").input_value()) == 1
    nlp.locator("input[name=gpus]").fill("2")  # beyond the department's quota in pool fast
    nlp.locator("button").click()
    page.wait_for_function("document.getElementById('msg').className === 'err'")
    assert "pools.fast.gpus" in page.inner_text("#msg") and "node pool fast" in page.inner_text("#msg")
    assert float(nlp.locator("input[name=gpus]").input_value()) == 1  # the stored quota again
    assert _state(phub, bob, "fast-b")["state"] == "pending"
    dept = page.locator("#pool-quotas tr[data-kind=departments][data-name=research][data-pool=fast]")
    dept.locator("input[name=gpus]").fill("2")
    dept.locator("button").click()
    page.wait_for_function("document.getElementById('msg').textContent.includes('Saved research in pool fast')")
    nlp.locator("input[name=gpus]").fill("2")
    nlp.locator("button").click()
    page.wait_for_function("document.getElementById('msg').textContent.includes('Saved nlp in pool fast')")
    wait_for(lambda: _state(phub, bob, "fast-b")["state"] == "running", "fast-b running on the raised quota")
    assert {p["node"] for p in _state(phub, bob, "fast-b")["placement"]} == {"b"}
    status, p = call(phub.url, admin, "GET", "/projects/nlp")
    assert (p["gpus"], p["pools"]["fast"]["gpus"]) == (1, 2)  # the default pool's is untouched

    # CPU and memory quotas are edited in the same panel
    vision = page.locator("#projects tr[data-name=vision]")
    vision.locator("input[name=cpu_quota]").fill("8")
    vision.locator("input[name=memory_quota_gib]").fill("32")
    vision.locator("button", has_text="Save").click()
    page.wait_for_function("document.getElementById('msg').textContent.includes('Saved vision')")
    status, p = call(phub.url, admin, "GET", "/projects/vision")
    assert (p["cpu_quota"], p["memory_quota_gib"]) == (8, 32)
    page.reload()
    assert float(page.locator("#projects tr[data-name=vision] input[name=cpu_quota]").input_value()) == 8
    page.screenshot(path=str(shots / "admin-org-pools.png"), full_page=True)
    status, audit = call(phub.url, admin, "GET", "/audit?project=nlp&action=project.quota")
    assert status == 200, audit
    assert any(e["actor"] == "admin" and e["details"].get("pools", [None, {}])[1].get("fast", {}).get("gpus") == 2
               for e in audit["items"]), audit
    for name in ("fast-b", "ws-bob-p"):
        call(phub.url, admin, "DELETE", f"/workloads/{name}")


GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def test_a_request_beyond_its_pools_ceiling_is_refused_at_once(phub, tmp_path):
    """REST and CLI: beyond nlp's limit in pool fast is a 400 naming the pool and the limit;
    within it is accepted; the default pool keeps its own ceilings."""
    admin = HubClient(phub.url).login("admin", ADMIN_PW).token("admin")
    bob = HubClient(phub.url).login("bob", USER_PW).token("bob")
    assert call(phub.url, admin, "PATCH", "/departments/research", {"pools": {"fast": {"gpus": 2}}})[0] == 200
    status, p = call(phub.url, admin, "PATCH", "/projects/nlp", {"pools": {"fast": {"gpus": 0.5, "limit": 1}}})
    assert status == 200, p
    job = {"kind": "training", "project": "nlp", "gpu_mode": "whole", "command": SLEEP, "preemptible": True}

    msg = _error(call(phub.url, bob, "POST", "/workloads", {**job, "name": "fast-2", "gpus": 2, "node_pool": "fast"}),
                 "gpus")
    assert msg == "project nlp allows at most 1 GPU in pool fast (limit), got 2"
    msg = _error(call(phub.url, bob, "POST", "/trainings", {"name": "fast-gang", "project": "nlp", "command": SLEEP,
                                                            "gpu": 1, "workers": 2, "node_pool": "fast"}), "gpu")
    assert msg == "project nlp allows at most 1 GPU in pool fast (limit), got 2 (2 workers x 1)"
    status, w = call(phub.url, bob, "POST", "/workloads", {**job, "name": "fast-1", "gpus": 1, "node_pool": "fast"})
    assert status == 201, w
    # the default pool (any pool) is held to its own limit of 3, not to pool fast's
    status, w = call(phub.url, bob, "POST", "/workloads", {**job, "name": "default-2", "gpus": 2})
    assert status == 201, w
    # refused there only where no pool takes it (the default pool names any), in its own words
    assert call(phub.url, admin, "PATCH", "/projects/nlp", {"limit": 1})[0] == 200
    try:
        msg = _error(call(phub.url, bob, "POST", "/workloads", {**job, "name": "default-3", "gpus": 2}), "gpus")
        assert msg == "project nlp allows at most 1 GPU (limit), got 2"
    finally:
        assert call(phub.url, admin, "PATCH", "/projects/nlp", {"limit": 3})[0] == 200
    for name in ("fast-1", "default-2"):
        assert call(phub.url, bob, "DELETE", f"/workloads/{name}")[0] == 204

    env = {**os.environ, "GPUPOOL_URL": phub.url, "GPUPOOL_TOKEN": bob, "XDG_CONFIG_HOME": str(tmp_path)}
    r = subprocess.run([GPUPOOL, "workspace", "start", "cli", "--project", "nlp", "--gpus", "2", "--node-pool", "fast",
                        "--preemptible"], env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode != 0 and "gpus: project nlp allows at most 1 GPU in pool fast (limit), got 2" in r.stderr, r


def verdict(page) -> str:
    """The panel's verdict once the service has answered the form's current fields."""
    page.wait_for_selector("#gp-status[aria-busy=false]")
    return page.inner_text("#gp-verdict")


def test_the_form_shows_the_chosen_pools_quota(phub, browser, shots):
    """Choosing pool fast, the verdict and the quota bar are pool fast's: its quota and limit,
    and the refusal a submit would get there; back in the default pool, the default's."""
    admin = HubClient(phub.url).login("admin", ADMIN_PW).token("admin")
    assert call(phub.url, admin, "PATCH", "/departments/research", {"pools": {"fast": {"gpus": 2}}})[0] == 200
    assert call(phub.url, admin, "PATCH", "/projects/nlp", {"pools": {"fast": {"gpus": 0.5, "limit": 1}}})[0] == 200
    form = login(browser, phub.url, "alice", USER_PW)
    form.goto(phub.url + "/hub/spawn")
    form.select_option("#gp-project", "nlp")
    form.check("input[name=gpu_mode][value=whole]")
    form.fill("#gp-gpus", "2")
    form.check("#gp-preemptible")
    form.select_option("#gp-pool", "default")
    verdict(form)
    assert (form.inner_text("#gp-quota-pool"), form.inner_text("#gp-quota"), form.inner_text("#gp-limit")) == \
        ("default", "1", ", limit 3")
    assert not verdict(form).startswith("Cannot run")
    assert form.inner_text("#gp-gpu-label") == "NVIDIA H100 80GB HBM3"
    assert form.inner_text("#gp-quota-unit") == "GPU"  # of a quota of 1
    form.select_option("#gp-pool", "fast")
    verdict(form)
    assert (form.inner_text("#gp-quota-pool"), form.inner_text("#gp-quota"), form.inner_text("#gp-limit")) == \
        ("fast", "0.5", ", limit 1")
    assert form.inner_text("#gp-gpu-label") == "NVIDIA B200"
    assert form.inner_text("#gp-quota-unit") == "GPUs"  # of 0.5
    assert verdict(form) == "Cannot run: gpus: project nlp allows at most 1 GPU in pool fast (limit), got 2"
    assert form.inner_text("#gp-capacity") == "2"
    form.fill("#gp-gpus", "1")
    assert verdict(form) == "Starts now over quota (preemptible: may be reclaimed)"
    form.uncheck("#gp-preemptible")
    assert verdict(form) == ("Cannot run: gpus: project nlp allows at most 0.5 GPUs in pool fast (quota) "
                                              "to work that may not go over quota, got 1")
    form.screenshot(path=str(shots / "spawn-form-pool-quota.png"), full_page=True)
