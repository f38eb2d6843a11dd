"""Training workers run as their owner's account: the uid in /proc is the account's, the
environment is built from scratch (none of the hub's variables), the job's folder is in
the account's home, and a credential file is the account's own (0400, in a 0700 folder)
and gone once the job ends. A worker killed with SIGKILL is reported as such. Real
accounts (made as root, removed afterwards), real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from hub_ext.attachments import attach, credentials
from hub_ext.host.cgroups import detect

from .harness import Cluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accounts are made only as root")

WORKER = """
import json, os, time
out = {"uid": os.getuid(), "env": dict(os.environ), "cwd": os.getcwd()}
folder = os.environ["GPUPOOL_CREDENTIALS_REGISTRY"]
st = os.stat(os.path.join(folder, "token"))
out["file"] = [st.st_uid, st.st_mode & 0o777, open(os.path.join(folder, "token")).read()]
out["folder"] = os.stat(folder).st_mode & 0o777
with open("seen-%s.json" % os.environ["RANK"], "w") as f:
    json.dump(out, f)
time.sleep(600)
"""


def proc_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def test_workers_run_as_the_owner_and_a_sigkill_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_TEST_HUB_SECRET", "only-the-hub-has-this")

    async def run():
        async with Cluster(tmp_path, gpus=2) as c:
            c.runner.delivery = attach.Delivery(c.Session, credentials.Vault(tmp_path / "key"), tmp_path / "state")
            with c.Session() as s:
                credentials.create(s, c.runner.delivery.vault, "research", {
                    "name": "registry", "delivery": "files", "data": {"token": "t0ken"}}, "admin")
                s.commit()
            c.submit("acct", "research", [sys.executable, "-c", WORKER], gpu=1, workers=2,
                     restart_policy="Never", grace_period_s=5, credentials=["registry"])
            await c.wait_for("acct", "Running")
            account = c.account()
            workdir = account.home / ".gpupool" / "workloads" / "acct"
            for _ in range(600):
                if all((workdir / f"seen-{r}.json").exists() for r in (0, 1)):
                    break
                await asyncio.sleep(0.05)
            seen = [json.loads((workdir / f"seen-{r}.json").read_text()) for r in (0, 1)]
            handles = c.runner.jobs["acct"].procs
            uids = [proc_uid(h.pid) for h in handles]
            folder = workdir.stat()
            secrets = account.home / ".gpupool" / "secrets" / "acct"
            os.kill(handles[1].pid, signal.SIGKILL)
            t = await c.wait_for("acct", "Failed")
            for _ in range(200):  # the job's task cleans up after it writes Failed
                if not secrets.exists():
                    break
                await asyncio.sleep(0.05)
            return account, seen, uids, folder, secrets.exists(), t, c.events("acct")

    account, seen, uids, folder, secrets_left, t, events = asyncio.run(run())
    assert uids == [account.uid, account.uid] and account.uid != 0
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (account.uid, 0o700)
    for rank, s in enumerate(seen):
        env = s["env"]
        assert s["uid"] == account.uid and s["cwd"] == str(account.home / ".gpupool" / "workloads" / "acct")
        assert "GPUPOOL_TEST_HUB_SECRET" not in env
        assert (env["HOME"], env["USER"], env["RANK"]) == (str(account.home), account.name, str(rank))
        assert env["GPUPOOL_CHECKPOINT_DIR"].startswith(str(account.home) + "/")
        assert s["file"] == [account.uid, 0o400, "t0ken"] and s["folder"] == 0o700
    assert not secrets_left
    assert t.reason.startswith("worker 1 ended: killed by SIGKILL"), t.reason
    assert ("exited", "acct worker 1 ended: killed by SIGKILL") in events


def test_a_worker_over_its_memory_is_oom_killed_and_reported(tmp_path):
    if not detect().enforced:
        pytest.skip(f"memory limits are not enforced here: {detect().reason}")
    hog = "b = bytearray(1024 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(60)"

    async def run():
        async with Cluster(tmp_path, gpus=1) as c:
            c.submit("hog", "research", [sys.executable, "-c", hog], gpu=1, memory_gib=0.25,
                     restart_policy="Never", grace_period_s=5)
            return await c.wait_for("hog", "Failed", "Succeeded"), c.events("hog")

    t, events = asyncio.run(run())
    assert t.status == "Failed"
    assert t.reason.startswith("worker 0 ended: killed: out of memory (limit 256 MiB)"), t.reason
    assert ("oom-killed", "hog worker 0 ended: killed: out of memory (limit 256 MiB)") in events
