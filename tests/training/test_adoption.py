"""A training's workers outlive the process that runs the job runner (the hub): that
process is SIGKILLed with a 2-worker job running, a new runner starts on the same database
and run folder, and it takes the job back -- still running (same processes, same
placement, then finishing normally), finished meanwhile (Succeeded, no new attempt), or
with a worker that failed meanwhile (a failed attempt, with the exit status). Real
accounts, real processes; the GPU is declared."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_ext.db.tables import WorkloadRow

from .harness import Cluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accounts are made only as root")

ROOT = Path(__file__).resolve().parents[2]
# each worker waits for "go" in its folder; worker 1 then exits with the code written there
WORKER = """
import os, sys, time
while not os.path.exists("go"):
    time.sleep(0.1)
code = open("go").read().strip()
sys.exit(int(code) if os.environ["RANK"] == "1" and code else 0)
"""
# the hub: a runner with the job running, until it is killed
HUB = f"""
import asyncio, sys, time
from tests.training.harness import Cluster

async def main():
    c = Cluster(sys.argv[1], gpus=2)
    async with c:
        c.submit("kept", "research", [sys.executable, "-c", {WORKER!r}], gpu=1, workers=2,
                 restart_policy="Never", grace_period_s=5)
        await c.wait_for("kept", "Running")
        while len(c.runner.jobs["kept"].procs) < 2:
            await asyncio.sleep(0.05)
        print("running", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.parametrize("meanwhile", ["nothing", "all-exit-0", "worker-1-exits-3"])
def test_a_restarted_runner_takes_back_a_job_whose_workers_outlived_it(tmp_path, meanwhile):
    hub = subprocess.Popen([sys.executable, "-c", HUB, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert hub.stdout.readline().strip() == b"running"
    finally:
        hub.send_signal(signal.SIGKILL)
        hub.wait(30)

    async def run():
        c = Cluster(tmp_path, gpus=2, restart=True)  # nothing runs yet: the hub is down
        workdir = c.account().home / ".gpupool" / "workloads" / "kept"
        pids = {h.name: h.pid for h in map(c.launcher.adopt, ("kept-w0", "kept-w1"))}
        with c.Session() as s:
            placement = s.get(WorkloadRow, "kept").placement
        if meanwhile != "nothing":  # the workers end while no runner is there
            (workdir / "go").write_text("3" if meanwhile == "worker-1-exits-3" else "0")
            deadline = time.monotonic() + 60
            while any(c.launcher.adopt(n).alive() for n in pids) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        async with c:  # the hub starts again: the runner recovers
            if meanwhile == "nothing":
                await asyncio.sleep(0.5)  # a few scheduler periods
                job = c.runner.jobs["kept"]
                assert {h.name: h.pid for h in job.procs} == pids  # the same processes
                held = c.scheduler.snapshot.workloads["kept"]
                assert [(p.node, list(p.gpu_indices), p.gpu_milli) for p in held.placement] == \
                    [(p["node"], p["gpu_indices"], p["gpu_milli"]) for p in placement]
                assert c.status("kept") == "Running"
                (workdir / "go").write_text("0")
            t = await c.wait_for("kept", "Succeeded", "Failed")
            usage = dict(c.scheduler.snapshot.usage)
            return t, c.events("kept"), usage, c.launcher.names()

    t, events, usage, left = asyncio.run(run())
    assert t.attempt == 1  # taken back, never started again
    if meanwhile == "worker-1-exits-3":
        assert t.status == "Failed" and t.reason.startswith("worker 1 ended: exit code 3"), t.reason
        assert ("exited", "kept worker 1 ended: exit code 3") in events
    else:
        assert t.status == "Succeeded", t.transitions
    assert not any(usage.values())  # its GPUs are free again
    assert left == []  # the launcher forgot both workers
