"""A training job whose workers cannot start fails with the reason and gives its GPUs
back; the job runner itself goes on (no traceback, the next job runs)."""

import asyncio
import logging
import sys

import pytest

from .harness import Cluster

OK = [sys.executable, "-c", "print('ok')"]


@pytest.mark.parametrize("command, env", [
    ([sys.executable, "-c", "print(1)\x00"], {}),  # a NUL byte stored by an older release
    (OK, {"BAD": "a\x00b"}),
    (["/nonexistent/train"], {}),
], ids=["nul-in-command", "nul-in-env", "no-such-program"])
def test_a_job_whose_workers_cannot_start_fails_and_the_runner_goes_on(tmp_path, caplog, command, env):
    async def run():
        async with Cluster(tmp_path, gpus=1) as c:
            c.submit("broken", "research", command, gpu=1, env=env)
            broken = await c.wait_for("broken", "Failed", "Succeeded")
            c.submit("after", "research", OK, gpu=1)
            after = await c.wait_for("after", "Succeeded", "Failed")
            return c, broken, after

    with caplog.at_level(logging.ERROR):
        c, broken, after = asyncio.run(run())
    assert broken.status == "Failed", broken.transitions
    assert broken.reason.startswith("could not start the workers: "), broken.reason
    assert after.status == "Succeeded", after.transitions
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert c.scheduler.snapshot.usage.get(("research", "default"), 0) == 0
