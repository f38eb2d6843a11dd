"""Where pooling doubles a cluster: gpupool against static as idle teams own more quota.

The product's promise is that clusters sitting near 30% allocated (teams owning GPUs they
seldom use) go above 85% with pooling. This sweeps the one quantity that decides the static
baseline: the share of the quota owned by the idle teams. For each share, the idle teams'
quotas are scaled to add up to it (keeping their ratio) and every other team's to the rest;
what each team submits (``pod_share``), the weights, the trace and the cluster stay the
scenario's. Each point is a full replay (static and gpupool), the ratio taken in the same run.

    python bench/replay_skew_sweep.py [--scenario skewed] [--idle vision,autonomy]
                                      [--shares 0.4,0.5,0.6,0.7,0.8] [--window LO,HI] [--json]
                                      [--plot OUT.png]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402
from sweeplib import scenarios  # noqa: E402


def with_idle_share(scn: scenarios.Scenario, idle: set[str], share: float) -> scenarios.Scenario:
    """A copy of ``scn`` whose ``idle`` teams own ``share`` of the quota together."""
    q_idle = sum(t.quota_share for t in scn.teams if t.name in idle)
    q_rest = sum(t.quota_share for t in scn.teams if t.name not in idle)
    teams = [
        dataclasses.replace(t, quota_share=t.quota_share / q_idle * share if t.name in idle else t.quota_share / q_rest * (1 - share))
        for t in scn.teams
    ]
    return dataclasses.replace(scn, teams=teams)


def main() -> int:
    prog = "replay_skew_sweep"
    ap = sweeplib.parser(__doc__, "skewed", "also draw allocation against the idle share here (PNG)")
    ap.add_argument("--idle", default="vision,autonomy", help="comma list of the teams that own idle quota")
    ap.add_argument("--shares", default="0.4,0.5,0.6,0.7,0.8", help="comma list of the idle teams' quota shares, each in (0, 1)")
    args = ap.parse_args()
    base = sweeplib.base_scenario(args, prog)
    idle = {x for x in args.idle.split(",") if x}
    names = {t.name for t in base.teams}
    if not idle or not idle < names:
        raise SystemExit(
            f"{prog}: --idle must name some but not all of the scenario's projects ({', '.join(sorted(names))}), got {args.idle!r}"
        )
    shares = sweeplib.numbers(args.shares, lambda s: 0 < s < 1, "numbers in (0, 1)", prog, "--shares")
    nodes, pods = sweeplib.load_trace(base, prog)
    rows = []
    for share in shares:
        rows.append({"idle_quota_share": share, **sweeplib.point(nodes, pods, with_idle_share(base, idle, share))})
        if not args.json:
            print(sweeplib.line(f"idle own {share:.0%}", rows[-1]), flush=True)
    if args.plot:
        x = [100 * r["idle_quota_share"] for r in rows]
        title = f"{base.name}: idle teams ({', '.join(sorted(idle))}) own more quota"
        sweeplib.plot(rows, x, "share of the quota owned by the idle teams, %", title, args.plot)
    print(json.dumps({"bench": "replay_skew_sweep", "scenario": base.name, "idle": sorted(idle), "points": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
