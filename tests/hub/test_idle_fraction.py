"""Idleness per fraction on a real hub: alice's and bob's workspaces share one GPU, a
quarter each. A process in alice's launches kernels through the fake driver (with the
interception library preloaded, as on a real GPU); bob's launches nothing. The culler
stops bob's workspace after the idle timeout and leaves alice's running, although NVML
would see one GPU kept busy by her."""

import shutil
import time

import pytest
from hubclient import HubClient, call
from hubkernel import run_code
from hubproc import ADMIN_PW, USER_PW, Hub
from test_workspaces import wait_ready

from hub_ext.activity import workload_activity
from tests.native.conftest import NATIVE

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
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {LAUNCHER!r}], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2)
print(open("/dev/shm/gpupool-ws-alice", "rb").read(16)[8:16] != bytes(8))
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
    before = workload_activity("ws-alice").launches
    time.sleep(3)
    assert workload_activity("ws-alice").launches > before  # still launching, still there
    assert "culling idle workspace bob/" in ihub.log.read_text()
    assert "culling idle workspace alice/" not in ihub.log.read_text()
