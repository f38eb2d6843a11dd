"""Idleness per fraction on a real hub: alice's and bob's workspaces share one GPU, a
quarter each. A process in alice's launches kernels through the fake driver (with the
interception library preloaded, as on a real GPU); bob's launches nothing. The culler
stops bob's workspace after the idle timeout and leaves alice's running, although NVML
would see one GPU kept busy by her. The same rule holds per training worker under the
project's policy's training idle timeout: bob's idle training is suspended, with an event
and a status reason naming the policy; alice's keeps running on one busy worker of two."""

import shutil
import time

import pytest
from hubclient import HubClient, call
from hubkernel import run_code
from hubproc import ADMIN_PW, USER_PW, Hub
from test_workspaces import wait_ready

from hub_ext.host.activity import reader
from hub_ext.training.db import worker_region
from tests.native.conftest import NATIVE
from tests.waits import wait_for

pytestmark = pytest.mark.slow
IDLE_S = 30
FAKE = NATIVE / "build" / "fake" / "libcuda.so.1"
PRELOAD = NATIVE / "build" / "libgpupool-cuda.so"

# a detached process of the workspace: it outlives the kernel that starts it
LAUNCHER = f'''
import ctypes, time
cu = ctypes.CDLL("{FAKE}")
cu.cuInit(0)
ctx = ctypes.c_void_p()
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
cu.cuCtxSetCurrent(ctx)
while True:
    cu.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    time.sleep(0.5)
'''
START = f'''
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {LAUNCHER!r}], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2)
print(open(os.environ["GPUPOOL_SHARED_REGION"], "rb").read(16)[8:16] != bytes(8))
'''


@pytest.fixture(scope="module")
def ihub(tmp_path_factory):
    if not (FAKE.exists() and PRELOAD.exists()) or not shutil.which("cc"):
        pytest.skip("the interception library and the fake driver are not built (make -C native)")
    h = Hub(tmp_path_factory.mktemp("ihub"), config=(
        "c = get_config()  # noqa\n"
        f"c.Gpupool.cull_idle_s = {IDLE_S}\n"
        "c.Gpupool.cull_every_s = 2\n")).start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "bob")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    h.activity = reader(h.env["GPUPOOL_STATE_DIR"])
    yield h
    h.stop()


def _ready(hub, user: str) -> bool:
    _, u = call(hub.url, hub.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
    return bool((u.get("servers") or {}).get("", {}).get("ready"))


def test_only_the_fraction_that_launches_nothing_is_culled(ihub):
    for user in ("alice", "bob"):
        status, w = call(ihub.url, ihub.tokens[user], "POST", "/workloads",
                         {"kind": "workspace", "project": "nlp", "gpu_mode": "fraction", "gpu_fraction": 0.25})
        assert status == 202, w
        wait_ready(ihub, user)
        if user == "alice":
            assert run_code(ihub.url, "/user/alice/", ihub.tokens["alice"], START).strip() == "True"
    places = [call(ihub.url, ihub.tokens[u], "GET", f"/workloads/ws-{u}")[1]["placement"] for u in ("alice", "bob")]
    assert places[0] == places[1] and places[0][0]["gpu_milli"] == 250, places  # one GPU, shared
    deadline = time.monotonic() + IDLE_S * 6
    while _ready(ihub, "bob") and time.monotonic() < deadline:
        time.sleep(1)
    assert not _ready(ihub, "bob"), "bob's idle quarter was not culled"
    assert _ready(ihub, "alice"), "alice's busy quarter was culled"
    before = ihub.activity("ws-alice").launches
    time.sleep(3)
    assert ihub.activity("ws-alice").launches > before  # still launching, still there
    assert "culling idle workspace bob/" in ihub.log.read_text()
    assert "culling idle workspace alice/" not in ihub.log.read_text()


TRAINING_IDLE_S = 20
RANK_0_LAUNCHES = f'''
import os, time
if os.environ["RANK"] == "0":
    exec({LAUNCHER!r})
time.sleep(3600)
'''


def _training(hub, user: str) -> dict:
    return call(hub.url, hub.tokens[user], "GET", f"/trainings/{user}-train")[1]


def test_a_training_whose_workers_launch_nothing_is_suspended_by_the_policy(ihub):
    import sys

    admin = ihub.tokens["admin"]
    assert call(ihub.url, admin, "PUT", "/projects/nlp/policy",
                {"idle_timeout_training_s": TRAINING_IDLE_S})[0] == 200
    # alice's two workers: only rank 0 launches; bob's one worker launches nothing
    commands = {"alice": [sys.executable, "-c", RANK_0_LAUNCHES], "bob": ["sleep", "600"]}
    try:
        for user, command in commands.items():
            code, t = call(ihub.url, ihub.tokens[user], "POST", "/trainings",
                           {"name": f"{user}-train", "project": "nlp", "command": command, "gpu": 0.25,
                            "workers": 2 if user == "alice" else 1})
            assert code == 201, t
        for user in commands:
            wait_for(lambda user=user: _training(ihub, user)["status"] == "Running", f"{user}'s training runs")
        wait_for(lambda: ihub.activity(worker_region("alice-train", 0)).launches > 0,
                 "alice's worker launches kernels")
        bob = wait_for(lambda: (t := _training(ihub, "bob"))["status"] == "Suspended" and t,
                       "bob's idle training is suspended", timeout=TRAINING_IDLE_S * 8)
        limit = f"the idle timeout of a training ({TRAINING_IDLE_S} s, project nlp's policy)"
        assert bob["reason"] == f"idle longer than {limit}", bob
        stopped = [e for e in bob["events"] if e["kind"] == "stopped"]
        assert [e["message"] for e in stopped] == [
            f"bob-train: no GPU activity on any of its workers for longer than {limit}; suspended"]
        alice = _training(ihub, "alice")
        assert alice["status"] == "Running", alice  # one busy worker keeps the training
        assert ihub.activity(worker_region("alice-train", 1)).count == 0
        assert not [e for e in alice["events"] if e["kind"] == "stopped"], alice["events"]
        before = ihub.activity(worker_region("alice-train", 0)).launches
        wait_for(lambda: ihub.activity(worker_region("alice-train", 0)).launches > before,
                 "alice's worker still launching")
        assert _training(ihub, "alice")["status"] == "Running"
        # suspended, not ended: it may be resumed
        assert call(ihub.url, ihub.tokens["bob"], "POST", "/trainings/bob-train/resume")[0] == 202
        wait_for(lambda: _training(ihub, "bob")["status"] in ("Pending", "Running"), "bob's training queued again")
    finally:
        call(ihub.url, admin, "PUT", "/projects/nlp/policy", {})
        for user in commands:
            call(ihub.url, ihub.tokens[user], "DELETE", f"/trainings/{user}-train")
