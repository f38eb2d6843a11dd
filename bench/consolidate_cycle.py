"""Time a scheduling cycle that consolidates, at the scale of ``scheduler_cycle.py``.

The cluster and running work are ``scheduler_cycle.build``'s (4,000 nodes x 8 GPUs, 140,000
running pods), less every tenth running pod, so that free GPUs lie scattered over the nodes,
and with two thirds of each odd-numbered project's pods given to the project before it, so
that half the projects hold more than their quota. The pending work is 50 single-pod 8-GPU
trainings, one per project, which no node has room for. The cycle's consolidate action then
looks for a node to open for them: the cost of the action where it runs.
``scheduler_cycle.py`` never reaches it (its binds take every free GPU first).

Per setting of ``SchedulerConfig.consolidate_in_quota`` (``off`` moves only
work over its project's quota; ``on``, the default, may also move trainings in quota, 140,000 pods here):
``decide_s`` (the whole ``decide``), ``consolidate_s`` (the action), ``moved`` (workloads) and
``decisions_sha`` (binds, evictions and reasons), each time the least of ``--repeat`` runs
in fresh processes.

``--baseline REV`` measures git revision REV's scheduler in the same run, alternately (as
``scheduler_cycle.py --baseline``): ``baseline``, ``ratio`` (baseline / this tree) and
``same_decisions``.

    python bench/consolidate_cycle.py [--json] [--scale 1.0] [--repeat 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scheduler_cycle as sc  # noqa: E402  (imports the scheduler of SCHEDULER_CYCLE_TREE)

SETTINGS = ("off", "on")
BIG = 50  # pending 8-GPU trainings, one per project


def measure(scale: float, setting: str) -> dict:
    from scheduler.core import decide
    from scheduler.model import Kind, PodDemand, Workload
    from scheduler.snapshot import SchedulerConfig, Snapshot

    nodes, depts, projects, running, _ = sc.build(scale)
    running = [w for i, w in enumerate(running) if i % 10]
    for i, w in enumerate(running):
        p = int(w.project.rsplit("-", 1)[1])
        if p % 2 and i % 3:
            running[i] = dataclasses.replace(w, project=f"proj-{p - 1:02d}")
    cfg = SchedulerConfig(consolidate_in_quota=setting == "on")
    snap = Snapshot.build(nodes, depts, projects, running, cfg)
    _ = snap.arrays  # the persistent capacity view exists before the measured cycle
    for i in range(BIG):
        snap.upsert_workload(Workload(
            f"big-{i:02d}", f"proj-{i % sc.PROJECTS:02d}", Kind.TRAINING,
            PodDemand(gpus=8, cpu_milli=32000, memory_mib=131072), submit_time=2e5 + i))
    t0 = time.perf_counter()
    d = decide(snap)
    decide_s = time.perf_counter() - t0
    return {
        "decide_s": decide_s,
        "consolidate_s": d.timings.get("consolidate_s", 0.0),
        "moved": sum(1 for e in d.evictions if e.reason.startswith("moved")),
        "evictions": len(d.evictions),
        "decisions_sha": sc.decisions_sha(d),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def run_worker(tree: Path, scale: float, setting: str) -> dict:
    env = {**os.environ, sc.TREE_ENV: str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", setting, "--scale", repr(scale)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"consolidate_cycle: the run ({setting}) of {tree} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def least(runs: list[dict]) -> dict:
    digests = {r["decisions_sha"] for r in runs}
    if len(digests) != 1:
        raise SystemExit(f"consolidate_cycle: runs of one tree and setting decided differently: {sorted(digests)}")
    out = dict(min(runs, key=lambda r: r["decide_s"]))
    for k in ("decide_s", "consolidate_s"):
        out[k] = round(min(r[k] for r in runs), 4)
    out["decide_s_runs"] = [round(r["decide_s"], 4) for r in runs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size to build")
    ap.add_argument("--repeat", type=int, default=3, help="runs per setting (and tree); the least is kept")
    ap.add_argument("--baseline", default="", help="git revision to time in the same run, alternately")
    ap.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 0 < args.scale <= 4:
        raise SystemExit(f"consolidate_cycle: --scale must be a number in (0, 4], got {args.scale!r}")
    if args.repeat < 1:
        raise SystemExit(f"consolidate_cycle: --repeat must be an integer >= 1, got {args.repeat!r}")
    if args.worker:
        print(json.dumps(measure(args.scale, args.worker)))
        return
    trees = {"this": sc.REPO}
    if args.baseline:
        trees["baseline"] = sc.checkout(args.baseline)
    runs: dict[str, dict[str, list[dict]]] = {t: {s: [] for s in SETTINGS} for t in trees}
    try:
        for i in range(args.repeat):
            for setting in SETTINGS:
                for t, tree in sorted(trees.items(), reverse=bool(i % 2)):
                    runs[t][setting].append(run_worker(tree, args.scale, setting))
    finally:
        if args.baseline:
            sc.remove_checkout(trees["baseline"])
    out: dict = {"scale": args.scale, "repeat": args.repeat, "pending_8_gpu": BIG,
                 **{s: least(r) for s, r in runs["this"].items()}}
    if args.baseline:
        base = {s: least(r) for s, r in runs["baseline"].items()}
        out["baseline"] = {"rev": args.baseline, **base}
        out["ratio"] = {f"{k}_{s}": round(base[s][k] / out[s][k], 2)
                        for s in SETTINGS for k in ("decide_s", "consolidate_s") if out[s][k]}
        out["same_decisions"] = all(base[s]["decisions_sha"] == out[s]["decisions_sha"] for s in SETTINGS)
    if not args.json:
        for k, v in out.items():
            print(f"{k:>16}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
