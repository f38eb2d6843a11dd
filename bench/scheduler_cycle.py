"""Time one full scheduling cycle at KAI-Scheduler's published scale (their issue 315).

4,000 nodes x 8 GPUs, 140,000 running pods (CPU-only, fractional and whole-GPU, holding
about 90% of the GPUs), 10,000 pending workloads across 50 projects in 5 departments.
A cycle = the snapshot update for the events since the last cycle (1% of the running
pods end, 1% new running, the pending set) + ``decide``. Also at 1/4 and 1/2 scale, so
growth can be seen. Anchor: KAI-Scheduler 2.35-2.51 s per cycle; target here < 1.0 s.
Wall time (``cycle_s``) and this process's CPU time for the same span (``cycle_cpu_s``) are
both printed, with the load average: on a shared machine wall time also measures the others.
``action_s``: the full-scale cycle's time per action (``scheduler.actions.ACTIONS``).

    python bench/scheduler_cycle.py [--json] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core import decide  # noqa: E402
from scheduler.model import (  # noqa: E402
    GPU,
    Department,
    Kind,
    Node,
    PodDemand,
    PodPlacement,
    Project,
    Quota,
    State,
    Workload,
)
from scheduler.snapshot import SchedulerConfig, Snapshot  # noqa: E402

DEPTS, PROJECTS = 5, 50


def build(scale: float, seed: int = 7):
    rnd = random.Random(seed)
    n_nodes = int(4000 * scale)
    n_running, n_pending = int(140_000 * scale), int(10_000 * scale)
    nodes = [
        Node(f"node-{i:05d}", [GPU(g, "H100", 81920) for g in range(8)], 256_000, 2_048_000, labels={"rack": f"r{i // 32}"})
        for i in range(n_nodes)
    ]
    total_gpus = 8 * n_nodes
    depts = [Department(f"dept-{d}") for d in range(DEPTS)]
    projects = [
        Project(f"proj-{p:02d}", f"dept-{p % DEPTS}", {"default": Quota(total_gpus / PROJECTS, 1 + p % 3)})
        for p in range(PROJECTS)
    ]
    running: list[Workload] = []

    def run(demand: PodDemand, node: Node, gpus: tuple[int, ...], milli: int) -> None:
        i = len(running)
        running.append(
            Workload(
                f"run-{i:06d}", f"proj-{rnd.randrange(PROJECTS):02d}", Kind.TRAINING, demand,
                submit_time=rnd.random() * 1e5, state=State.RUNNING,
                placement=(PodPlacement(node.name, gpus, milli),),
            )
        )

    # Fill 90% of the GPUs: half whole GPUs, half packed with fractions; then CPU-only pods.
    for node in nodes:
        for g in range(8):
            r = rnd.random()
            if r < 0.45:
                run(PodDemand(gpus=1, cpu_milli=2000, memory_mib=8192), node, (g,), 1000)
            elif r < 0.9:
                left = 1000
                while left >= 250 and len(running) < n_running:
                    f = rnd.choice((250, 250, 500)) if left >= 500 else 250
                    run(PodDemand(gpu_fraction=f / 1000, cpu_milli=1000, memory_mib=4096), node, (g,), f)
                    left -= f
    while len(running) < n_running:
        run(PodDemand(cpu_milli=500, memory_mib=1024), nodes[rnd.randrange(n_nodes)], (), 0)
    shapes = [
        PodDemand(gpus=1, cpu_milli=4000, memory_mib=16384),
        PodDemand(gpus=2, cpu_milli=8000, memory_mib=32768),
        PodDemand(gpus=8, cpu_milli=32000, memory_mib=131072),
        PodDemand(gpu_fraction=0.5, cpu_milli=2000, memory_mib=8192),
        PodDemand(gpu_fraction=0.25, cpu_milli=1000, memory_mib=4096),
        PodDemand(cpu_milli=1000, memory_mib=2048),
    ]
    pending = []
    for i in range(n_pending):
        kind = rnd.choice((Kind.TRAINING, Kind.TRAINING, Kind.TRAINING, Kind.WORKSPACE, Kind.INFERENCE))
        pods = 4 if rnd.random() < 0.02 else 1
        pending.append(
            Workload(
                f"pend-{i:05d}", f"proj-{rnd.randrange(PROJECTS):02d}", kind, rnd.choice(shapes),
                pods=pods, submit_time=1e5 + i,
            )
        )
    return nodes, depts, projects, running, pending


def decisions_sha(d) -> str:
    """A digest of what a cycle decided (binds, evictions, pending reasons and positions), so
    that a speed change can be checked to decide exactly the same."""
    h = hashlib.sha256()
    for b in d.binds:
        h.update(repr((b.workload, b.pods, b.over_quota)).encode())
    for e in d.evictions:
        h.update(repr((e.workload, e.reason, e.grace_period_s)).encode())
    for p in d.pending:
        h.update(repr((p.workload, p.reason, p.queue_position)).encode())
    h.update(repr(sorted(d.fair_share_milli.items())).encode())
    return h.hexdigest()[:16]


def measure(scale: float, policy: str = "gpupool") -> dict:
    nodes, depts, projects, running, pending = build(scale)
    snap = Snapshot.build(nodes, depts, projects, running[: len(running) * 99 // 100], SchedulerConfig(policy=policy))
    _ = snap.arrays  # the persistent capacity view exists before the measured cycle
    # Events since the last cycle: 1% of running pods end, 1% start, the pending set arrives.
    t0, c0 = time.perf_counter(), time.process_time()
    for w in running[: len(running) // 100]:
        snap.remove_workload(w.name)
    for w in running[len(running) * 99 // 100 :]:
        snap.upsert_workload(w)
    for w in pending:
        snap.upsert_workload(w)
    update_s = time.perf_counter() - t0
    d = decide(snap)
    cpu_s = time.process_time() - c0  # this process's CPU: steadier than wall on a shared machine
    snapshot_s = update_s + d.timings["snapshot_s"]
    actions_s = d.timings["actions_s"]
    return {
        "cycle_s": snapshot_s + actions_s,
        "cycle_cpu_s": cpu_s,
        "snapshot_s": snapshot_s,
        "actions_s": actions_s,
        "binds": len(d.binds),
        "evictions": len(d.evictions),
        "pending_left": len(d.pending),
        "running_pods": len(running),
        "pending_workloads": len(pending),
        "nodes": len(nodes),
        "decisions_sha": decisions_sha(d),
        # Each action of the cycle (and each way of making room, inside make_room_s).
        "action_s": {k: v for k, v in d.timings.items() if k not in ("snapshot_s", "actions_s")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size to build")
    ap.add_argument("--policy", default="gpupool", help="placement policy (gpupool, tightpack, fgd, bestfit)")
    args = ap.parse_args()
    cpu0 = time.process_time()
    full = measure(args.scale, args.policy)
    full_cpu_s = time.process_time() - cpu0
    quarter = measure(args.scale / 4, args.policy)
    half = measure(args.scale / 2, args.policy)
    out = {
        "policy": args.policy,
        "cycle_s": round(full["cycle_s"], 4),
        "snapshot_s": round(full["snapshot_s"], 4),
        "actions_s": round(full["actions_s"], 4),
        "cycle_s_quarter": round(quarter["cycle_s"], 4),
        "cycle_s_half": round(half["cycle_s"], 4),
        "cycle_cpu_s": round(full["cycle_cpu_s"], 4),
        "cycle_cpu_s_quarter": round(quarter["cycle_cpu_s"], 4),
        "cycle_cpu_s_half": round(half["cycle_cpu_s"], 4),
        "kai_anchor_s": 2.35,
        "speedup_vs_kai": round(2.35 / full["cycle_s"], 2),
        "binds": full["binds"],
        "evictions": full["evictions"],
        "pending_left": full["pending_left"],
        "running_pods": full["running_pods"],
        "nodes": full["nodes"],
        "decisions_sha": full["decisions_sha"],
        "decisions_sha_quarter": quarter["decisions_sha"],
        "decisions_sha_half": half["decisions_sha"],
        "action_s": {k: round(v, 4) for k, v in full["action_s"].items()},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "build_and_cycle_cpu_s": round(full_cpu_s, 2),
    }
    if not args.json:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
