"""End to end in embedded mode, with real processes: a numpy training run over quota is
preempted when another project submits in-quota work, checkpoints on SIGTERM, is requeued
with a raised priority, resumes once that work is done, and ends with exactly the weights
of an uninterrupted run with the same seed."""

import asyncio
import json
import os
import subprocess
import sys

from .harness import SCRIPT, Cluster

STEPS, EVERY = 150, 10


def reference_run(tmp, seed):
    """The same script run straight through, outside gpupool."""
    out = tmp / "reference"
    out.mkdir()
    # nothing of this process's environment, as for the workers (an OPENBLAS_CORETYPE set
    # here picks other kernels, and the last bits of the weights differ)
    env = {"PATH": os.environ["PATH"], "STEPS": str(STEPS), "EVERY": str(EVERY), "STEP_SLEEP": "0", "SEED": str(seed),
           "RESULT": str(out / "result.json"), "PROGRESS": str(out / "progress.txt"),
           "GPUPOOL_CHECKPOINT_DIR": str(out / "ckpt"), "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, str(SCRIPT)], env=env, check=True, cwd=out)
    return json.loads((out / "result.json").read_text())


def test_preempted_job_resumes_and_matches_uninterrupted_run(tmp_path):
    seed = 7

    async def run():
        async with Cluster(tmp_path, gpus=1, projects={"research": 0.0, "prod": 1.0}) as c:
            out = c.outbox()  # the workers run as alice's account: they write in its home
            result, progress = out / "result.json", out / "progress.txt"
            c.submit("train", "research", [sys.executable, str(SCRIPT)], gpu=1, grace_period_s=30,
                     env={"STEPS": str(STEPS), "EVERY": str(EVERY), "STEP_SLEEP": "0.02",
                          "SEED": str(seed), "RESULT": str(result), "PROGRESS": str(progress)})
            await c.wait_for("train", "Running")
            while not progress.exists() or len(progress.read_text().splitlines()) < 25:
                await asyncio.sleep(0.05)
            # prod is below its quota: its job reclaims the GPU from research's training
            c.submit("urgent", "prod", [sys.executable, "-c", "import time; time.sleep(1)"], gpu=1)
            await c.wait_for("train", "Preempted")
            await c.wait_for("urgent", "Running", "Succeeded")
            assert c.status("train") == "Preempted"
            await c.wait_for("urgent", "Succeeded")
            t = await c.wait_for("train", "Succeeded", timeout=180)
            return t, c.events("train"), c.job("urgent"), result.read_text(), progress.read_text()

    t, events, urgent, result, progress = asyncio.run(run())
    assert urgent.preemptions == 0
    kinds = [k for k, _ in events]
    for kind in ("submitted", "placed", "preempted", "requeued", "resumed", "succeeded"):
        assert kind in kinds, events
    assert kinds.index("preempted") < kinds.index("requeued") < kinds.index("resumed")
    assert t.preemptions == 1 and t.failures == 0
    statuses = [tr["status"] for tr in t.transitions]
    for a, b in [("Running", "Preempted"), ("Preempted", "Resuming"), ("Resuming", "Running")]:
        assert any(statuses[i] == a and statuses[i + 1] == b for i in range(len(statuses) - 1)), statuses
    requeued = next(m for k, m in events if k == "requeued")
    assert "priority 51 (was 50)" in requeued
    # the same weights, bit for bit, as a run that was never interrupted
    assert json.loads(result) == reference_run(tmp_path, seed)
    # lost work: steps run twice are at most one checkpoint interval
    lines = [ln.split() for ln in progress.splitlines()]
    attempts = {a for _, a in lines}
    assert len(attempts) == 2
    redone = len(lines) - STEPS
    assert 0 <= redone <= EVERY, redone
