"""Embedded workspaces on a real hub run as their owners' OS accounts, outlive the hub, and
give their GPUs back as soon as their process dies."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import time
from pathlib import Path

import pytest
from hubclient import HubClient, call
from hubkernel import run_code
from hubproc import ADMIN_PW, ROOT, USER_PW, Hub, account

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rhub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("accounts"),
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n").start()
    login(h)
    yield h
    h.stop()


def login(h: Hub) -> None:
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "bob")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")


def start_workspace(h: Hub, user: str, project: str) -> None:
    if workload(h, f"ws-{user}") is not None:
        return
    status, w = call(h.url, h.tokens[user], "POST", "/workloads",
                     {"kind": "workspace", "project": project, "gpu_mode": "fraction", "gpu_fraction": 0.25})
    assert status == 202, w
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        _, u = call(h.url, h.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
        if (u.get("servers") or {}).get("", {}).get("ready"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{user}'s workspace did not start")


def workload(h: Hub, name: str) -> dict | None:
    _, data = call(h.url, h.tokens["admin"], "GET", "/workloads")
    return next((w for w in data["items"] if w["name"] == name), None)


def server_pid(h: Hub, name: str) -> int:
    return json.loads((h.workdir / "state" / "run" / name / "child.pid").read_text())["pid"]


def uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def events(h: Hub, name: str) -> list[dict]:
    _, data = call(h.url, h.tokens["admin"], "GET", f"/events?workload={name}&limit=100")
    return data["items"]


def test_workspace_runs_as_its_owners_account_in_a_private_home(rhub):
    start_workspace(rhub, "alice", "nlp")
    entry = pwd.getpwnam(account("alice"))
    assert uid_of(server_pid(rhub, "ws-alice")) == entry.pw_uid != 0
    out = json.loads(run_code(rhub.url, "/user/alice/", rhub.tokens["alice"],
                              "import json, os, pwd; print(json.dumps({'uid': os.getuid(), 'home': "
                              "os.environ['HOME'], 'cwd': os.getcwd(), 'user': pwd.getpwuid(os.getuid()).pw_name}))"))
    assert out == {"uid": entry.pw_uid, "home": entry.pw_dir, "cwd": entry.pw_dir, "user": account("alice")}
    home = Path(entry.pw_dir)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and home.stat().st_uid == entry.pw_uid
    assert ROOT not in home.parents
    state = rhub.workdir / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == 0


def test_workspace_outlives_a_hub_sigkill(rhub):
    start_workspace(rhub, "alice", "nlp")
    pid, before = server_pid(rhub, "ws-alice"), workload(rhub, "ws-alice")
    rhub.kill()
    assert uid_of(pid) == pwd.getpwnam(account("alice")).pw_uid  # still running, hub gone
    rhub.start()
    login(rhub)
    after = workload(rhub, "ws-alice")
    assert after is not None and after["state"] == "running"
    assert after["placement"] == before["placement"] and server_pid(rhub, "ws-alice") == pid
    _, u = call(rhub.url, rhub.tokens["admin"], "GET", "/hub/api/users/alice", api=False)
    assert u["servers"][""]["ready"]
    # the same JupyterLab answers through the restarted hub's proxy
    assert run_code(rhub.url, "/user/alice/", rhub.tokens["alice"], "import os; print(os.getppid())").strip() == str(pid)
    # its allocation stays open: GPU-hours go on without a gap
    allocation = [e["kind"] for e in events(rhub, "ws-alice") if e["kind"] in ("placed", "released", "requeued")]
    assert allocation[0] == "placed", allocation  # newest first


def test_killed_workspace_gives_back_its_share_with_how_it_ended(rhub):
    start_workspace(rhub, "bob", "nlp")
    assert workload(rhub, "ws-bob")["placement"]
    os.kill(server_pid(rhub, "ws-bob"), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and workload(rhub, "ws-bob") is not None:
        time.sleep(0.2)
    assert workload(rhub, "ws-bob") is None
    ended = [e for e in events(rhub, "ws-bob") if e["kind"] == "exited"]
    assert ended and "killed by SIGKILL" in ended[0]["message"], events(rhub, "ws-bob")
    released = [e for e in events(rhub, "ws-bob") if e["kind"] == "released"]
    assert released and "SIGKILL" in released[0]["message"]


def test_kernel_over_the_workspace_memory_is_killed_and_reported(rhub):
    status, w = call(rhub.url, rhub.tokens["bob"], "POST", "/workloads",
                     {"kind": "workspace", "project": "nlp", "gpu_mode": "none", "memory_gib": 1,
                      "server_name": "small"})
    assert status == 202, w
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        _, u = call(rhub.url, rhub.tokens["admin"], "GET", "/hub/api/users/bob", api=False)
        if (u.get("servers") or {}).get("small", {}).get("ready"):
            break
        time.sleep(0.5)
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 2**20))\n"
    with pytest.raises(Exception):  # noqa: B017 - the kernel dies mid-cell, however the client puts it
        run_code(rhub.url, "/user/bob/small/", rhub.tokens["bob"], hog, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        oom = [e for e in events(rhub, "ws-bob-small") if e["kind"] == "oom-killed"]
        if oom:
            break
        time.sleep(0.5)
    assert oom and "out of memory (limit 1 GiB)" in oom[0]["message"], events(rhub, "ws-bob-small")
    assert workload(rhub, "ws-bob-small")["state"] == "running"  # the server itself goes on
