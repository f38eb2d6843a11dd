"""Time a scheduling cycle that makes a mass fair-share reclaim, at the scale of
``scheduler_cycle.py``.

The cluster and running work are ``scheduler_cycle.build``'s (4,000 nodes x 8 GPUs, 140,000
running pods holding about 90% of the GPUs). Every project's quota is 40% of an equal split
of the GPUs, so 60% of the cluster is shared by fair share. Each project but two holds a
little more than its quota (its running pods up to 105% of it); two projects (``proj-00``
and ``proj-02``) hold all the other running work, far above their fair share. The 10,000
pending workloads (``build``'s, all trainings, which may go over quota) belong to the 48
other projects: each is over its quota and below its fair share, so once the free GPUs are
gone the make-room action reclaims from the two for fair share, hundreds of evictions in
one cycle. The cycle is the snapshot update (1% of the running pods end, 1% start, the
pending set arrives) plus ``decide``, as in ``scheduler_cycle.py``.

It prints ``cycle_s`` (wall: update plus ``decide``), ``cycle_cpu_s`` (this process's CPU
time for the same span), ``fair_share_reclaim_s`` (the make-room time of fair-share
reclaim), ``evictions`` (and ``evictions_by_cause``), ``ms_per_eviction`` (fair-share
reclaim's time per eviction), the cycle's actions (``action_s``) and ``decisions_sha``
(binds, evictions, reasons and fair shares: a speed change must leave it as it was), each
time the least of ``--repeat`` runs in fresh processes.

``--baseline REV`` measures git revision REV's scheduler in the same run, alternately (as
``scheduler_cycle.py --baseline``): ``baseline``, ``ratio`` (baseline / this tree) and
``same_decisions``.

    python bench/reclaim_cycle.py [--json] [--scale 1.0] [--repeat 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scheduler_cycle as sc  # noqa: E402  (imports the scheduler of SCHEDULER_CYCLE_TREE)

HOGS = ("proj-00", "proj-02")
QUOTA_SHARE = 0.4  # each project's quota, of an equal split of the GPUs
HELD = 1.05  # each other project's running work, of its quota
TIMES = ("cycle_s", "cycle_cpu_s", "fair_share_reclaim_s")


def build(scale: float):
    """``scheduler_cycle.build``'s cluster and work, reshaped as the module docstring says."""
    from scheduler.model import Kind

    nodes, depts, projects, running, pending = sc.build(scale)
    quota = QUOTA_SHARE * 8 * len(nodes) / sc.PROJECTS
    projects = [
        dataclasses.replace(p, quotas={k: dataclasses.replace(q, gpus=quota) for k, q in p.quotas.items()})
        for p in projects
    ]
    held: collections.Counter[str] = collections.Counter()
    reshaped = []
    for w in running:
        gpus = sum(len(pp.gpu_indices) * pp.gpu_milli for pp in w.placement) / 1000
        if w.project not in HOGS and held[w.project] < HELD * quota:
            held[w.project] += gpus
            reshaped.append(w)
        else:
            reshaped.append(dataclasses.replace(w, project=HOGS[len(reshaped) % 2]))
    pending = [
        dataclasses.replace(
            w, kind=Kind.TRAINING, project=w.project if w.project not in HOGS else f"proj-{int(w.project[-2:]) + 1:02d}"
        )
        for w in pending
    ]
    return nodes, depts, projects, reshaped, pending


def measure(scale: float) -> dict:
    from scheduler.core import decide
    from scheduler.snapshot import SchedulerConfig, Snapshot

    nodes, depts, projects, running, pending = build(scale)
    snap = Snapshot.build(nodes, depts, projects, running[: len(running) * 99 // 100], SchedulerConfig())
    _ = snap.arrays  # the persistent capacity view exists before the measured cycle
    load = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    for w in running[: len(running) // 100]:
        snap.remove_workload(w.name)
    for w in running[len(running) * 99 // 100 :]:
        snap.upsert_workload(w)
    for w in pending:
        snap.upsert_workload(w)
    d = decide(snap)
    cycle_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    gc.collect()
    fs = d.timings.get("make_room.fair_share_reclaim_s", 0.0)
    by_cause = collections.Counter(e.cause.value for e in d.evictions)
    return {
        "cycle_s": cycle_s,
        "cycle_cpu_s": cpu_s,
        "fair_share_reclaim_s": fs,
        "evictions": len(d.evictions),
        "evictions_by_cause": dict(sorted(by_cause.items())),
        "ms_per_eviction": round(1000 * fs / max(1, by_cause.get("fair share", 0)), 3),
        "binds": len(d.binds),
        "pending_left": len(d.pending),
        "action_s": {k: round(v, 4) for k, v in d.timings.items() if k != "snapshot_s"},
        "decisions_sha": sc.decisions_sha(d),
        "loadavg": [round(x, 2) for x in load],
    }


def run_worker(tree: Path, scale: float) -> dict:
    env = {**os.environ, sc.TREE_ENV: str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--scale", repr(scale)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"reclaim_cycle: the run of {tree} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def least(runs: list[dict]) -> dict:
    digests = {r["decisions_sha"] for r in runs}
    if len(digests) != 1:
        raise SystemExit(f"reclaim_cycle: runs of one tree decided differently: {sorted(digests)}")
    out = dict(min(runs, key=lambda r: r["cycle_s"]))
    for k in TIMES:
        out[k] = round(min(r[k] for r in runs), 4)
    out["ms_per_eviction"] = round(1000 * out["fair_share_reclaim_s"] / max(1, out["evictions_by_cause"].get("fair share", 0)), 3)
    out["cycle_s_runs"] = [round(r["cycle_s"], 4) for r in runs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size to build")
    ap.add_argument("--repeat", type=int, default=3, help="runs (per tree); the least is kept")
    ap.add_argument("--baseline", default="", help="git revision to time in the same run, alternately")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 0 < args.scale <= 4:
        raise SystemExit(f"reclaim_cycle: --scale must be a number in (0, 4], got {args.scale!r}")
    if args.repeat < 1:
        raise SystemExit(f"reclaim_cycle: --repeat must be an integer >= 1, got {args.repeat!r}")
    if args.worker:
        print(json.dumps(measure(args.scale)))
        return
    trees = {"this": sc.REPO}
    if args.baseline:
        trees["baseline"] = sc.checkout(args.baseline)
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    try:
        for i in range(args.repeat):
            for t, tree in sorted(trees.items(), reverse=bool(i % 2)):
                runs[t].append(run_worker(tree, args.scale))
    finally:
        if args.baseline:
            sc.remove_checkout(trees["baseline"])
    out: dict = {"scale": args.scale, "repeat": args.repeat, **least(runs["this"])}
    if args.baseline:
        base = least(runs["baseline"])
        out["baseline"] = {"rev": args.baseline, **base}
        out["ratio"] = {k: round(base[k] / out[k], 2) for k in TIMES if out[k]}
        out["same_decisions"] = base["decisions_sha"] == out["decisions_sha"]
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not args.json:
        for k, v in out.items():
            print(f"{k:>22}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
