"""gpupool-scheduler side by side with KAI-Scheduler and kube-scheduler: one API server, the
same kwok nodes, the same work (bench/peers/workload.py translates one description per
scheduler), each scheduler in turn.

    python bench/peers [--nodes 500] [--pods 10000] [--small-nodes 16] [--json]
    make bench-peers

Scenarios (one JSON line and a table each; every scheduler's version and settings inside):
  reclaim      four queues with a quarter of the GPUs each; two borrow the third's idle
               quarter, which then asks for it: time until it is all bound, evictions, and
               evictions beyond what was needed
  fair_share   four queues with no quota and over-quota weights 1:1:2:4, each with a backlog
               of the whole cluster: Jain's index of GPUs held / deserved, sampled over time
  gangs        a 16-pod gang against a stream of single pods: time to bind it whole, and
               how long it was bound only in part
  fractions    0.25 and 0.5 GPU pods: GPUs they end up on, and time until all are bound
  throughput   a backlog of whole-GPU pods (--pods) on --nodes x 8 GPUs: pods bound per
               second (first bind to last) and CPU seconds of the scheduler per 1,000 pods,
               against the ceiling (a bare binding loop, bench/k8s_throughput.py's)
The first four run on the first --small-nodes nodes before the others are added; kube-scheduler
and the ceiling run only the throughput (they have no queues, gangs or fractions).
KAI-Scheduler v0.13.0 is built from its released source by scripts/build-peers (cached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

import scenarios  # noqa: E402
import schedulers  # noqa: E402
from scenarios import Bench, log  # noqa: E402
from workload import CEILING, GPUPOOL, KAI, KUBE, NS  # noqa: E402

from scheduler.kubernetes.testcluster import (  # noqa: E402
    ClusterInfo,
    TestCluster,
    apply_crds,
    client_for,
    script_path,
)

SCENARIOS = ("reclaim", "fair_share", "gangs", "fractions", "throughput")
QUEUED = (GPUPOOL, KAI)  # the schedulers with queues, gangs and fractions
LABELS = {GPUPOOL: "gpupool", KAI: "kai", KUBE: "kube_scheduler", CEILING: "ceiling"}


async def add_nodes(info: ClusterInfo, kc, count: int, gpus: int) -> list[str]:
    have = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
    if len(have) < count:
        subprocess.run([str(script_path()), "nodes", "--dir", str(info.state_dir), "--start",
                        str(len(have)), "--count", str(count - len(have)),
                        "--gpus-per-node", str(gpus)], check=True)
    while True:
        items = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
        ready = sorted(n["metadata"]["name"] for n in items if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n["status"].get("conditions", [])))
        if len(ready) >= count:
            return ready[:count]
        await asyncio.sleep(0.5)


def table(name: str, rows: dict[str, dict]) -> str:
    # per-sample series stay in the JSON line only
    cols = [k for k, v in next(iter(rows.values())).items()
            if k not in ("version", "args") and not isinstance(v, list)]
    out = [f"## {name}", "| scheduler | " + " | ".join(cols) + " |",
           "|---" * (len(cols) + 1) + "|"]
    for sched, r in rows.items():
        out.append(f"| {LABELS[sched]} | " + " | ".join(
            json.dumps(r.get(c)) if isinstance(r.get(c), dict) else str(r.get(c)) for c in cols) + " |")
    return "\n".join(out)


async def main_async(args: argparse.Namespace, info: ClusterInfo) -> list[dict]:
    await apply_crds(info)
    if KAI in args.schedulers:
        await apply_crds(info, schedulers.kai_dir() / "crds")
    results = []
    async with client_for(info, max_connections=96) as kc:
        for ns in (NS, schedulers.RESERVATION_NS, "kai-scale-adjust", "kai-scheduler"):
            await kc.ensure("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": ns}})
        small = [s for s in args.scenarios if s != "throughput"]
        nodes = await add_nodes(info, kc, args.small_nodes, args.gpus_per_node)
        b = Bench(kc, info, info.state_dir / "logs", nodes, args.gpus_per_node, args.stall_s)
        for name in small:
            rows = {}
            for sched in [s for s in args.schedulers if s in QUEUED]:
                log(f"{name}: {sched}")
                fn = getattr(scenarios, name)
                kw = {"quarters": args.small_nodes * 4, "halves": args.small_nodes * 2} \
                    if name == "fractions" else {}
                rows[sched] = {**schedulers.settings(sched), **await fn(b, sched, **kw)}
                log(f"{name}: {sched}: {rows[sched]}")
            results.append({"scenario": name, "nodes": len(nodes),
                            "gpus_per_node": args.gpus_per_node, "schedulers": rows})
        if "throughput" in args.scenarios:
            b.nodes = await add_nodes(info, kc, args.nodes, args.gpus_per_node)
            rows = {}
            for sched in args.schedulers + [CEILING]:
                log(f"throughput: {sched}")
                rows[sched] = {**schedulers.settings(sched),
                               **await scenarios.throughput(b, sched, args.pods)}
                log(f"throughput: {sched}: {rows[sched]}")
            ceiling = rows[CEILING]["pods_s"]
            for r in rows.values():
                r["of_ceiling"] = round(r["pods_s"] / ceiling, 3) if ceiling else None
            if rows.get(GPUPOOL, {}).get("pods_s") and rows.get(KAI, {}).get("pods_s"):
                rows[GPUPOOL]["vs_kai"] = round(rows[GPUPOOL]["pods_s"] / rows[KAI]["pods_s"], 2)
            results.append({"scenario": "throughput", "nodes": args.nodes,
                            "gpus_per_node": args.gpus_per_node, "schedulers": rows})
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/peers", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500, help="nodes for the throughput")
    ap.add_argument("--pods", type=int, default=10000, help="pods of the throughput backlog")
    ap.add_argument("--small-nodes", type=int, default=16,
                    help="nodes for reclaim, fair share, gangs and fractions (at least 4)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--stall-s", type=float, default=30.0,
                    help="give a scenario up when no pod changed for this long")
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--schedulers", nargs="+", choices=(GPUPOOL, KAI, KUBE),
                    default=[GPUPOOL, KAI, KUBE])
    ap.add_argument("--json", action="store_true", help="only the JSON lines on stdout")
    ap.add_argument("--state-dir", type=Path, help="keep the cluster's state and every "
                    "scheduler's log here (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    for flag, v, lo in (("--nodes", args.nodes, 1), ("--pods", args.pods, 1),
                        ("--small-nodes", args.small_nodes, 4), ("--gpus-per-node", args.gpus_per_node, 4)):
        if v < lo:
            ap.error(f"{flag} must be an integer >= {lo}, got {v}")
    if args.small_nodes > args.nodes:
        ap.error(f"--small-nodes must be at most --nodes ({args.nodes}), got {args.small_nodes}")
    if args.state_dir:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    cluster = TestCluster(nodes=0, gpus_per_node=args.gpus_per_node, state_dir=args.state_dir)
    info = cluster.start()
    t0 = time.time()
    try:
        results = asyncio.run(main_async(args, info))
    finally:
        cluster.stop()
    for r in results:
        r.update({"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d", time.gmtime(t0))})
        if not args.json:
            print(table(r["scenario"], r["schedulers"]))
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
