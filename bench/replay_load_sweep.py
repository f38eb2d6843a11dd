"""Pooling against static as the offered load changes: where the 2x promise can hold for a
scenario's teams, and what pooling does where it cannot.

The replay counts allocation only while work waits. For teams whose work comes from the
same stream (``balanced``: each team an equal, random share of the trace), static's silos
run out together, so while work waits they are mostly full and no policy can double them
(the ceiling is 100 / static); at lower loads pooling mostly removes the waiting instead,
which the ``waiting`` columns show. This sweeps the scenario's ``arrival_compression`` (the
trace's arrival times are divided by it; the offered load follows), every other setting
kept. Activity windows (``turns``) keep their share of the arrivals: their period is scaled
with the compression. Each point is a full replay (static and gpupool), the ratio taken in
the same run.

    python bench/replay_load_sweep.py [--scenario balanced] [--compressions 35,50,70,100]
                                      [--window LO,HI] [--json] [--plot OUT.png]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402
from sweeplib import scenarios  # noqa: E402


def with_compression(scn: scenarios.Scenario, compression: float) -> scenarios.Scenario:
    """A copy of ``scn`` whose arrivals are divided by ``compression`` instead; an activity
    period shrinks or grows with them (it is a period of the trace's own time)."""
    t = scn.time
    period = t.activity_period_s * t.arrival_compression / compression
    return dataclasses.replace(scn, time=dataclasses.replace(t, arrival_compression=compression, activity_period_s=period))


def main() -> int:
    prog = "replay_load_sweep"
    ap = sweeplib.parser(__doc__, "balanced", "also draw allocation and waiting against the offered load here (PNG)")
    ap.add_argument("--compressions", default="35,50,70,100", help="comma list of arrival compressions, each > 0")
    args = ap.parse_args()
    base = sweeplib.base_scenario(args, prog)
    if base.calendar is not None:  # its arrivals follow calendar.days, not a compression
        raise SystemExit(f"{prog}: --scenario {base.name} spreads its arrivals over calendar.days (generator: timezones); change those instead")
    compressions = sweeplib.numbers(args.compressions, lambda c: 0 < c < float("inf"), "numbers > 0", prog, "--compressions")
    nodes, pods = sweeplib.load_trace(base, prog)
    rows = []
    for c in compressions:
        rows.append({"arrival_compression": c, **sweeplib.point(nodes, pods, with_compression(base, c))})
        if not args.json:
            print(sweeplib.line(f"x{c:g} arrivals, load {rows[-1]['offered_load_pct']}%", rows[-1]), flush=True)
    if args.plot:
        x = [r["offered_load_pct"] for r in rows]
        sweeplib.plot(rows, x, "offered load, % of the cluster", f"{base.name}: the same teams at other loads", args.plot)
    print(json.dumps({"bench": "replay_load_sweep", "scenario": base.name, "points": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
