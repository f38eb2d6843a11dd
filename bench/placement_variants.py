"""Placement on variants of the openb trace: gpupool against FGD (and any other policy) on a
sweep of drawn variants (``scheduler/sim/variants.py``), seeds each.

The sweep, by default: GPU-model share 0, 1/3, 2/3 (of the GPU pods; models drawn uniformly
from those the cluster has nodes of for the pod) x multi-GPU share low (0.02) and high
(0.10) x fraction share low (0.30) and high (0.60); 3 seeds (42-44) each, each seed drawing
its own variant and shuffling the pods as ``gpupool-sim placement`` does. ``--seeds 45-47``
runs held-out seeds. Prints one line per variant and, with ``--json``, one JSON object as
the last line: per variant the mean allocation of each policy, each seed's, and
``gpupool_minus_fgd``; then ``variants``, ``at_or_above_fgd`` (how many variants gpupool's
mean is at least FGD's on) and ``worst_gap``.

    python bench/placement_variants.py --json [--seeds 42-44] [--jobs 2]
        [--models 0,0.3333,0.6667] [--multi 0.02,0.10] [--fractions 0.30,0.60]
        [--policies gpupool,fgd] [--model-weight uniform|gpus] [--max-nodes N --max-pods N]
        [--keep-off-max X]   (gpupool's scarce-model tie-break scale; 0 turns it off)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.placement.gpupool import GpupoolPolicy  # noqa: E402
from scheduler.sim.placement import run_seed  # noqa: E402
from scheduler.sim.trace import default_trace_dir, load_nodes, load_pods  # noqa: E402
from scheduler.sim.variants import TraceVariant, reshape  # noqa: E402

_TRACE: dict = {}


def _trace(nodes_csv: str, pods_csv: str, max_nodes: int, max_pods: int):
    key = (nodes_csv, pods_csv, max_nodes, max_pods)
    if key not in _TRACE:
        nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
        _TRACE[key] = (nodes[:max_nodes] if max_nodes else nodes, pods[:max_pods] if max_pods else pods)
    return _TRACE[key]


def one(job: tuple) -> tuple:
    """One variant, seed and policy: (variant label, seed, policy, allocation %, seconds)."""
    variant, seed, policy, trace, keep_off = job
    if keep_off is not None:
        GpupoolPolicy.KEEP_OFF_MAX = keep_off
    nodes, pods = _trace(*trace)
    t0 = time.perf_counter()
    r = run_seed(nodes, reshape(pods, nodes, variant, seed), policy, seed)
    return variant.label(), seed, policy, r.allocation_pct, time.perf_counter() - t0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--seeds", default="42-44", help="LO-HI or a comma list (default 42-44)")
    ap.add_argument("--models", default="0,0.3333,0.6667", help="GPU-model shares")
    ap.add_argument("--multi", default="0.02,0.10", help="multi-GPU shares")
    ap.add_argument("--fractions", default="0.30,0.60", help="fraction shares")
    ap.add_argument("--model-weight", default="uniform", help="uniform or gpus (variants.TraceVariant)")
    ap.add_argument("--policies", default="gpupool,fgd")
    ap.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--nodes", default="", help="node list CSV (default: the openb GPU nodes)")
    ap.add_argument("--pods", default="", help="pod list CSV (default: the openb default pods)")
    ap.add_argument("--keep-off-max", type=float, default=None,
                    help="gpupool's GpupoolPolicy.KEEP_OFF_MAX for this run (0: the scarce-model rule off)")
    ap.add_argument("--max-nodes", type=int, default=0)
    ap.add_argument("--max-pods", type=int, default=0)
    args = ap.parse_args()
    d = default_trace_dir()
    trace = (args.nodes or str(d / "openb_node_list_gpu_node.csv"), args.pods or str(d / "openb_pod_list_default.csv"),
             args.max_nodes, args.max_pods)
    seeds, policies = _seeds(args.seeds), [p for p in args.policies.split(",") if p]
    variants = [
        TraceVariant(model_share=m, multi_gpu_share=g, fraction_share=f, model_weight=args.model_weight)
        for m, g, f in itertools.product(_floats(args.models), _floats(args.multi), _floats(args.fractions))
    ]
    jobs = [(v, s, p, trace, args.keep_off_max) for v in variants for s in seeds for p in policies]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            results = list(ex.map(one, jobs))
    else:
        results = [one(j) for j in jobs]
    got = {(label, seed, pol): pct for label, seed, pol, pct, _ in results}
    rows = []
    for v in variants:
        label = v.label()
        row: dict = {"variant": label, **v.to_json()}
        for p in policies:
            per = [got[(label, s, p)] for s in seeds]
            row[p] = round(statistics.fmean(per), 3)
            row[f"{p}_per_seed"] = [round(x, 2) for x in per]
        if "gpupool" in policies and "fgd" in policies:
            row["gpupool_minus_fgd"] = round(row["gpupool"] - row["fgd"], 3)
        rows.append(row)
        if not args.json or sys.stdout.isatty():
            print(f"{label:<22} " + "  ".join(f"{p} {row[p]:6.2f}" for p in policies)
                  + (f"  gap {row['gpupool_minus_fgd']:+.2f}" if "gpupool_minus_fgd" in row else ""), flush=True)
    out: dict = {"seeds": seeds, "policies": policies, "model_weight": args.model_weight, "rows": rows,
                 "keep_off_max": GpupoolPolicy.KEEP_OFF_MAX if args.keep_off_max is None else args.keep_off_max,
                 "variants": len(rows), "cpu_s": round(sum(r[4] for r in results), 1),
                 "wall_s": round(time.perf_counter() - t0, 1), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    gaps = [r["gpupool_minus_fgd"] for r in rows if "gpupool_minus_fgd" in r]
    if gaps:
        out["at_or_above_fgd"] = sum(1 for g in gaps if g >= 0)
        out["worst_gap"] = min(gaps)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
