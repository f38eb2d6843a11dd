"""Why work waits in a gpupool replay: the share of the waiting time in which every waiting
pod is held back by other teams' protected work, and the allocation goal read with and
without that time.

*Protected* work is what the scheduler's promises forbid taking for the waiting pod
(``protected``, the rules' own ``scheduler.guarantee.protection``): work restarted after an
eviction within the resume protection, work that is not preemptible inside its team's quota
(a workspace, an inference service), its own project's work of its priority or higher, and
another project's work while that project holds no more than its quota (the in-quota
promise, property (c) of the guarantee tests). A
waiting pod is *held back* when no node could hold it (the node's GPUs, CPUs and memory)
even with every unprotected workload gone; time is held back while every pod the scheduler
sees waiting is. In that time nothing the rules allow would start anything, so allocation
is what the offered load makes it.

The ceilings (``..._ceiling_pct``) read the same times as if every pod then waiting had
started at once (what is allocated plus what waits, at most every GPU): no start order
allocates more *in those moments*. They bound the replayed rules' backlog, not every rule: a
rule that starts work sooner changes which moments count, and may end above this ceiling.

The replay is the shipped one (``replay.replay``, gpupool); this script only watches it.

``held_back_by_s`` splits the held-back time by what protects the work that holds the
waiting pods back on the nodes big enough for them: work that is not preemptible, the pod's
own project's work of its priority or higher, or another project's work in its quota (or
no node is big enough). Each moment is shared equally among the waiting pods, and a pod's
share among the protections found, so the parts add up to ``held_back_s``.

With ``--team``, the same split for one team's waiting work that may go over quota, while
the team wants over-quota GPUs: the time the Jain index counts it as owed a share.

    python bench/replay_wait_causes.py [--scenario timezones] [--seed N] [--team NAME] [--json]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402

from scheduler import guarantee  # noqa: E402
from scheduler.guarantee import protection  # noqa: E402
from scheduler.model import MILLI, State, Workload  # noqa: E402
from scheduler.sim import replay  # noqa: E402
from scheduler.sim.startable import holds, room_on, takeable_from  # noqa: E402
from scheduler.snapshot import SchedulerConfig  # noqa: E402


def protected(r, v: Workload, w: Workload) -> bool:
    """May ``v`` stay whatever ``w`` needs, in replay ``r`` as it is? The rules' own answer
    (``scheduler.guarantee.protection``): work restarted lately, work that is not
    preemptible inside its team's quota, of ``w``'s own project work of its priority or
    higher, of another project work while that project holds no more than its quota."""
    return _protection(r, v, w) is not None


def _protection(r, v: Workload, w: Workload) -> str | None:
    snap = r.snap
    cfg = getattr(snap, "config", None) or SchedulerConfig()
    return protection(v, w, r.meter.held[v.project] > r.quota[v.project], getattr(snap, "now", None),
                      cfg.resume_protection_s)


def fits(r, w: Workload, nodes: dict, keeps) -> bool:
    """Could a node hold ``w`` (its GPUs, CPUs and memory) with only the holders that
    ``keeps(v)`` says stay (running or releasing workloads)?"""
    d = w.demand
    # Per node: per GPU the milli, and the CPU and memory, that the kept work holds.
    keep_gpu: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    keep_res: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for v in r.snap.workloads.values():
        if v.state not in (State.RUNNING, State.RELEASING) or not keeps(v):
            continue
        for p in v.placement:
            for g in p.gpu_indices:
                keep_gpu[p.node][g] += p.gpu_milli
            keep_res[p.node][0] += v.demand.cpu_milli
            keep_res[p.node][1] += v.demand.memory_mib
    return any(holds(node, d, keep_gpu[name], *keep_res[name]) for name, node in nodes.items())


def held_back(r, w: Workload, nodes: dict) -> bool:
    """Could no node hold ``w`` even with the work gone that the guarantee lets go (and every
    evicted one released)? Work the rules protect stays (``protected``); of another
    project over its quota, only as much goes as the reclaim rule lets one plan take
    (``may_take``: down to its quota, or below it only with pieces that would each be
    over it if they came back), which ``_room_by_the_rules`` asks node by node where
    the quicker bound (every unprotected workload gone) finds room."""
    if not fits(r, w, nodes, lambda v: v.state == State.RUNNING and protected(r, v, w)):
        return True
    return not _room_by_the_rules(r, w, nodes)


def _room_by_the_rules(r, w: Workload, nodes: dict) -> bool:
    """Would some node hold ``w`` with its own project's unprotected work gone and, of each
    other project the rules take from for it, a set of its unprotected work there that the
    reclaim rule lets one plan take? The replay's own reading (``sim.startable``:
    ``takeable_from`` names the projects and the floors they keep, ``room_on`` weighs the
    sets), with evicted work released."""
    on: dict[str, list[Workload]] = defaultdict(list)
    for v in r.snap.workloads.values():
        if v.state in (State.RUNNING, State.RELEASING):
            for node in {p.node for p in v.placement}:
                on[node].append(v)
    cfg = getattr(r.snap, "config", None) or SchedulerConfig()
    floors = takeable_from(w, r.jobs[w.name].milli, r.meter.held, r.quota, r.fair,
                           getattr(r.snap, "over_quota_lag", {}), cfg)
    for name, node in nodes.items():
        if not holds(node, w.demand):
            continue
        stays: list[Workload] = []
        others: dict[str, list[Workload]] = defaultdict(list)
        for v in on.get(name, ()):
            if v.state != State.RUNNING:
                continue  # releasing: gone
            if protected(r, v, w):
                stays.append(v)
            elif v.project != w.project and v.project in floors:
                others[v.project].append(v)
        if room_on(node, w.demand, stays, others, floors, r.meter.held):
            return True
    return False


# What protects the work that holds a waiting pod back, in the order a holder is read; the
# last, where no node is big enough for the pod at all.
PROTECTIONS = (*guarantee.PROTECTIONS, "no node big enough")


def protections(r, w: Workload, nodes: dict) -> set[str]:
    """What protects the work on the nodes big enough for ``w`` (their GPUs, CPUs and
    memory in all) that the guarantee keeps there: not preemptible, ``w``'s own project's
    work of its priority or higher, another project's work while it holds no more than its
    quota."""
    big = {name for name, n in nodes.items() if holds(n, w.demand)}
    out: set[str] = set()
    for v in r.snap.workloads.values():
        if v.state != State.RUNNING or not any(p.node in big for p in v.placement):
            continue
        why = _protection(r, v, w)
        if why is not None:
            out.add(why)
    return out


def watch(nodes: list, pods: list, scn, team: str | None = None) -> dict:
    """The split for all waiting work; with ``team``, for that team's waiting work that may
    go over quota, while the team wants over-quota GPUs (the times the Jain index counts)."""
    by_name = {n.name: n for n in nodes}
    cap = sum(len(n.gpus) for n in nodes) * MILLI
    gpu_mem = max((g.memory_mib for n in nodes for g in n.gpus), default=1)
    state: dict = {"held_back": False, "waits": False, "asked": 0, "by": {}}
    held_back_by = dict.fromkeys(PROTECTIONS, 0.0)
    sums = {"wait_s": 0.0, "held_back_s": 0.0, "busy_wait": 0.0, "busy_held_back": 0.0,
            "ceiling_wait": 0.0, "ceiling_held_back": 0.0}
    orig_after, orig_advance = replay._Replay._after_cycle, replay.Meter.advance

    def after(self, t):
        orig_after(self, t)
        waiting = list(self.snap.pending.values())
        if team is not None:
            wants = self.meter.held[team] + self.pend_over[team] > self.quota[team]
            waiting = [w for w in waiting if wants and w.project == team and w.may_go_over_quota]
        state["waits"] = bool(waiting)
        # The ceiling counts all queued work, also what waits beyond the queue depth the
        # scheduler sees (the goal's "work waits" counts it too).
        asked = waiting + list(self.queues.waiting.values()) if team is None else waiting
        state["asked"] = sum(w.gpu_milli_estimate(gpu_mem) for w in asked)
        state["held_back"] = bool(waiting) and all(held_back(self, w, by_name) for w in waiting)
        # Held-back time goes to what protects the blockers: equal parts per waiting pod,
        # and per pod equal parts per protection found on the nodes that could hold it.
        by: dict[str, float] = defaultdict(float)
        if state["held_back"]:
            for w in waiting:
                found = protections(self, w, by_name) or {PROTECTIONS[-1]}
                for p in found:
                    by[p] += 1 / (len(waiting) * len(found))
        state["by"] = by

    def advance(self, t):
        dt = min(t, self.window_end) - self.t
        if (self.pending_seen if team is None else state["waits"]) and dt > 0:
            sums["wait_s"] += dt
            sums["busy_wait"] += self.held_total * dt
            ceiling = min(cap, self.held_total + state["asked"]) * dt
            sums["ceiling_wait"] += ceiling
            if state["held_back"]:
                sums["held_back_s"] += dt
                sums["busy_held_back"] += self.held_total * dt
                sums["ceiling_held_back"] += ceiling
                for p, part in state["by"].items():
                    held_back_by[p] += part * dt
        orig_advance(self, t)

    with mock.patch.object(replay._Replay, "_after_cycle", after), mock.patch.object(replay.Meter, "advance", advance):
        res = replay.replay(nodes, pods, scn, "gpupool")
    other_s = sums["wait_s"] - sums["held_back_s"]

    def pct(busy: float, s: float) -> float | None:
        return round(100 * busy / (cap * s), 2) if s > 0 else None

    return {
        "team": team,
        "allocation_while_work_waits_pct": res.metrics["gpu_allocation_mean_pct_any_wait"],
        "waiting_s": round(sums["wait_s"], 1),
        "held_back_s": round(sums["held_back_s"], 1),
        "held_back_share": round(sums["held_back_s"] / sums["wait_s"], 3) if sums["wait_s"] else None,
        "allocation_while_held_back_pct": pct(sums["busy_held_back"], sums["held_back_s"]),
        "allocation_while_other_work_waits_pct": pct(sums["busy_wait"] - sums["busy_held_back"], other_s),
        "allocation_ceiling_while_work_waits_pct": pct(sums["ceiling_wait"], sums["wait_s"]),
        "allocation_ceiling_while_held_back_pct": pct(sums["ceiling_held_back"], sums["held_back_s"]),
        "held_back_by_s": {p: round(x, 1) for p, x in held_back_by.items()},
    }


def main() -> int:
    prog = "replay_wait_causes"
    ap = sweeplib.seed_parser(__doc__, "timezones")
    ap.add_argument("--team", default=None, help="only this team's over-quota waiting, while it wants over-quota GPUs")
    args = ap.parse_args()
    scn = sweeplib.seeded_scenario(args, prog)
    if args.team is not None and args.team not in {t.name for t in scn.teams}:
        raise SystemExit(f"{prog}: --team must name a team of {scn.name}: {', '.join(t.name for t in scn.teams)}")
    nodes, pods = sweeplib.load_trace(scn, prog)
    out = {"scenario": scn.name, "seed": args.seed, **watch(nodes, pods, scn, args.team)}
    print(json.dumps(out) if args.json else "\n".join(f"{k:<40} {v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
