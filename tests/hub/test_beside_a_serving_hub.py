"""A test run on a machine where gpupool serves users touches nothing of that gpupool.

A hub started as ``make run`` starts it (the product's account prefix, ``gpupool-``) serves
alice, and while it does, a second test run, started as ``make test`` would start it, runs
tests that make accounts, hubs and workspaces of their own, alice's among them. Afterwards
the serving hub's account, home, files, workspace and GPU account are as they were: the test
run made its accounts under a prefix of its own, in its own state folders, and removed only
those.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time

import pytest
from hubclient import HubClient, call
from hubkernel import run_code
from hubproc import ADMIN_PW, ROOT, USER_PW, Hub, remove_account
from test_embedded_accounts import server_pid, start_workspace

from tests.conftest import PRODUCT_ACCOUNT_PREFIX

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="accounts per user need a hub started as root"),
]
SERVED = PRODUCT_ACCOUNT_PREFIX + "alice"
MARK = "alice's work on the serving hub"
# tests that make accounts, hubs and workspaces (alice's among them) and remove them after
NEIGHBOUR_TESTS = [
    "tests/hub/test_embedded_accounts.py::test_workspace_runs_as_its_owners_account_in_a_private_home",
    "tests/host/test_accounts.py",
]


def _entry(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    if _entry(SERVED) is not None:
        pytest.skip(f"the account {SERVED} exists: a gpupool serves users on this machine, and "
                    "this test makes and removes that account")
    hub = Hub(tmp_path_factory.mktemp("serving"),
              extra_env={"GPUPOOL_ACCOUNT_PREFIX": PRODUCT_ACCOUNT_PREFIX})
    try:
        hub.start()
        hub.tokens = {"alice": HubClient(hub.url).login("alice", USER_PW).token("alice"),
                      "admin": HubClient(hub.url).login("admin", ADMIN_PW).token("admin")}
        yield hub
    finally:
        hub.stop()
        if _entry(SERVED) is not None:  # this test made it (it was not there before)
            remove_account(SERVED)


def _snapshot(hub: Hub) -> dict:
    entry = _entry(SERVED)
    assert entry is not None, f"{SERVED} is gone"
    pid = server_pid(hub, "ws-alice")
    region = dict(line.split("=", 1) for line in open(f"/proc/{pid}/environ").read().split("\0")
                  if line.startswith("GPUPOOL_SHARED_REGION="))["GPUPOOL_SHARED_REGION"]
    st = os.stat(region)
    return {"uid": entry.pw_uid, "home": entry.pw_dir, "pid": pid, "alive": os.path.exists(f"/proc/{pid}"),
            "mark": open(os.path.join(entry.pw_dir, "mark.txt")).read(),
            "region": (region, st.st_uid, st.st_ino)}


def test_a_test_run_beside_a_serving_hub_leaves_its_users_alone(serving, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUPOOL_TEST_ACCOUNT_PREFIX", "GPUPOOL_ACCOUNT_PREFIX", "PYTEST_CURRENT_TEST")}
    basetemp = tmp_path / "neighbour"
    neighbour = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
         *NEIGHBOUR_TESTS], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the serving hub's account is made while the neighbour run is under way
        deadline = time.monotonic() + 120
        while not basetemp.exists() and neighbour.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        start_workspace(serving, "alice", "nlp")
        run_code(serving.url, "/user/alice/", serving.tokens["alice"],
                 f"open('mark.txt', 'w').write({MARK!r})")
        before = _snapshot(serving)
        out, _ = neighbour.communicate(timeout=900)
    finally:
        if neighbour.poll() is None:
            neighbour.kill()
    assert neighbour.returncode == 0, out[-3000:]
    assert "passed" in out, out[-3000:]
    after = _snapshot(serving)
    assert after == before and after["alive"] and after["mark"] == MARK
    _, user = call(serving.url, serving.tokens["alice"], "GET", "/hub/api/users/alice", api=False)
    assert user["servers"][""]["ready"], user
    assert run_code(serving.url, "/user/alice/", serving.tokens["alice"],
                    "print(open('mark.txt').read())").strip() == MARK
