"""What the replay sweeps share: the trace, one point (static and gpupool in the same run,
the ratio taken there), its printed line and the chart. Each sweep varies one quantity of
a scenario and says which (``replay_skew_sweep.py``: the idle teams' quota share;
``replay_load_sweep.py``: the offered load)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.model import Node, ValidationError  # noqa: E402
from scheduler.sim import scenario as scenarios  # noqa: E402
from scheduler.sim.cli import default_trace_dir  # noqa: E402
from scheduler.sim.replay import replay_all  # noqa: E402
from scheduler.sim.replay_cli import with_window  # noqa: E402
from scheduler.sim.trace import TracePod, load_nodes, load_pods  # noqa: E402


def parser(doc: str, scenario: str, plot_help: str) -> argparse.ArgumentParser:
    """The arguments every sweep takes; each adds the quantity it sweeps."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--scenario", default=scenario)
    ap.add_argument("--window", default="", help="LO,HI share of the pods (default: the scenario's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default="", help=plot_help)
    return ap


def seed_parser(doc: str, scenario: str) -> argparse.ArgumentParser:
    """The arguments of the scripts that watch one replay of a scenario's draw."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--scenario", default=scenario)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    return ap


def seeded_scenario(args: argparse.Namespace, prog: str) -> scenarios.Scenario:
    """``--scenario`` drawn with ``--seed``; a one-line exit on a bad one."""
    try:
        return scenarios.load(args.scenario, seed=args.seed)
    except ValidationError as e:
        raise SystemExit(f"{prog}: {e}") from None


def base_scenario(args: argparse.Namespace, prog: str) -> scenarios.Scenario:
    """``--scenario`` with ``--window`` applied; a one-line exit on a bad one."""
    try:
        scn = scenarios.load(args.scenario)
    except ValidationError as e:
        raise SystemExit(f"{prog}: {e}") from None
    if args.window:
        scn.pods = with_window(scn.pods, args.window, prog)
    return scn


def numbers(arg: str, ok, what: str, prog: str, flag: str) -> list[float]:
    """A comma list of numbers each ``ok``; else a one-line exit naming ``flag`` and ``what``
    it must be."""
    try:
        xs = [float(x) for x in arg.split(",")]
    except ValueError:
        xs = []
    if not xs or not all(ok(x) for x in xs):
        raise SystemExit(f"{prog}: {flag} must be a comma list of {what}, got {arg!r}")
    return xs


def load_trace(scn: scenarios.Scenario, prog: str) -> tuple[list[Node], list[TracePod]]:
    """The scenario's nodes and the default trace's pods; a one-line exit if missing."""
    d = default_trace_dir()
    if not (d / "openb_pod_list_default.csv").exists():
        raise SystemExit(f"{prog}: no openb trace under {d}; set GPUPOOL_TRACES")
    return scn.select_nodes(load_nodes(d / "openb_node_list_gpu_node.csv")), load_pods(d / "openb_pod_list_default.csv")


def point(nodes: list[Node], pods: list[TracePod], scn: scenarios.Scenario) -> dict:
    """One full replay of ``scn`` under static and gpupool: the goals' figures, and how long
    work waited under each (allocation counts only while work waits, so where pooling
    removes the waiting the share of time with work waiting says what the ratio cannot)."""
    doc, _ = replay_all(nodes, pods, scn, ("static", "gpupool"))
    s, g = doc["policies"]["static"], doc["policies"]["gpupool"]
    # None: nothing ever waited (static), or nothing the rules let start ever waited (gpupool)
    sa, ga = s["gpu_allocation_mean_pct_any_wait"], g["gpu_allocation_mean_pct"]
    window = doc["load"]["arrival_window_s"] or 1.0
    return {
        "offered_load_pct": doc["load"]["offered_load_pct"],
        "static_alloc_pct": sa,
        "gpupool_alloc_pct": ga,
        "gpupool_alloc_any_wait_pct": g["gpu_allocation_mean_pct_any_wait"],
        "ratio": doc["goals"]["allocation_x_static"],
        "ratio_ceiling": doc["goals"]["allocation_x_static_ceiling"],  # no policy allocates over 100%
        "static_waiting_pct": round(100 * s["pending_time_in_window_s"] / window, 1),
        "gpupool_waiting_pct": round(100 * g["pending_time_in_window_s"] / window, 1),
        "static_all_wait_p99_s": s["all_wait_p99_s"],
        "gpupool_all_wait_p99_s": g["all_wait_p99_s"],
        "in_quota_p99_s": g["in_quota_wait_p99_s"],
        "in_quota_p99_bound_s": doc["goals"]["in_quota_p99_bound_s"],
        "thrash": g["thrash_count"],
        "jain": g["fairness_jain"],
        "preemptions": g["preemptions"],
        "lost_gpu_hours": g["lost_gpu_hours"],
        "goals_met": sorted(k for k in doc["goals"]["goal_keys"] if doc["goals"][k] is True),
    }


def line(label: str, r: dict) -> str:
    return (
        f"{label}: static {r['static_alloc_pct']}%  gpupool {r['gpupool_alloc_pct']}%  x{r['ratio']} "
        f"(ceiling {r['ratio_ceiling']})  work waiting {r['static_waiting_pct']}% / {r['gpupool_waiting_pct']}% "
        f"of the time  in-quota p99 {r['in_quota_p99_s']} s (bound {r['in_quota_p99_bound_s']})  "
        f"thrash {r['thrash']}  Jain {r['jain']}  preemptions {r['preemptions']}"
    )


def plot(rows: list[dict], x: list[float], xlabel: str, title: str, out: str) -> None:
    """Allocation while work waits of static and gpupool against the swept quantity, with
    2x static and the 85% goal; below it, the share of the time that work waited."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, constrained_layout=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    nan = float("nan")
    sa = [nan if r["static_alloc_pct"] is None else r["static_alloc_pct"] for r in rows]
    ax.plot(x, sa, "o-", color="#d62728", label="static")
    ax.plot(x, [nan if r["gpupool_alloc_pct"] is None else r["gpupool_alloc_pct"] for r in rows], "o-",
            color="#1f77b4", label="gpupool")
    ax.plot(x, [min(100, 2 * v) for v in sa], ":", color="#d62728", label="2x static (at most 100%)")
    ax.axhline(85, color="#1f77b4", ls="--", lw=0.8, label="85% goal")
    ax.set(ylabel="GPUs allocated while work waits, %", ylim=(0, 102), title=title)  # 2x static caps at 100
    ax.legend(loc="lower left")
    ax2.plot(x, [r["static_waiting_pct"] for r in rows], "o-", color="#d62728", label="static")
    ax2.plot(x, [r["gpupool_waiting_pct"] for r in rows], "o-", color="#1f77b4", label="gpupool")
    ax2.set(xlabel=xlabel, ylabel="time work waits, %", ylim=(0, 100))
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    fig.savefig(out, dpi=110)
    plt.close(fig)
