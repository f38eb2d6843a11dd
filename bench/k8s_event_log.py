"""How long the Kubernetes event log takes to write ``released`` after a user deletes a
bound pod, and what the hub asks the API server for meanwhile, on the local cluster.

    python bench/k8s_event_log.py [--pods 20] [--json]

Pods with ``schedulerName: gpupool`` are bound here through the binding API (the bench
plays the scheduler) with a GPU each, then deleted one at a time with no grace period, as a
user stopping a workspace. ``hub_ext.cluster.events.PodEvents`` follows them; each delay
runs from the delete's answer to the ``released`` row in the hub's database.
``event_reads`` counts the follower's reads of Events (a lookup per deleted pod would show
there); ``released_delay_s`` gives the median and the largest delay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub_ext.cluster.events import PodEvents  # noqa: E402
from hub_ext.db.tables import EventRow  # noqa: E402
from hub_ext.schema import make_sessionmaker  # noqa: E402
from scheduler.contract import A, workload_annotations  # noqa: E402
from scheduler.kubernetes.testcluster import TestCluster, client_for  # noqa: E402

NS = "bench-event-log"


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS,
                         "annotations": {A.PROJECT: "p", A.KIND: "workspace", **workload_annotations(name, "u")}},
            "spec": {"schedulerName": "gpupool", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox"}]}}


async def measure(info, pods: int, db: Path) -> dict:
    Session = make_sessionmaker(f"sqlite:///{db}")
    async with client_for(info) as kc:
        reads: list[str] = []
        real = kc.get

        async def get(path: str, **params):
            if path.endswith("/events"):
                reads.append(path)
            return await real(path, **params)
        kc.get = get  # type: ignore[method-assign]
        try:
            await kc.post("/api/v1/namespaces", {"metadata": {"name": NS}})
        except Exception:
            pass
        nodes = [n["metadata"]["name"] for n in (await kc.get("/api/v1/nodes"))["items"]]
        follower = asyncio.ensure_future(PodEvents(kc, Session, NS).run())

        def kinds(name: str) -> set[str]:
            with Session() as s:
                return {e.kind for e in s.query(EventRow).filter(EventRow.workload == name)}

        async def until(pred, timeout: float = 60) -> None:
            end = time.monotonic() + timeout
            while not pred():
                if time.monotonic() > end:
                    raise TimeoutError
                await asyncio.sleep(0.01)

        delays = []
        try:
            for i in range(pods):
                name = f"ev-{i}"
                await kc.post(f"/api/v1/namespaces/{NS}/pods", pod(name))
                await kc.request("POST", f"/api/v1/namespaces/{NS}/pods/{name}/binding", {
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "annotations": {A.GPU_INDICES: "0", A.GPU_MILLI: "1000"}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]}}, decode=False)
                await until(lambda n=name: "placed" in kinds(n))
                await kc.delete(f"/api/v1/namespaces/{NS}/pods/{name}",
                                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
                t0 = time.monotonic()
                await until(lambda n=name: "released" in kinds(n))
                delays.append(time.monotonic() - t0)
        finally:
            follower.cancel()
    return {"pods": pods, "event_reads": len(reads),
            "released_delay_s": {"median": round(statistics.median(delays), 3), "max": round(max(delays), 3)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cluster = TestCluster(nodes=2, gpus_per_node=8)
    info = cluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = asyncio.run(measure(info, args.pods, Path(tmp) / "hub.db"))
    finally:
        cluster.stop()
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
