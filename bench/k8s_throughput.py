"""Scheduling throughput on the local cluster: kube-scheduler vs gpupool-scheduler vs a bare
binding loop, side by side on the same cluster in the same run.

    python bench/k8s_throughput.py [--nodes 500] [--gpus-per-node 8] [--pods 5000] [--json]

Per scheduler: a burst of single-GPU pods is created (``--create-concurrency`` requests in
flight) while the scheduler runs; "pods/s" is pods bound / (last bind seen - first create
sent), and the latency of a pod is from its create returning to its bind appearing in a
watch. The ceiling is the same burst served by a client loop that binds each pod to the
next free GPU with no scheduling at all: what the API server allows on this machine.
Published anchors on KWOK (YuniKorn's docs): kube-scheduler ~50 pods/s, YuniKorn 833 pods/s.
Note 500 x 8 = 4,000 GPUs for 5,000 pods: the last 1,000 stay pending (as they would on a
full cluster); throughput counts the pods that can be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.k8s.client import ApiError, KubeClient  # noqa: E402
from scheduler.k8s.testcluster import (  # noqa: E402
    ClusterInfo,
    TestCluster,
    apply_crds,
    client_for,
    script_path,
)

NS = "bench"
GROUP = "/apis/gpupool.io/v1alpha1"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pod(name: str, scheduler: str) -> dict:
    ann = {"gpupool.io/project": "bench", "gpupool.io/kind": "training"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": ann},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox", "resources": {
                     "requests": {"cpu": "100m", "memory": "64Mi"},
                     "limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


async def wait_empty(kc: KubeClient) -> None:
    await kc.request("DELETE", f"/api/v1/namespaces/{NS}/pods",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    while (await kc.get(f"/api/v1/namespaces/{NS}/pods", limit=1))["items"]:
        await asyncio.sleep(0.5)


async def burst(kc: KubeClient, scheduler: str, n: int, expect: int, concurrency: int,
                stall_s: float) -> dict:
    """Create n pods for ``scheduler``; return throughput and latency of their binds."""
    _, rv = await kc.list_all(f"/api/v1/namespaces/{NS}/pods", limit=1)
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal rv
        while not done.is_set():
            try:
                async for ev in kc.watch(f"/api/v1/namespaces/{NS}/pods", rv,
                                         fieldSelector=f"spec.schedulerName={scheduler}"):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    name = obj["metadata"].get("name")
                    if name and name not in bound and (obj.get("spec") or {}).get("nodeName"):
                        bound[name] = time.perf_counter()
                        if len(bound) >= expect:
                            done.set()
                            return
            except ApiError as e:
                log(f"watch: {e}")
                await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    sem = asyncio.Semaphore(concurrency)

    async def create(i: int) -> None:
        name = f"{scheduler[:8]}-{i:05d}"
        async with sem:
            await kc.post(f"/api/v1/namespaces/{NS}/pods", pod(name, scheduler))
            created[name] = time.perf_counter()

    t0 = time.perf_counter()
    await asyncio.gather(*(create(i) for i in range(n)))
    t_created = time.perf_counter()
    last = len(bound)
    while not done.is_set():  # stop at `expect` binds, or when binds stop coming
        try:
            await asyncio.wait_for(done.wait(), timeout=stall_s)
        except asyncio.TimeoutError:
            if len(bound) == last:
                log(f"{scheduler}: stalled at {len(bound)} of {expect}")
                break
            last = len(bound)
    watcher.cancel()
    lat = sorted(bound[k] - created[k] for k in bound if k in created)
    t_end = max(bound.values()) if bound else time.perf_counter()

    def p(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

    return {
        "bound": len(bound),
        "pods_s": len(bound) / (t_end - t0) if bound else 0.0,
        "create_pods_s": n / (t_created - t0),
        "p50_bind_s": p(0.50),
        "p99_bind_s": p(0.99),
        "wall_s": t_end - t0,
    }


async def bare_binder(kc: KubeClient, nodes: list[str], gpus: int, scheduler: str,
                      concurrency: int) -> None:
    """The ceiling: bind each new pod to the next node with a free GPU, nothing else."""
    free = {n: gpus for n in nodes}
    order = iter([n for n in nodes for _ in range(gpus)])
    sem = asyncio.Semaphore(concurrency)
    _, rv = await kc.list_all(f"/api/v1/namespaces/{NS}/pods", limit=1)

    async def bind(name: str, node: str) -> None:
        async with sem:
            await kc.post(f"/api/v1/namespaces/{NS}/pods/{name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})

    tasks = set()
    async for ev in kc.watch(f"/api/v1/namespaces/{NS}/pods", rv,
                             fieldSelector=f"spec.schedulerName={scheduler}"):
        obj = ev["object"]
        if ev["type"] != "ADDED" or (obj.get("spec") or {}).get("nodeName"):
            continue
        node = next(order, None)
        if node is None:
            continue
        free[node] -= 1
        t = asyncio.create_task(bind(obj["metadata"]["name"], node))
        tasks.add(t)
        t.add_done_callback(tasks.discard)


async def setup(info: ClusterInfo, nodes: int, gpus: int) -> list[str]:
    async with client_for(info) as kc:
        try:
            await kc.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NS}})
        except ApiError as e:
            if e.status != 409:
                raise
        await apply_crds(info)
        total = nodes * gpus
        for path, body in [
            (f"{GROUP}/departments", {"apiVersion": "gpupool.io/v1alpha1", "kind": "Department",
                                      "metadata": {"name": "bench"},
                                      "spec": {"quotas": {"default": {"gpus": total}}}}),
            (f"{GROUP}/projects", {"apiVersion": "gpupool.io/v1alpha1", "kind": "Project",
                                   "metadata": {"name": "bench"},
                                   "spec": {"department": "bench",
                                            "quotas": {"default": {"gpus": total}}}}),
        ]:
            try:
                await kc.post(path, body)
            except ApiError as e:
                if e.status != 409:
                    raise
        have = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
        if len(have) < nodes:
            log(f"creating {nodes - len(have)} kwok nodes")
            subprocess.run([str(script_path()), "nodes", "--dir", str(info.state_dir),
                            "--start", str(len(have)), "--count", str(nodes - len(have)),
                            "--gpus-per-node", str(gpus)], check=True)
        while True:
            items = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
            ready = [n["metadata"]["name"] for n in items if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions", []))]
            if len(ready) >= nodes:
                return sorted(ready)[:nodes]
            await asyncio.sleep(1)


def start_kube_scheduler(info: ClusterInfo, log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / "kube-scheduler.log", "wb")  # noqa: SIM115
    return subprocess.Popen([
        str(info.k8s_bin / "kube-scheduler"), f"--kubeconfig={info.kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
        f"--authentication-kubeconfig={info.kubeconfig}",
        f"--authorization-kubeconfig={info.kubeconfig}", "--profiling=false",
    ], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def start_gpupool(info: ClusterInfo, log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / "gpupool-scheduler.log", "wb")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "scheduler.k8s", "--kubeconfig",
                             str(info.kubeconfig), "--lease-name", "gpupool-bench", "-v"],
                            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def main_async(args: argparse.Namespace, info: ClusterInfo) -> dict:
    nodes = await setup(info, args.nodes, args.gpus_per_node)
    expect = min(args.pods, args.nodes * args.gpus_per_node)
    out: dict = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods,
                 "bindable_pods": expect}
    log_dir = info.state_dir / "logs"
    async with client_for(info, max_connections=args.create_concurrency + 8) as kc:
        await wait_empty(kc)
        if not args.skip_kube_scheduler:
            log("kube-scheduler run")
            ks = start_kube_scheduler(info, log_dir)
            try:
                r = await burst(kc, "default-scheduler", args.pods, expect,
                                args.create_concurrency, args.stall_s)
            finally:
                stop(ks)
            log(f"kube-scheduler: {r}")
            out.update({f"kube_scheduler_{k}": v for k, v in r.items()})
            await wait_empty(kc)

        log("gpupool-scheduler run")
        gp = start_gpupool(info, log_dir)
        try:
            await asyncio.sleep(args.warmup_s)  # it takes the Lease and syncs first
            r = await burst(kc, "gpupool", args.pods, expect, args.create_concurrency,
                            args.stall_s)
        finally:
            stop(gp)
        log(f"gpupool: {r}")
        out.update({f"gpupool_{k}": v for k, v in r.items()})
        await wait_empty(kc)

        log("ceiling run (bare binding loop)")
        async with client_for(info, max_connections=64) as kb:
            binder = asyncio.create_task(bare_binder(kb, nodes, args.gpus_per_node,
                                                     "bench-bare", 48))
            await asyncio.sleep(0.5)
            try:
                r = await burst(kc, "bench-bare", args.pods, expect, args.create_concurrency,
                                args.stall_s)
            finally:
                binder.cancel()
        log(f"ceiling: {r}")
        out.update({f"ceiling_{k}": v for k, v in r.items()})
        await wait_empty(kc)

    ks = out.get("kube_scheduler_pods_s")
    out["ratio"] = out["gpupool_pods_s"] / ks if ks else None
    out["gpupool_of_ceiling"] = out["gpupool_pods_s"] / out["ceiling_pods_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--create-concurrency", type=int, default=64)
    ap.add_argument("--stall-s", type=float, default=20.0,
                    help="end a run when no pod was bound for this long")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--skip-kube-scheduler", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)

    cluster = TestCluster(nodes=0, gpus_per_node=args.gpus_per_node)
    info = cluster.start()
    try:
        out = asyncio.run(main_async(args, info))
    finally:
        cluster.stop()
    if not args.json:
        for k in ("kube_scheduler_pods_s", "gpupool_pods_s", "ratio", "ceiling_pods_s",
                  "gpupool_of_ceiling", "gpupool_p99_bind_s", "kube_scheduler_p99_bind_s"):
            v = out.get(k)
            print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
