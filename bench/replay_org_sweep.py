"""The guarantee on organisations nobody tuned for: the replay's goals on N drawn
organisations (``generator: organisations``), static and gpupool in the same run per seed.

Each seed's row has its class (read from static's run: idle-silo, mixed, contended), every
goal, the figures behind them, the quota-unserved split by cause (``replay_unserved_causes``)
and the held-back split of the waiting time (the replay's ``held_back_by_s``). Beside the
per-draw goals it reads "reclaim not made" beyond one cycle: quota a team left unused while
a reclaim the rules allow stayed unmade for longer than one scheduling period. With
``--switch-off`` gpupool is replayed once more with ``consolidate_in_quota`` off, for the
lost GPU-hours share side by side (record 0050).

The sweep's goals (``SWEEP_GOALS``): on every draw thrash 0, quota unserved at most static's,
the in-quota p99 within its bound, "reclaim not made" 0 beyond one cycle, Jain at least 0.9
where over-quota work competed; on at least 95% of the draws 85% allocation while work waits
(and the rules let some start); on at least 90% of the idle-silo draws 2x static.

    python bench/replay_org_sweep.py [--scenario organisations] [--seeds 1-50] [--switch-off] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweeplib  # noqa: E402
from replay_unserved_causes import split  # noqa: E402

from scheduler.model import ValidationError  # noqa: E402
from scheduler.sim import replay  # noqa: E402
from scheduler.sim import scenario as scenarios  # noqa: E402

# Goals every draw must meet (None: undefined on that draw, not a miss).
EVERY_DRAW = ("thrash_zero", "quota_unserved_le_static", "in_quota_p99_within_static_plus_period_and_grace",
              "reclaim_not_made_beyond_one_cycle_zero", "jain_ge_0_9")
SWEEP_GOALS = {"allocation_ge_85_pct": 0.95, "allocation_ge_2x_static": 0.90}  # share of the draws it applies to


def row(nodes_all, pods, scn: scenarios.Scenario, switch_off: bool) -> dict:
    nodes = scn.select_nodes(nodes_all)
    t0 = time.process_time()
    s = replay.replay(nodes, pods, scn, "static").metrics
    unserved = split(nodes, pods, scn, "gpupool", with_metrics=True)
    g = unserved["metrics"]
    goals = replay.goals({"static": s, "gpupool": g}, scn)
    goals["reclaim_not_made_beyond_one_cycle_zero"] = unserved["reclaim_not_made_beyond_one_cycle_gpus"] == 0
    load = replay.offered_load(nodes, pods, scn)
    out = {
        "seed": scn.seed,
        "class": goals["static_class"],
        "pods": load["pods"], "gpus": load["capacity_gpus"], "offered_load_pct": load["offered_load_pct"],
        "patterns": [u.pattern for u in scn.calendar.units] if scn.calendar is not None and hasattr(scn.calendar, "units") else [],
        "workspaces_borrow": scn.workspace_over_quota > 0,
        "static_alloc_pct": s["gpu_allocation_mean_pct_any_wait"],
        "gpupool_alloc_pct": g["gpu_allocation_mean_pct"],
        "gpupool_alloc_any_wait_pct": g["gpu_allocation_mean_pct_any_wait"],
        "x_static": goals["allocation_x_static"],
        "held_back_share_pct": g["held_back_share_pct"],
        "held_back_by_s": g["held_back_by_s"],
        "quota_unserved_gpus": goals["quota_unserved_gpus"],
        "quota_unserved_by_cause": unserved["by_cause"],
        "reclaim_not_made_beyond_one_cycle_gpus": unserved["reclaim_not_made_beyond_one_cycle_gpus"],
        "reclaim_not_made_longest_s": unserved["reclaim_not_made_longest_s"],
        "in_quota_p99_s": g["in_quota_wait_p99_s"], "in_quota_p99_bound_s": goals["in_quota_p99_bound_s"],
        "thrash": g["thrash_count"], "jain": g["fairness_jain"],
        "preemptions": g["preemptions"], "moves": g["moves"],
        "lost_gpu_hours_share_pct": g["lost_gpu_hours_share_pct"],
        "goals": {k: goals[k] for k in (*EVERY_DRAW, *SWEEP_GOALS, "lost_work_le_1_pct")
                  if k in goals and (k != "allocation_ge_2x_static" or goals["static_class"] == "idle-silo")},
    }
    if switch_off:
        off = replay.replay(nodes, pods, scn, "gpupool", consolidate_in_quota=False).metrics
        out["switch_off"] = {"lost_gpu_hours_share_pct": off["lost_gpu_hours_share_pct"], "preemptions": off["preemptions"],
                             "gpupool_alloc_pct": off["gpu_allocation_mean_pct"],
                             "quota_unserved_gpus": off["quota_unserved_mean_gpus"]}
    out["cpu_s"] = round(time.process_time() - t0, 1)
    return out


def summary(rows: list[dict]) -> dict:
    """Per goal: the draws it applies to (defined), and how many meet it; whether the sweep's
    share is reached."""
    out = {"draws": len(rows), "by_class": {}}
    for r in rows:
        out["by_class"][r["class"]] = out["by_class"].get(r["class"], 0) + 1
    for k in (*EVERY_DRAW, *SWEEP_GOALS, "lost_work_le_1_pct"):
        vals = [r["goals"][k] for r in rows if r["goals"].get(k) is not None]
        need = SWEEP_GOALS.get(k, 1.0)
        met = sum(vals)
        out[k] = {"applies": len(vals), "met": met, "needed_share": need,
                  "holds": met >= need * len(vals) - 1e-9, "missed_on_seeds": [r["seed"] for r in rows if r["goals"].get(k) is False]}
    return out


def seeds(arg: str, prog: str) -> list[int]:
    try:
        if "-" in arg:
            lo, hi = (int(x) for x in arg.split("-"))
            out = list(range(lo, hi + 1))
        else:
            out = [int(x) for x in arg.split(",")]
    except ValueError:
        out = []
    if not out or any(s < 0 for s in out):
        raise SystemExit(f"{prog}: --seeds must be LO-HI or a comma list of whole numbers >= 0, got {arg!r}")
    return out


def main() -> int:
    prog = "replay_org_sweep"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="organisations")
    ap.add_argument("--seeds", default="1-50", help="LO-HI or a comma list")
    ap.add_argument("--switch-off", action="store_true", help="also replay gpupool with consolidate_in_quota off")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    todo = seeds(args.seeds, prog)
    try:
        first = scenarios.load(args.scenario, seed=todo[0])
    except ValidationError as e:
        raise SystemExit(f"{prog}: {e}") from None
    nodes_all, pods = sweeplib.load_trace(scenarios.Scenario(first.name, first.teams), prog)
    rows = []
    for seed in todo:
        rows.append(row(nodes_all, pods, scenarios.load(args.scenario, seed=seed), args.switch_off))
        if not args.json:
            r = rows[-1]
            missed = [k for k, v in r["goals"].items() if v is False]
            print(f"seed {seed:>3} {r['class']:<9} load {r['offered_load_pct']}%  static {r['static_alloc_pct']}%  "
                  f"gpupool {r['gpupool_alloc_pct']}% (any wait {r['gpupool_alloc_any_wait_pct']}%)  "
                  f"unserved {r['quota_unserved_gpus']}  p99 {r['in_quota_p99_s']} ({r['in_quota_p99_bound_s']})  "
                  f"Jain {r['jain']}  missed {missed or '-'}  {r['cpu_s']} s", flush=True)
    print(json.dumps({"bench": prog, "scenario": first.name, "summary": summary(rows), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
