"""Micro-benchmark: cost of one ``place()`` call of a placement policy at the scheduler
benchmark's size (4,000 nodes x 8 GPUs, 10,000 pods), as the core calls it: a fresh copy
of the arrays, ``prepare`` with the demand mix, then ``eligible`` + ``place`` + ``take`` per
pod. Only ``place`` is timed, in wall and in CPU time (``place_cpu_us_*``). Prints a readable line per policy, and with ``--json`` one JSON
object as the last line (``place_us_p50``, ``place_us_mean`` of the first policy given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.cluster import ClusterArrays  # noqa: E402
from scheduler.model import GPU, Node, PodDemand  # noqa: E402
from scheduler.placement import get_policy  # noqa: E402

# An openb-like mix: CPU per pod varies, so there are many distinct demands.
SHAPES = [
    (0.40, "whole", 1), (0.15, "frac", 500), (0.12, "frac", 810), (0.06, "frac", 250),
    (0.03, "whole", 2), (0.02, "whole", 4), (0.02, "whole", 8), (0.20, "cpu", 0),
]


def demands(n: int, rng: np.random.Generator) -> list[PodDemand]:
    probs = np.array([s[0] for s in SHAPES])
    out = []
    for k in rng.choice(len(SHAPES), size=n, p=probs / probs.sum()):
        _, kind, v = SHAPES[k]
        cpu = int(rng.choice([2000, 4000, 6000, 8000, 12000]))
        if kind == "whole":
            out.append(PodDemand(gpus=v, cpu_milli=cpu * v, memory_mib=8192))
        elif kind == "frac":
            out.append(PodDemand(gpu_fraction=v / 1000, cpu_milli=cpu, memory_mib=4096))
        else:
            out.append(PodDemand(cpu_milli=cpu, memory_mib=4096))
    return out


def bench(policy: str, nodes: int, gpus: int, pods: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cluster = [Node(f"n{i:05d}", [GPU(j, "A100", 81920) for j in range(gpus)], cpu_milli=128_000, memory_mib=1 << 20) for i in range(nodes)]
    base = ClusterArrays.from_nodes(cluster)
    for i in range(0, nodes, 3):  # a third of the nodes already partly busy
        base.take(i, (0,), int(rng.choice([300, 500, 1000])), 8000, 8192)
    ds = demands(pods, rng)
    arrays = base.copy()
    pol = get_policy(policy)
    t0 = time.perf_counter()
    if hasattr(pol, "prepare"):
        pol.prepare(ds)
    prepare_s = time.perf_counter() - t0
    times = np.empty(len(ds))
    cpu = np.empty(len(ds))
    placed = 0
    for k, d in enumerate(ds):
        mask = arrays.eligible(None, (), d)
        t, c0 = time.perf_counter(), time.process_time()
        c = pol.place(arrays, mask, d)
        times[k] = time.perf_counter() - t
        cpu[k] = time.process_time() - c0
        if c is not None:
            arrays.take(c.node, c.gpus, c.milli, d.cpu_milli, d.memory_mib)
            placed += 1
    return {
        "policy": policy,
        "nodes": nodes,
        "gpus_per_node": gpus,
        "pods": pods,
        "placed": placed,
        "place_us_p50": float(np.median(times) * 1e6),
        "place_us_mean": float(times.mean() * 1e6),
        "place_us_p99": float(np.percentile(times, 99) * 1e6),
        "place_total_s": float(times.sum()),
        # CPU time of this process for the same calls: on a shared machine wall time also
        # measures the others' load.
        "place_cpu_us_p50": float(np.median(cpu) * 1e6),
        "place_cpu_us_mean": float(cpu.mean() * 1e6),
        "place_cpu_total_s": float(cpu.sum()),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "prepare_s": prepare_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="gpupool", help="comma list; the first one is the JSON result")
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [bench(p, args.nodes, args.gpus, args.pods, args.seed) for p in args.policy.split(",")]
    for r in results:
        print(
            f"{r['policy']:<10} {r['nodes']}x{r['gpus_per_node']}, {r['pods']} pods ({r['placed']} placed): "
            f"place p50 {r['place_us_p50']:.1f} us, mean {r['place_us_mean']:.1f} us, p99 {r['place_us_p99']:.1f} us, "
            f"total {r['place_total_s']:.2f} s; CPU p50 {r['place_cpu_us_p50']:.1f} us, "
            f"mean {r['place_cpu_us_mean']:.1f} us (load {r['loadavg'][0]})"
        )
    if args.json:
        print(json.dumps(results[0] | {"all": results[1:]} if len(results) > 1 else results[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
