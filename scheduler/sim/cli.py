"""``gpupool-sim``: one subcommand per experiment.

Subcommands register in ``SUBCOMMANDS`` below, in the order ``--help`` lists them: each is a
function that adds its parser to the subparsers and sets ``func``; a module that adds an
experiment (e.g. ``replay``) appends its registration function here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..model import ValidationError
from ..placement import POLICIES
from . import placement as placement_sim
from .replay_cli import add_replay
from .trace import default_trace_dir, load_nodes, load_pods
from .variants import TraceVariant


def _policies(arg: str) -> list[str]:
    names = list(POLICIES) if arg == "all" else [x for x in arg.split(",") if x]
    for n in names:
        if n not in POLICIES:
            raise SystemExit(f"gpupool-sim: unknown policy {n!r}; choose from {', '.join(POLICIES)} or all")
    return names


def _table(results: list[placement_sim.PlacementResult]) -> str:
    lines = [f"{'policy':<10} {'allocated %':>11} {'std':>5} {'unallocated GPUs':>17} {'failed pods':>11} {'s/seed':>7}"]
    for r in results:
        secs = sum(s.seconds for s in r.per_seed) / max(1, r.seeds)
        lines.append(
            f"{r.policy:<10} {r.allocation_pct:>11.2f} {r.allocation_pct_std:>5.2f} {r.unallocated_gpus:>17.1f} {r.failed_pods:>11.1f} {secs:>7.1f}"
        )
    return "\n".join(lines)


def cmd_placement(args: argparse.Namespace) -> int:
    args.nodes = args.nodes or default_trace_dir() / "openb_node_list_gpu_node.csv"
    args.pods = args.pods or default_trace_dir() / "openb_pod_list_default.csv"
    nodes = load_nodes(args.nodes)
    pods = load_pods(args.pods)
    if args.max_nodes:
        nodes = nodes[: args.max_nodes]
    if args.max_pods:
        pods = pods[: args.max_pods]
    seeds = [args.first_seed + i for i in range(args.seeds)]
    variant = TraceVariant.parse(args.variant) if args.variant else None
    results = [placement_sim.run(nodes, pods, p, seeds, args.order, variant) for p in _policies(args.policy)]
    if args.json:
        out = [r.to_json() for r in results]
        for o in out:
            o["nodes"], o["pods"] = str(args.nodes), str(args.pods)
            if variant is not None:
                o["variant"] = variant.to_json()
            if not args.per_seed:
                o.pop("per_seed")
        print(json.dumps(out[0] if len(out) == 1 else {"results": out}))
    else:
        shaped = f" (variant {variant.label()})" if variant is not None else ""
        print(f"{Path(args.pods).name}{shaped} on {Path(args.nodes).name}, {args.order} order, {len(seeds)} seed(s) from {args.first_seed}")
        print(_table(results))
    return 0


def _count(low: int):
    """An argparse type: an integer >= ``low``, else a message naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse


def add_placement(sub) -> None:
    p = sub.add_parser("placement", help="the FGD paper's placement experiment on a trace")
    p.add_argument("--nodes", help="node list CSV (default: data/openb-2023/openb_node_list_gpu_node.csv)")
    p.add_argument("--pods", help="pod list CSV (default: data/openb-2023/openb_pod_list_default.csv)")
    p.add_argument("--policy", default="gpupool", help=f"one of {', '.join(POLICIES)}; a comma list; or all")
    p.add_argument("--seeds", type=_count(1), default=10, help="number of seeds (default 10, the paper's)")
    p.add_argument("--first-seed", type=int, default=42, help="first seed (default 42, the paper's)")
    p.add_argument(
        "--order",
        choices=["shuffled", "creation"],
        default="shuffled",
        help="order of the trace's own pods: shuffled with the seed (default, the paper's artifact) or creation time",
    )
    p.add_argument(
        "--variant",
        default="",
        help="reshape the pods: model_share=S,multi_gpu_share=S,fraction_share=S[,seed=N] (shares of the GPU pods;"
        " any subset; without seed each run seed draws its own variant; see scheduler/sim/variants.py)",
    )
    p.add_argument("--max-nodes", type=_count(0), default=0, help="use only the first N nodes (tests)")
    p.add_argument("--max-pods", type=_count(0), default=0, help="use only the first N pods of the file (tests)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--per-seed", action="store_true", help="with --json: include each seed's figures")
    p.set_defaults(func=cmd_placement)


def cmd_demo(args: argparse.Namespace) -> int:
    d = Path(args.traces) if args.traces else default_trace_dir()
    nodes_csv, pods_csv = d / "openb_node_list_gpu_node.csv", d / "openb_pod_list_default.csv"
    if not (nodes_csv.exists() and pods_csv.exists()):
        print(f"gpupool-sim demo: no openb trace under {d}; set GPUPOOL_TRACES", file=sys.stderr)
        return 1
    nodes = load_nodes(nodes_csv)[: args.nodes]
    pods = load_pods(pods_csv)[: args.pods]
    print(f"Placement quality, FGD-paper protocol: first {len(nodes)} nodes, first {len(pods)} pods")
    print("of the Alibaba openb 2023 default trace, 1 seed (the full table: README, 'Placement quality').\n")
    results = [placement_sim.run(nodes, pods, p, [42]) for p in POLICIES]
    print(_table(results))
    return 0


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="a short placement comparison of every policy")
    p.add_argument("--traces", default="", help="folder with the openb CSVs")
    p.add_argument("--nodes", type=int, default=300)
    p.add_argument("--pods", type=int, default=2500)
    p.set_defaults(func=cmd_demo)


SUBCOMMANDS: list[Callable] = [add_placement, add_demo, add_replay]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool-sim", description="gpupool scheduler simulations")
    sub = p.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except FileNotFoundError as e:
        raise SystemExit(f"gpupool-sim {args.command}: no such file: {e.filename}") from None
    except ValidationError as e:  # a malformed trace or scenario names its field
        raise SystemExit(f"gpupool-sim {args.command}: {e}") from None


if __name__ == "__main__":
    sys.exit(main())
