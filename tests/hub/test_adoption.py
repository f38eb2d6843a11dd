"""Work outlives the hub (``gpupool up``, tests/hub/hubproc.py): a 2-worker training, a
command workload and an inference replica run as their owner's account; the hub is
SIGKILLed and started again; all three keep their processes and placements, the training
then finishes normally, the replica serves through the activator again, and a worker
killed with SIGKILL afterwards is reported as such. Real accounts (made as root, removed
afterwards), real processes. No timing is asserted: the waits only bound a hung test."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hubclient import HubClient, call
from hubproc import ACCOUNT_PREFIX, USER_PW, Hub, free_ports

from hub_ext.host.accounts import Accounts
from hub_ext.host.process import Launcher
from tests.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="accounts are made only as root")]

USER = "adoptee"  # its account, PREFIX + adoptee, is no other test's
MODEL_SERVER = str(Path(__file__).resolve().parents[1] / "inference" / "model_server.py")
ORG = f"""admins: [admin]
departments:
  - name: lab
    gpus: 4
    projects:
      - name: team
        gpus: 4
        members: [{USER}]
"""
# a worker that runs until the test drops a file named "go" in its folder (its cwd)
WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.2)\nprint('done')"




def proc_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def serve(hub, token: str, name: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{hub.url}/services/gpupool-serve/{name}/predict?client=t",
                                 headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            code, text = r.status, r.read()
    except urllib.error.HTTPError as e:  # 503 from the proxy until the activator's route is in
        code, text = e.code, e.read()
    try:
        return code, json.loads(text)
    except ValueError:
        return code, {"raw": text.decode(errors="replace")}


@pytest.fixture
def hub(tmp_path):
    (tmp_path / "org.yaml").write_text(ORG)
    (serve_port,) = free_ports(1)
    h = Hub(tmp_path, extra_env={"GPUPOOL_SERVE_PORT": str(serve_port)}, config=(
        "c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n"
        f"c.Gpupool.org_file = {str(tmp_path / 'org.yaml')!r}\nc.Gpupool.use_nvml = False\n"))
    h.start()
    h.token = HubClient(h.url).login(USER, USER_PW).token(USER)
    yield h
    for path in ("/trainings/adopt-train", "/inferences/adopt-serve", "/workloads/adopt-cmd"):
        call(h.url, h.token, "DELETE", path)
    time.sleep(2)  # the hub stops them (then the hub itself stops)
    h.stop()
    launcher = Launcher(tmp_path / "state" / "run")
    for name in launcher.names():  # whatever is left: never outlive the test
        handle = launcher.adopt(name)
        if handle is not None and handle.alive():
            os.killpg(handle.pid, signal.SIGKILL)
    Accounts(mode="create", prefix=ACCOUNT_PREFIX).remove(USER)


def kill_hub(hub) -> None:
    """SIGKILL the hub and the gpupool service it runs (a new hub starts its own on the same
    port); the proxy is left to the new hub, which replaces it. The workloads' monitors are
    the hub's children too, in sessions of their own: they must outlive it."""
    services = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _child_service(p, hub.proc.pid)]
    os.kill(hub.proc.pid, signal.SIGKILL)
    hub.proc.wait(30)
    for pid in services:
        os.kill(pid, signal.SIGKILL)


def _child_service(proc: Path, parent: int) -> bool:
    try:
        ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        return ppid == parent and b"hub_ext.service" in (proc / "cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False


def api(hub, method, path, body=None, expect=None):
    status, data = call(hub.url, hub.token, method, path, body)
    if expect is not None:
        assert status == expect, (status, data)
    return data


def workloads(hub) -> dict[str, dict]:
    return {w["name"]: w for w in api(hub, "GET", "/workloads", expect=200)["items"]}


def test_a_hub_sigkill_stops_nothing_and_the_restarted_hub_adopts_everything(hub):
    api(hub, "POST", "/trainings", {
        "name": "adopt-train", "project": "team", "gpu": 0.5, "workers": 2, "grace_period_s": 5,
        "command": [sys.executable, "-c", WAIT_FOR_GO]}, expect=201)
    api(hub, "POST", "/workloads", {
        "name": "adopt-cmd", "kind": "training", "project": "team", "gpu_mode": "fraction",
        "gpu_fraction": 0.25, "command": [sys.executable, "-c", "import time; time.sleep(600)"]}, expect=201)
    api(hub, "POST", "/inferences", {
        "name": "adopt-serve", "project": "team", "gpu": 0.25, "min_replicas": 1, "max_replicas": 1,
        "scale_to_zero_after_s": 600, "ready_path": "/health",
        "command": [sys.executable, MODEL_SERVER, "--socket", "{socket}", "--startup-s", "0"]}, expect=201)
    code, first = wait_for(lambda: (r := serve(hub, hub.token, "adopt-serve"))[0] == 200 and r,
                           "the replica serves")
    wait_for(lambda: api(hub, "GET", "/trainings/adopt-train")["status"] == "Running", "training running")
    wait_for(lambda: workloads(hub).get("adopt-cmd", {}).get("state") == "running", "command running")

    launcher = Launcher(hub.workdir / "state" / "run")
    names = ["adopt-train-w0", "adopt-train-w1", "adopt-cmd"]
    replica = next(n for n in launcher.names() if n.startswith("adopt-serve-"))
    # "Running" is written as the workers start: wait until each has a process to adopt
    def started():
        found = {n: launcher.adopt(n) for n in [*names, replica]}
        return all(found.values()) and found
    handles = wait_for(started, "every worker started", detail=lambda: str(launcher.names()))
    pids = {n: h.pid for n, h in handles.items()}
    account = Accounts(mode="create", prefix=ACCOUNT_PREFIX).for_user(USER)
    assert {n: proc_uid(p) for n, p in pids.items()} == dict.fromkeys(pids, account.uid)
    assert first["pid"] == pids[replica]
    before = {n: w["placement"] for n, w in workloads(hub).items()}
    assert before["adopt-train"] and before["adopt-cmd"] and before[replica]

    kill_hub(hub)
    assert all(launcher.adopt(n).alive() for n in pids), "a workload died with the hub"
    hub.start()

    after = wait_for(lambda: (w := workloads(hub)) and all(w.get(n, {}).get("state") == "running"
                                                          for n in ("adopt-train", "adopt-cmd", replica)) and w,
                     "all three running again after the restart")
    assert {n: after[n]["placement"] for n in before} == before
    assert {n: launcher.adopt(n).pid for n in pids} == pids  # the same processes
    assert api(hub, "GET", "/trainings/adopt-train")["status"] == "Running"
    code, body = wait_for(lambda: (r := serve(hub, hub.token, "adopt-serve"))[0] == 200 and r,
                          "the adopted replica serves through the activator")
    assert body["pid"] == pids[replica]  # served by the adopted replica, not a new one
    assert [n for n in launcher.names() if n.startswith("adopt-serve-")] == [replica]

    # the adopted training finishes normally
    (account.home / ".gpupool" / "workloads" / "adopt-train" / "go").touch()
    t = wait_for(lambda: (t := api(hub, "GET", "/trainings/adopt-train"))["status"] in ("Succeeded", "Failed")
                 and t, "the training ends")
    assert t["status"] == "Succeeded", t
    assert "adopt-train" not in {n for n, w in workloads(hub).items() if w["placement"]}

    # an adopted process killed with SIGKILL: the event carries how it ended
    os.killpg(pids["adopt-cmd"], signal.SIGKILL)
    w = wait_for(lambda: (w := workloads(hub)["adopt-cmd"])["state"] == "failed" and w, "the kill is seen")
    assert w["reason"] == "killed by SIGKILL" and w["placement"] == []
    events = api(hub, "GET", "/events?workload=adopt-cmd", expect=200)
    assert any(e["kind"] == "exited" and "killed by SIGKILL" in e["message"] for e in events["items"]), events
