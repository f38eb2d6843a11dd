"""``gpupool-sim replay``: the multi-tenant trace replay from the command line."""

from __future__ import annotations

import argparse
import json

from ..model import ValidationError
from ..placement import POLICIES
from . import scenario as scenarios
from .replay import POLICY_NAMES, replay_all
from .trace import default_trace_dir, load_nodes, load_pods

KEYS = [
    ("gpu_allocation_mean_pct", "alloc %"),
    ("in_quota_wait_p50_s", "inq p50 s"),
    ("in_quota_wait_p99_s", "inq p99 s"),
    ("all_wait_p50_s", "all p50 s"),
    ("all_wait_p99_s", "all p99 s"),
    ("jct_mean_s", "JCT s"),
    ("preemptions", "preempt"),
    ("lost_gpu_hours", "lost GPU h"),
    ("thrash_count", "thrash"),
    ("fairness_jain", "Jain"),
]


def table(doc: dict) -> str:
    lines = [f"{'policy':<12}" + "".join(f"{h:>11}" for _, h in KEYS)]
    for name, m in doc["policies"].items():
        lines.append(f"{name:<12}" + "".join(f"{'-' if m[k] is None else m[k]:>11}" for k, _ in KEYS))
    return "\n".join(lines)


def _policies(arg: str) -> tuple[str, ...]:
    names = POLICY_NAMES if arg == "all" else tuple(x for x in arg.split(",") if x)
    for n in names:
        if n not in POLICY_NAMES:
            raise SystemExit(f"gpupool-sim replay: unknown policy {n!r}; choose from {', '.join(POLICY_NAMES)} or all")
    return names


def _share(arg: str) -> float:
    v = {"true": 1.0, "false": 0.0}.get(arg.lower())
    try:
        v = float(arg) if v is None else v
    except ValueError:
        v = -1.0
    if not 0 <= v <= 1:
        raise SystemExit(f"gpupool-sim replay: --workspace-over-quota must be true, false or a share in [0, 1], got {arg!r}")
    return v


def with_window(pods: scenarios.PodSpec, arg: str, prog: str) -> scenarios.PodSpec:
    """``pods`` replaying only the share ``arg`` ("LO,HI") of them; a bad value exits with
    one line naming --window and its range (also for the bench scripts, as ``prog``)."""
    try:
        lo, hi = (float(x) for x in arg.split(","))
    except ValueError:
        raise SystemExit(f"{prog}: --window must be LO,HI (shares of the pods), got {arg!r}") from None
    if not 0 <= lo < hi <= 1:
        raise SystemExit(f"{prog}: --window must have 0 <= LO < HI <= 1, got {arg!r}")
    return scenarios.PodSpec(pods.skip_never_scheduled, pods.skip_cpu_only, (lo, hi))


def cmd_replay(args: argparse.Namespace) -> int:
    d = default_trace_dir()
    try:
        scn = scenarios.load(args.scenario, seed=args.seed)
    except ValidationError as e:
        raise SystemExit(f"gpupool-sim replay: {e}") from None
    if args.window:
        scn.pods = with_window(scn.pods, args.window, "gpupool-sim replay")
    if args.workspace_over_quota is not None:
        scn.workspace_over_quota = _share(args.workspace_over_quota)
    nodes = scn.select_nodes(load_nodes(args.nodes or d / "openb_node_list_gpu_node.csv"))
    pods = load_pods(args.pods or d / "openb_pod_list_default.csv")
    doc, results = replay_all(
        nodes, pods, scn, _policies(args.policy), args.placement, args.check,
        fair_share_over_time=args.fair_share_over_time == "on",
        consolidate_in_quota=args.consolidate_in_quota == "on",
    )
    if args.plot:
        from .replay_plot import plot

        cap = doc["load"]["capacity_gpus"] * 1000
        title = f"{scn.name}: {doc['load']['pods']} openb pods on {doc['load']['nodes']} nodes ({doc['load']['capacity_gpus']} GPUs)"
        plot(results, cap, doc["load"]["arrival_window_s"], title, args.plot)
        doc["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(doc))
    else:
        load = doc["load"]
        print(
            f"{scn.name}: {load['pods']} pods, {load['capacity_gpus']} GPUs, arrivals over {load['arrival_window_s'] / 3600:.1f} h, "
            f"offered load {load['offered_load_pct']}%; replay {doc['wall_s']} s wall, {doc['cpu_s']} s CPU"
        )
        print(table(doc))
        for k, v in doc["goals"].items():
            print(f"  {k}: {'undefined' if v is None else v}")
    return 0


def add_replay(sub) -> None:
    p = sub.add_parser("replay", help="multi-tenant trace replay: static vs fifo-shared vs gpupool")
    p.add_argument("--nodes", default="", help="node list CSV (default: the openb trace's GPU nodes)")
    p.add_argument("--pods", default="", help="pod list CSV (default: openb_pod_list_default.csv)")
    p.add_argument(
        "--scenario", default="balanced", help="a scenario YAML file (any path), or the name of one in scheduler/sim/scenarios"
    )
    p.add_argument(
        "--seed", type=int, default=None,
        help="replace the scenario's seed: another draw of a generated scenario (timezones), another pod hash",
    )
    p.add_argument("--policy", default="all", help=f"one of {', '.join(POLICY_NAMES)}; a comma list; or all")
    p.add_argument(
        "--placement", default=None, choices=list(POLICIES),
        help="placement policy every policy uses (default: the scenario's, gpupool unless it names one)"
    )
    p.add_argument("--window", default="", help="LO,HI: replay only this share of the pods (e.g. 0.4,0.5)")
    p.add_argument(
        "--workspace-over-quota", default=None, metavar="SHARE",
        help="override the scenario's workspace_over_quota (true, false or a share in [0, 1])",
    )
    p.add_argument(
        "--fair-share-over-time", default="on", choices=["on", "off"],
        help="keep each project's over-quota lag (default on; off: fair share of the instant only)",
    )
    p.add_argument(
        "--consolidate-in-quota", default="on", choices=["on", "off"],
        help="consolidate may also move trainings inside another project's quota (default on)",
    )
    p.add_argument("--check", action="store_true", help="check conservation after every cycle (slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", default="", help="write the chart to this PNG")
    p.set_defaults(func=cmd_replay)
