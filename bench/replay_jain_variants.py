"""What the replay's Jain index measures: gpupool's index as shipped, and under two other
readings of who is owed over-quota GPUs, on the same replay.

The shipped index (``replay.over_quota_shares``) counts a project as wanting over-quota
GPUs while it holds at least its quota and what it holds plus its waiting work that may go
over quota exceeds it (record 0052), and divides the over-quota GPUs in use among the
projects by their weights alone. The variants:

  quota_served       the same rule applied once more: since record 0052 it is the shipped
                     index, kept so that runs before and after compare.
  departments_first  the over-quota GPUs in use are divided among departments first (by
                     the sum of their projects' weights), then among each one's projects,
                     as the product's fair share divides idle GPUs (``quota.fair_shares``).

Each variant is a full gpupool replay with the meter's share rule replaced; the scheduler
decides the same in all of them (the meter only watches), so the indexes differ only in
what they count.

    python bench/replay_jain_variants.py [--scenario balanced] [--seed N] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402

from scheduler.quota import waterfill  # noqa: E402
from scheduler.sim import replay  # noqa: E402

Shares = tuple[list[str], list[float], list[float]] | None
SHIPPED = replay.over_quota_shares  # the variants build on it while it is replaced


def quota_served(held: dict, pend_over: dict, quota: dict, weight: dict) -> Shares:
    at_quota = {p: q for p, q in quota.items() if held.get(p, 0) >= q}
    return SHIPPED(held, pend_over, at_quota, weight)


def departments_first(department: dict[str, str]):
    dept_weight: dict[str, float] = {}

    def shares(held: dict, pend_over: dict, quota: dict, weight: dict) -> Shares:
        flat = SHIPPED(held, pend_over, quota, weight)
        if flat is None:
            return None
        names, alloc, _ = flat
        want = [held.get(p, 0) + pend_over.get(p, 0) - quota[p] for p in names]
        depts = sorted({department[p] for p in names})
        by_dept = waterfill(
            sum(alloc), [0.0] * len(depts),
            [sum(w for p, w in zip(names, want) if department[p] == d) for d in depts],
            [dept_weight[d] for d in depts],
        )
        share = [0.0] * len(names)
        for d, total in zip(depts, by_dept):
            idx = [i for i, p in enumerate(names) if department[p] == d]
            for i, s in zip(idx, waterfill(total, [0.0] * len(idx), [want[i] for i in idx], [weight[names[i]] for i in idx])):
                share[i] = s
        return names, alloc, share

    return shares, dept_weight


def main() -> int:
    prog = "replay_jain_variants"
    args = sweeplib.seed_parser(__doc__, "balanced").parse_args()
    scn = sweeplib.seeded_scenario(args, prog)
    nodes, pods = sweeplib.load_trace(scn, prog)
    by_dept, dept_weight = departments_first({t.name: t.department for t in scn.teams})
    for t in scn.teams:
        dept_weight[t.department] = dept_weight.get(t.department, 0.0) + t.weight
    out: dict = {"scenario": scn.name, "seed": args.seed}
    for name, rule in (("shipped", SHIPPED), ("quota_served", quota_served), ("departments_first", by_dept)):
        with mock.patch.object(replay, "over_quota_shares", rule):
            m = replay.replay(nodes, pods, scn, "gpupool").metrics
        out[name] = {"fairness_jain": m["fairness_jain"], "received_vs_deserved": m["over_quota_received_vs_deserved"]}
        if not args.json:
            print(f"{name:<18} Jain {m['fairness_jain']}  {m['over_quota_received_vs_deserved']}", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
