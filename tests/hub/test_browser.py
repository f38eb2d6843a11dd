"""Browser tests: Playwright driving Debian's chromium (headless) against a hub started
here. Log in, spawn JupyterLab with 0.25 GPU and see the GPU environment inside it; a
second user waits with the scheduler's reason in the spawn progress; the admin raises the
quota in the admin panel and the waiting workspace starts; a non-admin is read-only and
gets 403 on admin actions; Cancel, queued or starting, lands on the spawn form, never on a
stopped server; the spawn forms of a user share one live-capacity token. Screenshots go to
$GPUPOOL_SCREENSHOTS (default: tmp)."""

import re
import shutil

import pytest
from hubclient import HubClient
from hubkernel import run_code
from hubproc import ADMIN_PW, USER_PW, Hub

from tests import chromium

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]


@pytest.fixture(scope="module")
def bhub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("bhub")).start()
    yield h
    h.stop()


def login(browser, hub, user, password=USER_PW):
    return chromium.login(browser, hub.url, user, password)


def fill_form(page, project, mode="fraction", fraction=None, gpus=None, server=""):
    user = page.evaluate("window.jhdata.user") if server else ""
    page.goto(page.url.split("/hub/")[0] + "/hub/spawn" + (f"/{user}/{server}" if server else ""))
    page.select_option("#gp-project", project)
    page.check(f"input[name=gpu_mode][value={mode}]")
    if fraction is not None:
        page.fill("#gp-fraction", str(fraction))
        page.dispatch_event("#gp-fraction", "input")
    if gpus is not None:
        page.fill("#gp-gpus", str(gpus))
        page.dispatch_event("#gp-gpus", "input")


def verdict(page) -> str:
    """The panel's verdict once the service has answered the form's current fields."""
    page.wait_for_selector("#gp-status[aria-busy=false]")
    return page.inner_text("#gp-verdict")


def submit(page):
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")


def test_user_starts_jupyterlab_with_a_quarter_gpu(bhub, browser, shots):
    page = login(browser, bhub, "alice")
    fill_form(page, "nlp", fraction=0.25)
    assert "Starts now" in verdict(page)
    assert page.input_value("#gp-fraction-range") == "0.25"
    page.screenshot(path=str(shots / "spawn-form.png"), full_page=True)
    submit(page)
    page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=180_000)
    page.wait_for_selector("#jp-main-dock-panel, .jp-LabShell", timeout=120_000)
    token = HubClient(bhub.url).login("alice", USER_PW).token("alice")
    out = run_code(bhub.url, "/user/alice/", token,
                   "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_GPU_FRACTION'],"
                   " os.environ['GPUPOOL_MEMORY_LIMIT'], os.environ['GPUPOOL_WORKLOAD'])")
    visible, fraction, cap, name = out.split()
    assert visible in {"0", "1", "2", "3"} and fraction == "0.25" and name == "ws-alice"
    assert cap == str(81559 * 2**20 // 4)  # bytes (scheduler/contract.py share_env)
    # the form remembers the last choices
    page.goto(bhub.url + "/hub/spawn/alice/second")
    assert page.input_value("#gp-fraction") == "0.25" and page.input_value("#gp-project") == "nlp"


def test_second_user_waits_with_the_reason_then_admin_raises_the_quota(bhub, browser, shots):
    bob = login(browser, bhub, "bob")
    fill_form(bob, "nlp", mode="whole", gpus=1)  # docs/tutorials/first-workspace.md, step 4
    assert verdict(bob) == ("Will wait: project nlp is at its quota. It has 0.25 GPUs in use of its 1-GPU quota; "
                            "with this request it would use 1.25.")
    submit(bob)
    bob.wait_for_url(re.compile(r".*/hub/spawn-pending/bob.*"), timeout=60_000)
    bob.wait_for_function(
        "document.body.innerText.includes('Waiting in the queue')", timeout=60_000)
    text = bob.inner_text("body")
    assert "position 1" in text and "quota" in text.lower(), text
    bob.screenshot(path=str(shots / "spawn-pending.png"), full_page=True)

    admin = login(browser, bhub, "admin", ADMIN_PW)
    admin.goto(bhub.url + "/services/gpupool/org")
    admin.wait_for_selector("#projects")
    dept = admin.locator("#departments tr[data-name=research]")
    dept.locator("input[name=gpus]").fill("4")
    dept.locator("button", has_text="Save").click()
    admin.wait_for_function("document.getElementById('msg').textContent.includes('Saved research')")
    row = admin.locator("#projects tr[data-name=nlp]")
    row.locator("input[name=gpus]").fill("2")
    row.locator("button", has_text="Save").click()
    admin.wait_for_function("document.getElementById('msg').textContent.includes('Saved nlp')")
    # the bound is enforced with a clear message
    row.locator("input[name=limit]").fill("")
    row.locator("input[name=gpus]").fill("9")
    row.locator("button", has_text="Save").click()
    admin.wait_for_function("document.getElementById('msg').className === 'err'")
    assert "gpus: must be from 0 to" in admin.inner_text("#msg")
    row.locator("input[name=gpus]").fill("2")

    bob.wait_for_url(re.compile(r".*/user/bob/lab.*"), timeout=180_000)

    admin.goto(bhub.url + "/services/gpupool/org")
    admin.screenshot(path=str(shots / "admin-org.png"), full_page=True)
    admin.goto(bhub.url + "/services/gpupool/nodes")
    assert "ws-alice (0.25)" in admin.inner_text("#gpus") and "ws-bob (1)" in admin.inner_text("#gpus")
    admin.screenshot(path=str(shots / "admin-nodes.png"), full_page=True)
    admin.goto(bhub.url + "/services/gpupool/events")
    assert "quota 1 -> 2 GPUs" in admin.inner_text("#events")
    admin.goto(bhub.url + "/services/gpupool/")
    admin.screenshot(path=str(shots / "admin-overview.png"), full_page=True)


def test_non_admin_is_read_only_and_gets_403(bhub, browser):
    page = login(browser, bhub, "carol")
    page.goto(bhub.url + "/services/gpupool/org")
    page.wait_for_selector("#projects")
    assert page.locator("#projects button").count() == 0
    assert "(read-only)" in page.inner_text("header")
    names = page.locator("#projects tr[data-name]").evaluate_all("rows => rows.map(r => r.dataset.name)")
    assert names == ["vision"]
    status = page.evaluate("""async () => {
        const r = await fetch(API + '/projects/vision', {method: 'PATCH',
            headers: {'Content-Type': 'application/json', 'X-XSRFToken': XSRF}, body: JSON.stringify({gpus: 3})});
        return [r.status, (await r.json()).error.message];
    }""")
    assert status[0] == 403 and "admin" in status[1]


def test_stopping_returns_the_share_at_once(bhub, browser):
    page = login(browser, bhub, "alice")
    page.goto(bhub.url + "/hub/home")
    token = HubClient(bhub.url).login("alice", USER_PW).token("alice")
    from hubclient import call

    assert call(bhub.url, token, "DELETE", "/hub/api/users/alice/server", api=False)[0] in (202, 204)
    status, w = call(bhub.url, token, "GET", "/workloads/ws-alice")
    assert status == 404
    gpus = call(bhub.url, token, "GET", "/nodes")[1]["items"][0]["gpus"]
    assert not any(s["workload"] == "ws-alice" for g in gpus for s in g["workloads"])


@pytest.fixture(scope="module")
def queue_org(bhub):
    """Project bq (quota 1, limit 2, department bq-d) for carol and dave; carol's workspace
    holds its guaranteed GPU, so a guaranteed request of dave's waits."""
    from hubclient import call

    admin = HubClient(bhub.url).login("admin", ADMIN_PW).token("admin")
    carol = HubClient(bhub.url).login("carol", USER_PW).token("carol")
    assert call(bhub.url, admin, "POST", "/departments", {"name": "bq-d", "gpus": 1})[0] == 201
    assert call(bhub.url, admin, "POST", "/projects", {"name": "bq", "department": "bq-d", "gpus": 1, "limit": 2,
                                                       "members": ["carol", "dave"]})[0] == 201
    assert call(bhub.url, carol, "POST", "/workloads", {"kind": "workspace", "project": "bq", "gpu_mode": "whole",
                                                        "gpus": 1, "server_name": "bq"})[0] == 202
    yield {"admin": admin, "dave": HubClient(bhub.url).login("dave", USER_PW).token("dave")}
    call(bhub.url, admin, "DELETE", "/workloads/ws-carol-bq")


@pytest.mark.parametrize("server", ["", "q"])
def test_cancelling_a_queued_spawn_returns_to_the_form(bhub, browser, shots, queue_org, server):
    from hubclient import call

    name, path = ("ws-dave-" + server, "dave/" + server) if server else ("ws-dave", "dave")
    dave = login(browser, bhub, "dave")
    fill_form(dave, "bq", mode="whole", gpus=1, server=server)
    assert "Will wait" in verdict(dave)
    submit(dave)
    dave.wait_for_url(re.compile(rf".*/hub/spawn-pending/{path}\?.*"), timeout=60_000)
    dave.wait_for_function("document.body.innerText.includes('Waiting in the queue')", timeout=60_000)
    status, w = call(bhub.url, queue_org["admin"], "GET", f"/workloads/{name}")
    assert status == 200 and w["state"] == "pending", w
    dave.click("#gp-cancel")
    dave.wait_for_selector("#gp-cancelled", state="visible")
    assert "Cancelled" in dave.inner_text("#gp-cancelled") and dave.inner_text("#progress-message") == "Cancelled"
    if not server:
        dave.screenshot(path=str(shots / "spawn-cancelled.png"), full_page=True)
    # back on the spawn form, which names the cancelled request
    dave.wait_for_url(re.compile(rf".*/hub/spawn/{path}$"), timeout=30_000)
    notice = dave.inner_text("#gp-form #gp-cancelled")
    assert f"{name} cancelled: stopped while it waited in the queue" in notice, notice
    assert "Redirect loop" not in dave.inner_text("body")
    # the queue slot is gone at once, and the event log says why
    assert call(bhub.url, queue_org["admin"], "GET", f"/workloads/{name}")[0] == 404
    pending = call(bhub.url, queue_org["admin"], "GET", "/workloads?project=bq&state=pending")[1]["items"]
    assert pending == []
    events = call(bhub.url, queue_org["admin"], "GET", f"/events?workload={name}&kind=cancelled")[1]["items"]
    assert len(events) == 1 and events[0]["project"] == "bq", events


def test_a_request_that_can_never_run_is_refused_by_the_form(bhub, browser, queue_org):
    from hubclient import call

    dave = login(browser, bhub, "dave")
    fill_form(dave, "bq", mode="whole", gpus=2)
    why = "gpus: project bq allows at most 1 GPU (quota) to work that may not go over quota, got 2"
    assert verdict(dave) == f"Cannot run: {why}"
    submit(dave)
    dave.wait_for_selector("#gp-form")
    assert why in dave.inner_text("body")
    # preemptible: the limit bounds it; 2 GPUs wait for carol's, 3 never run
    fill_form(dave, "bq", mode="whole", gpus=2)
    dave.check("#gp-preemptible")
    assert verdict(dave) == ("Will wait: project bq is at its limit. It has 1 GPU in use and may use at most 2; "
                             "with this request it would use 3.")
    fill_form(dave, "bq", mode="whole", gpus=3)
    dave.check("#gp-preemptible")
    assert verdict(dave) == "Cannot run: gpus: project bq allows at most 2 GPUs (limit), got 3"
    fill_form(dave, "bq", mode="whole", gpus=5)  # the declared node has 4
    assert verdict(dave) == "Cannot run: gpus: must be from 1 to 4 (GPUs of the largest node), got '5'"
    assert dave.eval_on_selector("#gp-gpus", "e => e.validity.rangeOverflow")  # the browser holds it back
    assert call(bhub.url, queue_org["admin"], "GET", "/workloads/ws-dave")[0] == 404


H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("fraction, panel", [
    ("0", "Cannot run: gpu_fraction: must be from 0.05 to 1, got '0'"),
    ("1.5", "Cannot run: gpu_fraction: must be from 0.05 to 1, got '1.5'"),
    ("abc", "Cannot run: gpu_fraction: must be a number from 0.05 to 1, got 'abc'"),
])
def test_the_panel_says_what_start_answers_to_a_bad_fraction(bhub, browser, shots, fraction, panel):
    """The panel's words are Start's own, for the exact text in the field; the field is marked."""
    page = login(browser, bhub, "carol")
    fill_form(page, "vision", fraction=fraction)
    assert verdict(page) == panel
    assert page.get_attribute("#gp-fraction", "aria-invalid") == "true"
    assert page.inner_text("#gp-share") == ""
    page.screenshot(path=str(shots / f"form-fraction-{fraction}.png"), full_page=True)
    submit(page)
    page.wait_for_selector("#gp-form")
    assert panel.removeprefix("Cannot run: ") in page.inner_text("body")  # Start's answer


def test_the_panel_says_what_a_fraction_is_on_the_gpu(bhub, browser, shots):
    page = login(browser, bhub, "carol")
    fill_form(page, "vision", fraction="0.25")
    assert verdict(page).startswith("Starts now")
    assert page.inner_text("#gp-share") == f"0.25 of an {H100}: 19.9 GiB of GPU memory and a 25% compute share."
    assert page.get_attribute("#gp-fraction", "aria-invalid") is None
    page.screenshot(path=str(shots / "form-fraction-0.25.png"), full_page=True)
    page.fill("#gp-fraction", "0.5")  # it follows the field
    verdict(page)
    assert page.inner_text("#gp-share") == f"0.5 of an {H100}: 39.8 GiB of GPU memory and a 50% compute share."
    # the GPU memory field's bound is the largest GPU's, rounded as the rules hold it
    assert page.get_attribute("#gp-memory", "max") == "79.6"
    page.check("input[name=gpu_mode][value=memory]")
    page.fill("#gp-memory", "79.7")
    assert verdict(page) == "Cannot run: gpu_memory_gib: must be from 0.5 to 79.6 GiB, got '79.7'"
    page.fill("#gp-memory", "79.6")
    verdict(page)
    assert page.inner_text("#gp-share") == f"79.6 GiB of GPU memory on an {H100}: 1 of it, a 100% compute share."


def test_cancel_while_a_named_server_starts_never_lands_on_it(bhub, browser, shots):
    """A Cancel on its way when the progress says "ready": the page does not follow the ready
    (that server is being stopped) and lands on the spawn form once the hub has stopped it.
    The browser holds the Cancel's request and the progress stream until the server is
    really ready, then lets both go, the real hub's "ready" first."""
    from hubclient import call
    from playwright.sync_api import Error as PlaywrightError

    from tests.waits import wait_for

    admin = HubClient(bhub.url).login("admin", ADMIN_PW).token("admin")
    dave = login(browser, bhub, "dave")
    held = {"progress": [], "stop": []}
    dave.route(re.compile(r".*/hub/api/users/dave/servers/big/progress.*"), lambda route: held["progress"].append(route))
    dave.route(re.compile(r".*/hub/api/users/dave/servers/big(\?.*)?$"),
               lambda route: held["stop"].append(route) if route.request.method == "DELETE" else route.continue_())

    def servers():
        return call(bhub.url, admin, "GET", "/hub/api/users/dave", api=False)[1]["servers"]

    def pump(what, check, timeout=180):
        return wait_for(lambda: dave.wait_for_timeout(100) or check(), what, timeout=timeout, every=0)

    fill_form(dave, "serving", fraction=0.25, server="big")
    submit(dave)
    dave.wait_for_url(re.compile(r".*/hub/spawn-pending/dave/big.*"), timeout=60_000)
    dave.click("#gp-cancel")
    pump("the Cancel's request sent", lambda: held["stop"] and held["progress"], timeout=60)
    wait_for(lambda: servers().get("big", {}).get("ready"), "dave's server big ready", timeout=180)

    progress = held["progress"][0]
    ready = progress.fetch()
    assert '"ready": true' in ready.text(), ready.text()
    progress.fulfill(response=ready)
    try:  # the page has the ready in its log (or, following it, has left)
        dave.wait_for_function("() => !document.getElementById('progress-log') || "
                               "document.getElementById('progress-log').textContent.includes('Server ready')")
        held["stop"][0].continue_()
    except PlaywrightError:
        pass
    dave.wait_for_url(re.compile(r".*/hub/spawn/dave/big$"), timeout=60_000)
    dave.wait_for_selector("#gp-form")
    dave.screenshot(path=str(shots / "spawn-cancelled-while-starting.png"), full_page=True)
    assert "big" not in servers() or not servers()["big"]["ready"]
    assert call(bhub.url, admin, "GET", "/workloads/ws-dave-big")[0] == 404


def test_spawn_form_visits_share_one_live_capacity_token(bhub, browser):
    """Each form carries a token for its live figures: visits reuse the user's one token
    instead of adding one to the token page each time."""
    import json
    import urllib.request

    from hubclient import call

    carol = login(browser, bhub, "carol")
    shown = []
    for path in ("/hub/spawn/carol/f1", "/hub/spawn/carol/f2", "/hub/spawn/carol/f1", "/hub/spawn/carol/f3"):
        carol.goto(bhub.url + path)
        shown.append(json.loads(carol.text_content("#gp-status-json")))
    assert len({s["token"] for s in shown}) == 1
    admin = HubClient(bhub.url).login("admin", ADMIN_PW).token("admin")
    tokens = call(bhub.url, admin, "GET", "/hub/api/users/carol/tokens", api=False)[1]["api_tokens"]
    form_tokens = [t for t in tokens if t["note"] == "gpupool spawn form (live capacity)"]
    assert len(form_tokens) == 1, tokens
    req = urllib.request.Request(bhub.url + shown[0]["live_url"], headers={"Authorization": f"token {shown[0]['token']}"})
    with urllib.request.urlopen(req, timeout=30) as r:  # the shared token takes the live figures
        assert r.status == 200 and "pools" in json.loads(r.read())
