"""Time one full scheduling cycle at KAI-Scheduler's published scale (their issue 315).

4,000 nodes x 8 GPUs, 140,000 running pods (CPU-only, fractional and whole-GPU, holding
about 90% of the GPUs), 10,000 pending workloads across 50 projects in 5 departments.
A cycle = the snapshot update for the events since the last cycle (1% of the running
pods end, 1% new running, the pending set) + ``decide``. Anchor: KAI-Scheduler 2.35-2.51 s
per cycle; target here < 1.0 s. Measured at 1/4, 1/2 and full scale, each in a fresh
process (so one scale's garbage does not fall into another's cycle), best of ``--repeat``.

Per scale: ``snapshot_s`` (the update plus ``decide``'s copy of the snapshot),
``actions_s`` (the rest of ``decide``: the decision actions), ``cycle_s`` (their sum, wall),
``cycle_cpu_s`` (this process's CPU time for the same span: on a shared machine wall time
also measures the others; ``update_cpu_s`` and ``decide_cpu_s`` its two parts), each the
least of the runs, the load average at the start of the fastest, ``gc_in_cycle_s`` (time the
cyclic garbage collector took inside the span), ``gc_full_s`` (CPU time of one full
collection with the snapshot alive: the pause a collection costs wherever it falls) and
``gc_tracked`` (objects it walks), and ``decisions_sha`` (a digest of the decisions). Full
scale under the plain names, the others with ``_quarter`` / ``_half`` after them; and
``action_s``, the full-scale cycle's time per action where the scheduler times each.

``--baseline REV`` also measures the scheduler of git revision REV in the same run: it is
checked out with ``git worktree add --detach`` into a temporary folder (removed after) and
timed by this same script (same cluster, same events, same timing) in subprocesses that
import that tree's ``scheduler``, alternating with this tree's, scale by scale. The JSON
then holds ``baseline`` (the same figures), ``ratio`` (baseline / this tree, per figure
and scale) and ``same_decisions`` (every scale's digests equal). REV's ``scheduler`` must
take the model this script builds and report ``timings["snapshot_s"]`` (any since 5438b4e).

``--consolidate-in-quota`` times this tree with ``SchedulerConfig.consolidate_in_quota`` on;
the baseline always runs with its tree's defaults, so ``--consolidate-in-quota --baseline
HEAD`` measures what the switch costs, in the same run.

    python bench/scheduler_cycle.py [--json] [--scale 1.0] [--policy gpupool] [--repeat 1]
    python bench/scheduler_cycle.py --json --repeat 3 --baseline main
    python bench/scheduler_cycle.py --json --repeat 3 --consolidate-in-quota --baseline HEAD
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A worker process times the scheduler of the tree named here (a baseline's checkout).
TREE_ENV = "SCHEDULER_CYCLE_TREE"
sys.path.insert(0, os.environ.get(TREE_ENV) or str(REPO))

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
SCALES = (("quarter", 0.25), ("half", 0.5), ("full", 1.0))
KAI_ANCHOR_S = 2.35


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


class _CollectorClock:
    """Time the cyclic garbage collector spends while it is installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds, self._t0 = 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0


def measure(scale: float, policy: str = "gpupool", consolidate_in_quota: bool = False) -> dict:
    cpu0 = time.process_time()
    nodes, depts, projects, running, pending = build(scale)
    # The switch is named only when on: a baseline tree older than it takes the defaults.
    cfg = SchedulerConfig(policy=policy, **({"consolidate_in_quota": True} if consolidate_in_quota else {}))
    snap = Snapshot.build(nodes, depts, projects, running[: len(running) * 99 // 100], cfg)
    _ = snap.arrays  # the persistent capacity view exists before the measured cycle
    clock = _CollectorClock()
    gc.callbacks.append(clock)
    load = os.getloadavg()
    # Events since the last cycle: 1% of running pods end, 1% start, the pending set arrives.
    t0, c0 = time.perf_counter(), time.process_time()
    for w in running[: len(running) // 100]:
        snap.remove_workload(w.name)
    for w in running[len(running) * 99 // 100 :]:
        snap.upsert_workload(w)
    for w in pending:
        snap.upsert_workload(w)
    t1, c1 = time.perf_counter(), time.process_time()
    d = decide(snap)
    t2 = time.perf_counter()
    cpu_s = time.process_time() - c0  # this process's CPU: steadier than wall on a shared machine
    gc.callbacks.remove(clock)
    copy_s = d.timings["snapshot_s"]  # decide's own copy of the snapshot, before any action
    snapshot_s = (t1 - t0) + copy_s
    actions_s = (t2 - t1) - copy_s
    gc_c0 = time.process_time()
    gc.collect()
    gc_full_s = time.process_time() - gc_c0
    return {
        "cycle_s": snapshot_s + actions_s,
        "snapshot_s": snapshot_s,
        "actions_s": actions_s,
        "cycle_cpu_s": cpu_s,
        "update_cpu_s": c1 - c0,
        "decide_cpu_s": cpu_s - (c1 - c0),
        "loadavg": [round(x, 2) for x in load],
        "gc_in_cycle_s": clock.seconds,
        "gc_full_s": gc_full_s,
        "gc_tracked": len(gc.get_objects()),
        "binds": len(d.binds),
        "evictions": len(d.evictions),
        "pending_left": len(d.pending),
        "running_pods": len(running),
        "pending_workloads": len(pending),
        "nodes": len(nodes),
        "decisions_sha": decisions_sha(d),
        # Each action of the cycle, where the scheduler times them one by one.
        "action_s": {k: v for k, v in d.timings.items() if k not in ("snapshot_s", "actions_s")},
        "build_and_cycle_cpu_s": time.process_time() - cpu0 - gc_full_s,
    }


def _fail(msg: str) -> SystemExit:
    return SystemExit(f"scheduler_cycle: {msg}")


def run_worker(tree: Path, scale: float, policy: str, consolidate_in_quota: bool = False) -> dict:
    """``measure`` in a fresh process that imports ``tree``'s scheduler."""
    env = {**os.environ, TREE_ENV: str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--scale", repr(scale), "--policy", policy]
    if consolidate_in_quota:
        cmd.append("--consolidate-in-quota")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise _fail(f"the run at scale {scale} of {tree} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


TIMES = ("cycle_s", "snapshot_s", "actions_s", "cycle_cpu_s", "update_cpu_s", "decide_cpu_s", "gc_in_cycle_s", "gc_full_s")


def best(runs: list[dict]) -> dict:
    """Each time the least of the runs (on a shared machine the others only ever add), the
    load average at the start of the fastest cycle, and every run's cycle_s."""
    digests = {r["decisions_sha"] for r in runs}
    if len(digests) != 1:
        raise _fail(f"runs of one tree and scale decided differently: {sorted(digests)}")
    out = dict(min(runs, key=lambda r: r["cycle_s"]))
    out.update({k: min(r[k] for r in runs) for k in TIMES})
    out["cycle_s_runs"] = [round(r["cycle_s"], 4) for r in runs]
    return out


def summary(by_scale: dict[str, dict], policy: str) -> dict:
    """The JSON figures: the full scale's under their plain names, others with a suffix."""
    full = by_scale["full"]
    out: dict = {"policy": policy}
    for key in TIMES:
        for name, r in by_scale.items():
            out[key if name == "full" else f"{key}_{name}"] = round(r[key], 4)
    for name, r in by_scale.items():
        suffix = "" if name == "full" else f"_{name}"
        out[f"cycle_s_runs{suffix}"] = r["cycle_s_runs"]
        out[f"gc_tracked{suffix}"] = r["gc_tracked"]
        out[f"loadavg{suffix}"] = r["loadavg"]
    out.update(
        kai_anchor_s=KAI_ANCHOR_S,
        speedup_vs_kai=round(KAI_ANCHOR_S / full["cycle_s"], 2),
        binds=full["binds"],
        evictions=full["evictions"],
        pending_left=full["pending_left"],
        running_pods=full["running_pods"],
        nodes=full["nodes"],
        build_and_cycle_cpu_s=round(full["build_and_cycle_cpu_s"], 2),
        action_s={k: round(v, 4) for k, v in full["action_s"].items()},  # of the fastest full-scale run
    )
    for name, r in by_scale.items():
        out["decisions_sha" if name == "full" else f"decisions_sha_{name}"] = r["decisions_sha"]
    return out


def checkout(rev: str) -> Path:
    """``rev`` in a temporary detached worktree of this repository."""
    where = Path(tempfile.mkdtemp(prefix="scheduler_cycle_baseline_")) / "tree"
    proc = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        where.parent.rmdir()
        last = (proc.stderr.strip().splitlines() or ["git failed"])[-1]
        raise _fail(f"--baseline {rev!r} cannot be checked out: {last}")
    return where


def remove_checkout(where: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)
    try:
        where.parent.rmdir()
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size to build")
    ap.add_argument("--policy", default="gpupool", help="placement policy (gpupool, tightpack, fgd, bestfit)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per scale (and tree); the best is kept")
    ap.add_argument("--baseline", default="", help="git revision to time in the same run, alternately")
    ap.add_argument("--consolidate-in-quota", action="store_true",
                    help="this tree's runs with SchedulerConfig.consolidate_in_quota on (the baseline's keep the defaults)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not (args.scale > 0 and args.scale <= 4):
        raise _fail(f"--scale must be a number in (0, 4], got {args.scale!r}")
    if args.repeat < 1:
        raise _fail(f"--repeat must be an integer >= 1, got {args.repeat!r}")
    if args.worker:
        print(json.dumps(measure(args.scale, args.policy, args.consolidate_in_quota)))
        return
    trees = {"this": REPO}
    if args.baseline:
        trees["baseline"] = checkout(args.baseline)
    runs: dict[str, dict[str, list[dict]]] = {t: {name: [] for name, _ in SCALES} for t in trees}
    try:
        for i in range(args.repeat):
            for name, frac in SCALES:
                # alternately, so both see the same machine; who goes first alternates too
                for t, tree in sorted(trees.items(), reverse=bool(i % 2)):
                    runs[t][name].append(run_worker(tree, args.scale * frac, args.policy,
                                                    args.consolidate_in_quota and t == "this"))
    finally:
        if args.baseline:
            remove_checkout(trees["baseline"])
    out = summary({name: best(r) for name, r in runs["this"].items()}, args.policy)
    out["repeat"] = args.repeat
    out["consolidate_in_quota"] = args.consolidate_in_quota
    if args.baseline:
        base = summary({name: best(r) for name, r in runs["baseline"].items()}, args.policy)
        base["rev"] = args.baseline
        out["baseline"] = base
        out["ratio"] = {
            k: round(base[k] / out[k], 2)
            for k in out
            if k.startswith(TIMES) and not k.startswith(("cycle_s_runs", "gc_in_cycle_s")) and out[k]
        }
        out["same_decisions"] = all(
            base[k] == out[k] for k in out if k.startswith("decisions_sha")
        )
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not args.json:
        for k, v in out.items():
            print(f"{k:>24}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
