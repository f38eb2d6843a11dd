"""Replicas outlive the process that runs the controller (the hub): it is SIGKILLed with a
replica serving on a unix socket; a new controller on the same run folder takes the replica
back (same process, same placement, held in the scheduler again) and serves through it --
or, when the replica died meanwhile, gives its share back and starts a new one. Real
accounts, real processes and sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hub_ext.host.process import Launcher
from hub_ext.serving.spec import parse_spec

from .harness import MODEL_SERVER, service, stack, until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accounts are made only as root")

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "kept", "max_replicas": 1, "min_replicas": 1, "scale_to_zero_after_s": 600,
        "command": [sys.executable, MODEL_SERVER, "--socket", "{socket}", "--startup-s", "0"]}
HUB = f"""
import asyncio, json, sys
from pathlib import Path
from tests.inference.harness import stack

async def main():
    async with stack(state=Path(sys.argv[1])) as st:
        svc = st.put(**{SPEC!r})
        while not svc.ready():
            await asyncio.sleep(0.05)
        (r,) = svc.ready()
        w = st.sched.snapshot.workloads[r.name]
        print(json.dumps({{"name": r.name, "pid": r.handle.proc.pid, "placement": [
            {{"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_milli": p.gpu_milli}}
            for p in w.placement]}}), flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.parametrize("meanwhile", ["nothing", "replica-killed"])
def test_a_new_controller_takes_back_a_replica_that_outlived_the_hub(tmp_path, meanwhile):
    state = tmp_path / "state"
    hub = subprocess.Popen([sys.executable, "-c", HUB, str(state)], cwd=ROOT, stdout=subprocess.PIPE,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        before = json.loads(hub.stdout.readline())
    finally:
        hub.send_signal(signal.SIGKILL)
        hub.wait(30)
    if meanwhile == "replica-killed":  # and its monitor has recorded the end
        os.killpg(before["pid"], signal.SIGKILL)
        handle = Launcher(state / "run").adopt(before["name"])
        deadline = time.monotonic() + 30
        while handle.exit() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    async def main():
        async with stack(state=state) as st:
            row = SimpleNamespace(state="running", placement=before["placement"])
            kept = st.controller.adopt(parse_spec(service(**SPEC)), before["name"], row)
            held = st.sched.snapshot.workloads.get(before["name"])
            svc = st.controller.services["kept"]
            async with st.http.get(f"{st.url}/kept/predict") as r:
                assert r.status == 200, await r.text()
                pid = json.loads(await r.read())["pid"]
            await until(lambda: len(svc.replicas) == 1, what="one replica")
            return kept, held, pid, [r.name for r in svc.replicas]

    kept, held, pid, names = asyncio.run(main())
    if meanwhile == "nothing":
        assert kept and pid == before["pid"] and names == [before["name"]]
        assert [{"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_milli": p.gpu_milli}
                for p in held.placement] == before["placement"]
    else:  # its share went back at once; a new replica serves
        assert not kept and held is None
        assert pid != before["pid"] and names != [before["name"]]
