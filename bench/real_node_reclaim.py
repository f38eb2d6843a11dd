"""Reclaim-to-running on the test cluster's real node (``scripts/test-cluster up --real-node
--fake-gpus 4 --provisioner``): real containers, GPUs from the kubelet's device manager.

Each round, a training of project ``p-low`` (quota 0), submitted to the hub's training
controller (``KubernetesTrainings``), runs as a gang of two busybox workers with 2 GPUs each
over quota, with its checkpoint claim from the node's host-path provisioner; the workers
save and exit on SIGTERM. carol's pod of project ``p-carol`` (quota 2, 2 GPUs) is created,
then deleted once it runs, then the training (a fresh one each round: a resumed gang is
spared from preemption for a while):

* ``reclaim_to_running_s``: from carol's pod's creation to its container running
  (gpupool-scheduler evicts the gang, the workers exit, the kubelet frees the GPUs, the pod
  is bound and started); ``reclaim_to_bound_s``: to its binding.
* ``resume_s``: from carol's pod's deletion to the requeued gang running again (the
  controller's row ``Running``: both workers bound and their containers running).

Medians and maxima over ``--rounds``; gpupool-scheduler runs as a process with its defaults.

    python bench/real_node_reclaim.py [--rounds 5] [--json]      (root)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub_ext.schema import make_sessionmaker  # noqa: E402
from hub_ext.training.db import TrainingRow, add_training  # noqa: E402
from hub_ext.training.kubernetes import KubernetesTrainings  # noqa: E402
from hub_ext.training.spec import TrainingSpec  # noqa: E402
from scheduler.kubernetes.client import ApiError  # noqa: E402
from scheduler.kubernetes.testcluster import TestCluster, apply_crds, build_binaries, client_for  # noqa: E402
from tests.k8s.conftest import REAL_NODE_CONTROLLERS  # noqa: E402
from tests.k8s.helpers import (  # noqa: E402
    SchedulerProcess,
    create_namespace,
    create_org,
    default_service_account,
)
from tests.k8s.realnode import TEST_IMAGE, build_test_image  # noqa: E402
from tests.k8s.test_real_training import _pod  # noqa: E402

GPUS = 4
NS = "bench-reclaim"
# a worker that saves on SIGTERM: the trap runs once the current 0.1 s sleep ends
WORKER = "trap 'echo saved; exit 143' TERM; echo started; while :; do /bin/busybox sleep 0.1; done"


async def _wait(pred, what: str, timeout: float = 300, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = await pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


async def rounds(info, tmp: Path, n: int) -> list[dict]:
    Session = make_sessionmaker(f"sqlite:///{tmp}/hub.db")
    sched = SchedulerProcess(info, tmp)
    out = []
    async with client_for(info) as kc, client_for(info) as ctl_kc:
        await create_namespace(kc, NS)
        await default_service_account(kc, NS)
        await create_org(kc, "d-bench", GPUS, {"p-low": {"gpus": 0}, "p-carol": {"gpus": 2}})
        sched.start()
        ctl = KubernetesTrainings(ctl_kc, Session, NS, poll_s=0.2, checkpoint_size="1Gi",
                                  storage_class=str(info.storage_class))
        ctl.start()
        try:
            for i in range(n):
                out.append(await one_round(kc, ctl, Session, f"low-{i}"))
                print(f"round {i}: {json.dumps({k: round(v, 2) for k, v in out[-1].items()})}", file=sys.stderr)
        except BaseException:
            pods = (await kc.get(f"/api/v1/namespaces/{NS}/pods"))["items"]
            print(json.dumps([{"name": x["metadata"]["name"], "node": x["spec"].get("nodeName"),
                               "deleting": x["metadata"].get("deletionTimestamp"), "status": x.get("status")}
                              for x in pods], indent=1)[-6000:], file=sys.stderr)
            print(f"--- gpupool-scheduler logs ---\n{sched.logs()}", file=sys.stderr)
            raise
        finally:
            await ctl.stop()
            sched.stop()
    return out


async def one_round(kc, ctl, Session, name: str) -> dict:
    """A fresh training (a resumed gang is spared from preemption for a while) running;
    carol's pod created (timed to bound and running), then deleted (timed to the gang running
    again); the training deleted."""
    spec = TrainingSpec(name=name, project="p-low", command=["/bin/busybox", "sh", "-c", WORKER],
                        image=TEST_IMAGE, gpu=2, workers=2, cpu=0.01, memory_gib=0.03125, grace_period_s=30)

    def row():
        with Session() as s:
            t = s.get(TrainingRow, name)
            return (t.status, t.preemptions) if t else (None, 0)

    async def gang_running():
        return row()[0] == "Running"

    async def requeued():
        return row() == ("Pending", 1)

    with Session() as s:
        add_training(s, "alice", spec)
        s.commit()
    await _wait(gang_running, "the gang running")
    pod = _pod("carol", "p-carol", "exec /bin/busybox sleep 100000", gpus=2, owner="carol")
    path = f"/api/v1/namespaces/{NS}/pods/carol"
    t0 = time.monotonic()
    await kc.post(f"/api/v1/namespaces/{NS}/pods", pod)
    seen: dict = {}

    async def carol_running():
        p = await kc.get(path)
        if p["spec"].get("nodeName") and "bound" not in seen:
            seen["bound"] = time.monotonic() - t0
        return (p.get("status") or {}).get("phase") == "Running"

    await _wait(carol_running, "carol's pod running")
    reclaim = time.monotonic() - t0
    await _wait(requeued, "the gang requeued")
    t1 = time.monotonic()
    await kc.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    await _wait(gang_running, "the gang running again")
    resume = time.monotonic() - t1

    async def gone(p: str):
        try:
            await kc.get(p)
        except ApiError:
            return True
        return False

    await ctl.control(name, "delete")  # its pods gone, then its Service and claim
    await _wait(lambda: gone(path), "carol's pod gone")
    for r in range(2):
        await _wait(lambda r=r: gone(f"/api/v1/namespaces/{NS}/pods/{name}-{r}"), "the workers gone")
    return {"reclaim_to_running_s": reclaim, "reclaim_to_bound_s": seen["bound"], "resume_s": resume}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    build_binaries(provisioner=True)
    with tempfile.TemporaryDirectory(prefix="bench-reclaim-") as d:
        tmp = Path(d)
        (tmp / "cluster").mkdir()
        image = build_test_image(tmp / "busybox.tar")
        from tests.k8s.test_real_gpus import MEMORY_MIB, MODEL, _node_agent_once

        with TestCluster(nodes=0, real_node=True, controller_manager=True, fake_gpus=GPUS, provisioner=True,
                         controllers=REAL_NODE_CONTROLLERS, image_archives=(image,),
                         state_dir=tmp / "cluster") as info:
            asyncio.run(apply_crds(info))
            inventory = tmp / "inventory.json"
            inventory.write_text(json.dumps({"gpus": [
                {"index": i, "uuid": f"{info.fake_gpu_uuid_prefix}{i}", "model": MODEL,
                 "memory_mib": MEMORY_MIB} for i in range(GPUS)]}))
            _node_agent_once(info, inventory)
            runs = asyncio.run(rounds(info, tmp, a.rounds))
    out: dict = {}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        out[key] = {"median": round(statistics.median(vals), 2), "max": round(max(vals), 2)}
    out["rounds"] = a.rounds
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if not a.json:
        for k, v in out.items():
            print(f"{k:>22}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
