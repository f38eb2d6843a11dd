"""Wall time of the full default-trace replay (gpupool-sim replay) with all three policies.

The openb default trace (6,178 GPU pods after the scenario's selection) through the
scenario's cluster, static + fifo-shared + gpupool one after another in this process.
Target: under 120 s on the 2-core CI machine. CPU time is printed too: on a shared machine
it is the steadier figure.

    python bench/replay_speed.py [--json] [--scenario balanced] [--window LO,HI] [--doc OUT.json] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim import scenario as scenarios  # noqa: E402
from scheduler.sim.cli import default_trace_dir  # noqa: E402
from scheduler.sim.replay import replay_all  # noqa: E402
from scheduler.sim.replay_cli import with_window  # noqa: E402
from scheduler.sim.trace import load_nodes, load_pods  # noqa: E402

TARGET_S = 120.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="balanced")
    ap.add_argument("--window", default="", help="LO,HI share of the pods (default: the scenario's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--doc", default="", help="also write the replay's JSON document (its metrics) here")
    ap.add_argument("--plot", default="", help="also draw the chart here (after the timing)")
    args = ap.parse_args()
    d = default_trace_dir()
    if not (d / "openb_pod_list_default.csv").exists():
        print(f"no openb trace under {d}; set GPUPOOL_TRACES", file=sys.stderr)
        return 1
    wall0, cpu0 = time.perf_counter(), time.process_time()
    scn = scenarios.load(args.scenario)
    if args.window:
        scn.pods = with_window(scn.pods, args.window, "replay_speed")
    nodes = scn.select_nodes(load_nodes(d / "openb_node_list_gpu_node.csv"))
    pods = load_pods(d / "openb_pod_list_default.csv")
    doc, results = replay_all(nodes, pods, scn)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if args.doc:
        Path(args.doc).write_text(json.dumps(doc))
    if args.plot:
        from scheduler.sim.replay_plot import plot

        load = doc["load"]
        title = f"{scn.name}: {load['pods']} openb pods on {load['nodes']} nodes ({load['capacity_gpus']} GPUs)"
        plot(results, load["capacity_gpus"] * 1000, load["arrival_window_s"], title, args.plot)
    out = {
        "bench": "replay_speed",
        "scenario": scn.name,
        "pods": doc["load"]["pods"],
        "gpus": doc["load"]["capacity_gpus"],
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "target_s": TARGET_S,
        "ok": wall < TARGET_S,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "per_policy": {
            p: {k: m[k] for k in ("wall_s", "cpu_s", "decide_s", "cycles", "cycles_skipped_quiet")}
            for p, m in doc["policies"].items()
        },
    }
    if not args.json:
        for p, m in out["per_policy"].items():
            print(
                f"{p:<12} wall {m['wall_s']:>7.1f} s  cpu {m['cpu_s']:>7.1f} s  decide {m['decide_s']:>7.1f} s  "
                f"cycles {m['cycles']} ({m['cycles_skipped_quiet']} without decide: nothing changed)"
            )
        print(f"total: wall {out['wall_s']} s, cpu {out['cpu_s']} s (target wall < {TARGET_S:g} s), load {out['load_avg']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
