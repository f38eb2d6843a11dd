"""Why quota goes unserved in a replay: the quota-unserved figure (``quota_unserved_mean_gpus``:
quota a team leaves unused while work of its own waits) split per team and by cause, for
static and gpupool on the same draw, and gpupool once more with the eviction grace at zero;
and how much of "reclaim not made" lasted beyond one cycle.

The causes, as seen after each scheduling cycle, first match (``fits``, ``held_back`` and
``protected`` are ``replay_wait_causes``'s):

  unseen             the team's waiting pods are all beyond the queue depth a cycle sees
  bigger_than_gap    every waiting pod of the team is larger than its quota less what it
                     holds: none of them is in quota, no rule promises it a start
  could_start        an in-quota waiting pod fits a node as it is: the cycle left it waiting
  reclaim_in_flight  one fits once the evicted work releases (its grace period)
  held_back          gpupool: every in-quota waiting pod is held back by protected work
  reclaim_not_made   one fits only by evicting work the rules allow taking, not evicted yet
  since_last_cycle   the gap opened after the last cycle (a pod ended); the next one decides

The row with the grace at zero is the same replay in which evicted work frees its GPUs at
once: the part of gpupool's figure that the eviction grace alone causes (static never
evicts, so it never pays it).

    python bench/replay_unserved_causes.py [--scenario skewed] [--seed N] [--json]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402
from replay_wait_causes import fits, held_back  # noqa: E402

from scheduler.model import MILLI, State  # noqa: E402
from scheduler.sim import replay  # noqa: E402


def cause(r, project: str, by_name: dict, policy: str) -> str:
    """Why ``project`` leaves quota unused while pods of its own wait, after this cycle."""
    mine = [w for w in r.snap.pending.values() if w.project == project]
    if not mine:
        return "unseen"
    held = r.meter.held[project]
    in_quota = [w for w in mine if held + r.jobs[w.name].milli <= r.quota[project]]
    if not in_quota:
        return "bigger_than_gap"
    if any(fits(r, w, by_name, lambda v: True) for w in in_quota):
        return "could_start"
    if any(fits(r, w, by_name, lambda v: v.state == State.RUNNING) for w in in_quota):
        return "reclaim_in_flight"
    if policy == "gpupool" and all(held_back(r, w, by_name) for w in in_quota):
        return "held_back"
    return "reclaim_not_made"


def split(nodes: list, pods: list, scn, policy: str, with_metrics: bool = False, **replay_kw) -> dict:
    """One replay of ``policy``: its quota-unserved figure and that figure per team and cause
    (GPUs averaged over the arrival window, as the figure is), and the part of "reclaim not
    made" that lasted beyond one cycle: quota a team left unused while a reclaim the rules
    allow stayed unmade for longer than one scheduling period (with its longest stretch).
    ``with_metrics`` adds the replay's own metrics; ``replay_kw`` goes to ``replay.replay``."""
    by_name = {n.name: n for n in nodes}
    last: dict[str, str] = {}
    since: dict[str, float] = {}  # per team: when its current "reclaim not made" began
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    beyond = {"gpu_s": 0.0, "longest_s": 0.0}
    period = scn.time.scheduling_period_s
    orig_after, orig_advance = replay._Replay._after_cycle, replay.Meter.advance

    def after(self, t):
        orig_after(self, t)
        last.clear()
        for p, q in self.quota.items():
            gap = min(q - self.meter.held[p], self.pend_all[p])
            if gap > 0:
                last[p] = cause(self, p, by_name, policy)
            if last.get(p) == "reclaim_not_made":
                since.setdefault(p, t)
                beyond["longest_s"] = max(beyond["longest_s"], t - since[p])
            else:
                since.pop(p, None)

    def advance(self, t):
        dt = min(t, self.window_end) - self.t
        if dt > 0:  # the meter's own gap (``Meter.record``), so the parts add up to its figure
            for p, q in self.quota.items():
                gap = max(0, min(q - self.held[p], self.pend_all[p]))
                if gap:
                    c = last.get(p, "since_last_cycle")
                    acc[p][c] += gap * dt
                    if c == "reclaim_not_made" and self.t - since.get(p, self.t) >= period:
                        beyond["gpu_s"] += gap * dt
        orig_advance(self, t)

    with mock.patch.object(replay._Replay, "_after_cycle", after), mock.patch.object(replay.Meter, "advance", advance):
        m = replay.replay(nodes, pods, scn, policy, **replay_kw).metrics
    window = m["arrival_window_s"] or 1.0
    teams = {
        p: {c: round(v / window / MILLI, 2) for c, v in sorted(parts.items())}
        for p, parts in sorted(acc.items())
    }
    out = {"quota_unserved_mean_gpus": m["quota_unserved_mean_gpus"], "by_cause": _by_cause(teams), "by_team": teams,
           "reclaim_not_made_beyond_one_cycle_gpus": round(beyond["gpu_s"] / window / MILLI, 3),
           "reclaim_not_made_longest_s": round(beyond["longest_s"], 1)}
    return {**out, "metrics": m} if with_metrics else out


def _by_cause(teams: dict[str, dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for parts in teams.values():
        for c, v in parts.items():
            out[c] += v
    return {c: round(v, 2) for c, v in sorted(out.items())}


def main() -> int:
    prog = "replay_unserved_causes"
    args = sweeplib.seed_parser(__doc__, "skewed").parse_args()
    scn = sweeplib.seeded_scenario(args, prog)
    nodes, pods = sweeplib.load_trace(scn, prog)
    instant = dataclasses.replace(scn, time=dataclasses.replace(scn.time, eviction_grace_s=0.0))
    out = {"scenario": scn.name, "seed": args.seed}
    for name, s, policy in (("static", scn, "static"), ("gpupool", scn, "gpupool"),
                            ("gpupool_grace_0", instant, "gpupool")):
        out[name] = split(nodes, pods, s, policy)
        if not args.json:
            print(f"{name:<16} {out[name]['quota_unserved_mean_gpus']}  {out[name]['by_cause']}", flush=True)
            for team, parts in out[name]["by_team"].items():
                print(f"  {team:<14} {parts}", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
