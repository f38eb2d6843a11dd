"""The spawn experience on a real hub, in chromium: the home page lists the user's work and
their projects' quota use and links to the panel; the progress page shows its steps with
the scheduler's reason, in the same words as the queue page, the home page and the CLI;
members get a 403 page naming the role instead of a bare "403: Forbidden", and no link to
pages they cannot open; the CLI prints the workspace URL and the README's start example
reports a running workspace instead of failing."""

import re
import shutil

import pytest
from hubclient import HubClient
from hubproc import ADMIN_PW, USER_PW, Hub
from test_browser import login
from test_workspaces import cli, wait_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]


@pytest.fixture(scope="module")
def hhub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("hhub")).start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "bob", "carol")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    yield h
    h.stop()


def test_cli_start_prints_the_url_and_reports_a_running_workspace(hhub):
    r = cli(hhub, "alice", "workspace", "start", "--project", "nlp", "--fraction", "0.25")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ws-alice: ") and f"{hhub.url}/user/alice/" in r.stdout, r.stdout
    wait_ready(hhub, "alice")
    # the README's example again, with the server running: it says so, with the URL
    r = cli(hhub, "alice", "workspace", "start", "--project", "nlp", "--fraction", "0.25")
    assert r.returncode == 0, r.stderr
    assert "ws-alice is already running in project nlp (0.25 GPU)" in r.stdout, r.stdout
    assert f"{hhub.url}/user/alice/\n" in r.stdout
    # a named server starts beside it
    r = cli(hhub, "alice", "workspace", "start", "two", "--project", "nlp", "--fraction", "0.25")
    assert r.returncode == 0 and f"{hhub.url}/user/alice/two/" in r.stdout, r.stdout + r.stderr
    wait_ready(hhub, "alice", "two")


def test_home_lists_workloads_quota_use_and_the_panel(hhub, browser, shots):
    page = login(browser, hhub, "alice")
    page.goto(hhub.url + "/hub/home")
    rows = page.locator("#gp-workloads tr.gp-workload")
    assert rows.count() == 2
    first = page.inner_text("#gp-workloads tr[data-name=ws-alice]")
    assert "nlp" in first and "0.25 GPU" in first and "running" in first and "GPU" in first
    assert "today" in first and "UTC" in first  # a human date, not an ISO string
    assert page.get_attribute("#gp-workloads tr[data-name=ws-alice-two] a.gp-open", "href") == "/user/alice/two/"
    assert "0.5 GPU" in page.inner_text("#gp-quotas tr[data-project=nlp] .gp-used")
    assert page.get_attribute("#gp-panel-link", "href") == "/services/gpupool/"
    # JupyterHub's own server list is still there below
    assert page.locator("#start, #stop").count() >= 1
    page.screenshot(path=str(shots / "home.png"), full_page=True)
    page.click("#gp-panel-link")
    page.wait_for_url(re.compile(r".*/services/gpupool/.*"))
    assert "gpupool" in page.inner_text("header")


def test_progress_shows_steps_and_the_one_waiting_text(hhub, browser, shots):
    bob = login(browser, hhub, "bob")
    bob.goto(hhub.url + "/hub/spawn")
    bob.select_option("#gp-project", "nlp")
    bob.check("input[name=gpu_mode][value=whole]")
    bob.fill("#gp-gpus", "1")
    bob.dispatch_event("#gp-gpus", "input")
    bob.wait_for_selector("#gp-status[aria-busy=false]")  # the service answered these fields
    forecast = bob.inner_text("#gp-verdict").removeprefix("Will wait: ").split(". ")[0]
    bob.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    bob.wait_for_url(re.compile(r".*/hub/spawn-pending/bob.*"), timeout=60_000)
    bob.wait_for_selector("#gp-step-waiting.gp-now", timeout=60_000)
    assert "gp-done" in bob.get_attribute("#gp-step-submitted", "class")
    assert "project nlp" in bob.inner_text("#gp-step-submitted .gp-step-text")
    waiting = bob.inner_text("#gp-step-waiting .gp-step-text")
    assert waiting.startswith("Waiting in the queue (position 1): ") and "quota" in waiting, waiting
    assert forecast in waiting  # the form said it in the scheduler's words
    assert "gp-now" not in (bob.get_attribute("#gp-step-placed", "class") or "")
    bob.screenshot(path=str(shots / "spawn-steps.png"), full_page=True)

    # the same words on the queue page, the home page and in the CLI
    admin = login(browser, hhub, "admin", ADMIN_PW)
    admin.goto(hhub.url + "/services/gpupool/queue")
    assert waiting in admin.inner_text("#pending")
    running = admin.inner_text("#running")
    assert "ws-alice" in running and "ws-alice-two" in running and "ws-bob" not in running
    home = bob.context.new_page()
    home.goto(hhub.url + "/hub/home")
    assert waiting in home.inner_text("#gp-workloads tr[data-name=ws-bob]")
    assert waiting in cli(hhub, "bob", "workspace", "list").stdout

    # room in the quota comes (alice stops her servers): the steps go on, then JupyterLab
    for name in ("ws-alice-two", "ws-alice"):
        assert cli(hhub, "alice", "workspace", "stop", name).returncode == 0
    bob.wait_for_selector("#gp-step-placed.gp-done, #gp-step-starting.gp-now, .jp-LabShell", timeout=180_000)
    bob.wait_for_url(re.compile(r".*/user/bob/lab.*"), timeout=180_000)


def test_members_get_a_403_page_naming_the_role_and_no_links_they_cannot_use(hhub, browser, shots):
    page = login(browser, hhub, "carol")
    page.goto(hhub.url + "/services/gpupool/")
    nav = page.inner_text("header")
    assert "Queue" in nav and "Usage" not in nav and "Audit" not in nav
    for path, role in (("usage", "a platform admin (custom:gpupool:admin)"),
                       ("audit", "a department admin or a platform admin")):
        r = page.goto(hhub.url + f"/services/gpupool/{path}")
        assert r.status == 403
        assert page.inner_text("#error-status") == "403: Forbidden"
        assert role in page.inner_text("#error-needs"), page.inner_text("main")
        assert "carol" in page.inner_text("#error-why")
    page.screenshot(path=str(shots / "forbidden.png"), full_page=True)
    admin = login(browser, hhub, "admin", ADMIN_PW)
    admin.goto(hhub.url + "/services/gpupool/")
    assert "Usage" in admin.inner_text("header") and "Audit" in admin.inner_text("header")
