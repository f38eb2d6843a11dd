"""Workspaces through the REST API and the CLI on a real hub: VS Code behind the hub's
proxy (in chromium too), JupyterLab's terminal, start/list/stop from the `gpupool` CLI."""

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hubclient import call
from hubkernel import run_in_terminal
from hubproc import USER_PW, account

from tests import chromium

pytestmark = pytest.mark.slow
GPUPOOL = str(Path(sys.executable).parent / "gpupool")
ROOT = Path(__file__).resolve().parents[2]
HAS_CODE_SERVER = bool(shutil.which("code-server") or (ROOT / ".tools" / "bin" / "code-server").exists())
SPDLOG_BUILT = (ROOT / ".tools/vscode/node_modules/code-server/lib/vscode/node_modules/@vscode/spdlog/build/Release"
                / "spdlog.node").exists()


def wait_ready(hub, user, server="", timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, u = call(hub.url, hub.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
        if (u.get("servers") or {}).get(server, {}).get("ready"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{user}/{server} did not start")


def cli(hub, user, *args):
    env = {**os.environ, "GPUPOOL_URL": hub.url, "GPUPOOL_TOKEN": hub.tokens[user]}
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.skipif(not HAS_CODE_SERVER, reason="code-server not installed (scripts/setup-system)")
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed (scripts/setup-system)")
def test_vscode_workbench_behind_the_proxy(hub, browser, shots):
    status, w = call(hub.url, hub.tokens["dave"], "POST", "/workloads",
                     {"kind": "workspace", "project": "serving", "workspace_kind": "vscode", "gpu_mode": "fraction",
                      "gpu_fraction": 0.25, "server_name": "code"})
    assert status == 202, w
    wait_ready(hub, "dave", "code")
    deadline, page = time.monotonic() + 180, ""
    req = urllib.request.Request(hub.url + "/user/dave/code/vscode/",
                                 headers={"Authorization": f"token {hub.tokens['dave']}"})
    while time.monotonic() < deadline:
        try:  # follows the proxy's redirects; the first request starts code-server
            with urllib.request.urlopen(req, timeout=120) as r:
                page = r.read().decode(errors="replace")
            if "workbench" in page:
                break
        except OSError as e:
            page = str(e)
        time.sleep(1)
    assert "workbench" in page, page[:500]
    # the home opens trusted (no Restricted Mode), with no repository looked for above it
    assert "enableWorkspaceTrust&quot;:false" in page
    home = Path(pwd.getpwnam(account("dave")).pw_dir)
    settings = json.loads((home / ".local/share/code-server/Machine/settings.json").read_text())
    assert settings == {"security.workspace.trust.enabled": False, "git.openRepositoryInParentFolders": "never",
                        "workbench.secondarySideBar.defaultVisibility": "hidden", "chat.disableAIFeatures": True}
    # in the browser: the window title names the workspace and its GPU share, and the
    # workbench opens on the files, with no chat panel beside them
    vs = chromium.login(browser, hub.url, "dave", USER_PW)
    vs.goto(hub.url + "/user/dave/code/vscode/")
    vs.wait_for_selector(".monaco-workbench .part.sidebar", timeout=180_000)
    share = re.compile(r"gpupool ws-dave-code \(0\.25 GPU of \S+ GPU \d: [\d.]+ GiB GPU memory, 25% compute\)")
    vs.wait_for_function("document.title.includes('gpupool ws-dave-code')", timeout=60_000)
    assert share.search(vs.title()), vs.title()
    vs.wait_for_timeout(3000)  # the layout restores the parts it shows at start
    vs.screenshot(path=str(shots / "vscode-start.png"))
    assert not vs.locator(".part.auxiliarybar").is_visible()
    vs.context.close()
    assert subprocess.run(["git", "-C", str(home), "rev-parse"], capture_output=True).returncode != 0
    log = (home / ".gpupool" / "logs" / "ws-dave-code.log").read_text(errors="replace")
    if SPDLOG_BUILT:  # scripts/setup-system builds it; without it code-server logs its trace
        assert "spdlog.node" not in log and "Could not locate the bindings file" not in log
    assert call(hub.url, hub.tokens["dave"], "DELETE", "/workloads/ws-dave-code")[0] == 204


def test_cli_project_and_workspace(hub):
    r = cli(hub, "carol", "project", "list")
    assert r.returncode == 0 and r.stdout.startswith("vision"), r.stderr
    r = cli(hub, "carol", "project", "show", "vision")
    assert '"name": "vision"' in r.stdout
    r = cli(hub, "carol", "workspace", "start", "--project", "vision", "--fraction", "0.07")
    assert r.returncode != 0 and "gpu_fraction: must be a multiple of 0.05" in r.stderr
    r = cli(hub, "carol", "workspace", "start", "--project", "vision", "--fraction", "0.5")
    assert r.returncode == 0 and r.stdout.startswith("ws-carol:"), r.stderr
    wait_ready(hub, "carol")
    header, *rows = cli(hub, "carol", "workspace", "list").stdout.splitlines()
    assert header.split() == ["NAME", "OWNER", "PROJECT", "STATE", "GPU"]
    assert ["ws-carol", "carol", "vision", "running", "0.5", "GPU"] in [row.split() for row in rows]
    # an admin sees everyone's workspaces, each with its owner
    header, *rows = cli(hub, "admin", "workspace", "list").stdout.splitlines()
    assert header.split()[:2] == ["NAME", "OWNER"] and ["ws-carol", "carol"] in [row.split()[:2] for row in rows]
    r = cli(hub, "carol", "workspace", "stop", "ws-carol")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "ws-carol" in cli(hub, "carol", "workspace", "list").stdout:
        time.sleep(0.5)
    assert "ws-carol" not in cli(hub, "carol", "workspace", "list").stdout
    r = cli(hub, "carol", "workspace", "stop", "ws-nope")
    assert r.returncode != 0 and "does not exist" in r.stderr


def test_a_terminal_runs_the_accounts_login_shell(hub):
    """The account gpupool makes has bash as its login shell, and JupyterLab's terminal runs
    it, with SHELL saying so."""
    status, w = call(hub.url, hub.tokens["bob"], "POST", "/workloads",
                     {"kind": "workspace", "project": "nlp", "gpu_mode": "none", "server_name": "term"})
    assert status == 202, w
    wait_ready(hub, "bob", "term")
    assert pwd.getpwnam(account("bob")).pw_shell == "/bin/bash"
    out = run_in_terminal(hub.url, "/user/bob/term/", hub.tokens["bob"],
                          'echo "GP_SHELL=$(cat /proc/$$/comm) $SHELL"', r"GP_SHELL=\w+ \S*\s")
    assert re.search(r"GP_SHELL=bash /(usr/)?bin/bash\s", out), out
    assert call(hub.url, hub.tokens["bob"], "DELETE", "/workloads/ws-bob-term")[0] == 204


def test_cli_start_refuses_a_bad_fraction_and_has_no_gpu_only_when_asked(hub):
    r = cli(hub, "carol", "workspace", "start", "--project", "vision", "--fraction", "0")
    assert r.returncode != 0 and "gpu_fraction: must be from 0.05 to 1, got '0'" in r.stderr, r
    assert call(hub.url, hub.tokens["carol"], "GET", "/workloads/ws-carol")[0] == 404
    r = cli(hub, "carol", "workspace", "start", "nogpu", "--project", "vision", "--no-gpu", "--fraction", "0.5")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr, r
    r = cli(hub, "carol", "workspace", "start", "nogpu", "--project", "vision", "--no-gpu")
    assert r.returncode == 0 and r.stdout.startswith("ws-carol-nogpu:"), r
    wait_ready(hub, "carol", "nogpu")
    status, w = call(hub.url, hub.tokens["carol"], "GET", "/workloads/ws-carol-nogpu")
    assert status == 200 and w["spec"]["gpu_mode"] == "none" and w["gpu_allocated"] == 0, w
    try:
        # while it runs, a start with bad input is refused as such, not "already running"
        for args, why in ((("--project", "vision", "--fraction", "1.5"), "gpu_fraction: must be from 0.05 to 1, got '1.5'"),
                          (("--project", "serving", "--no-gpu"),
                           "project: must be one of vision (your projects), got 'serving'")):
            r = cli(hub, "carol", "workspace", "start", "nogpu", *args)
            assert r.returncode != 0 and why in r.stderr and "already" not in r.stdout, r
        r = cli(hub, "carol", "workspace", "start", "nogpu", "--project", "vision", "--no-gpu")
        assert r.returncode == 0 and "ws-carol-nogpu is already running in project vision" in r.stdout, r
    finally:
        assert cli(hub, "carol", "workspace", "stop", "ws-carol-nogpu").returncode == 0
