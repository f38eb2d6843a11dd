"""The replay's chart: allocation over time for every policy on one axis, and one small
panel per project with its quota and what each policy gave it. matplotlib (Agg) is only
imported here, so the replay itself runs without it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..model import MILLI
from .replay import PolicyResult

COLORS = {"static": "#d62728", "fifo-shared": "#7f7f7f", "gpupool": "#1f77b4"}


def plot(results: list[PolicyResult], capacity_milli: int, window_end_s: float, title: str, out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    projects = results[0].projects
    cols = 4
    rows = math.ceil(len(projects) / cols)
    fig = plt.figure(figsize=(13, 4.2 + 2.2 * rows), constrained_layout=True)
    grid = fig.add_gridspec(1 + rows, cols, height_ratios=[2.2] + [1] * rows)
    horizon = window_end_s * 1.15 + 600
    hours = 3600.0

    ax = fig.add_subplot(grid[0, :])
    for r in results:
        t, y = _clip(r.series_t, r.series_total, horizon)
        m = r.metrics
        label = f"{r.policy}: {m['gpu_allocation_mean_pct']}% allocated while work waits"
        ax.step(t / hours, 100 * y / capacity_milli, where="post", color=COLORS.get(r.policy), lw=1.1, label=label)
    ax.axvline(window_end_s / hours, color="k", ls=":", lw=0.8)
    ax.text(window_end_s / hours, 2, " last arrival", fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_xlim(0, horizon / hours)
    ax.set_ylabel("GPUs allocated, % of cluster")
    ax.set_xlabel("simulated hours")
    ax.set_title(title)
    ax.legend(loc="lower center", fontsize=9)
    ax.grid(alpha=0.3)

    for i, p in enumerate(projects):
        a = fig.add_subplot(grid[1 + i // cols, i % cols])
        for r in results:
            if r.policy == "fifo-shared":
                continue  # no quotas there; its per-team share is in the top panel's total
            t, y = _clip(r.series_t, r.series_proj[:, i], horizon)
            a.step(t / hours, y / MILLI, where="post", color=COLORS.get(r.policy), lw=0.9, label=r.policy)
        q = results[0].quota_milli[p] / MILLI
        a.axhline(q, color="k", ls="--", lw=0.9, label="quota")
        a.set_title(p, fontsize=9)
        a.set_xlim(0, horizon / hours)
        a.tick_params(labelsize=7)
        a.grid(alpha=0.3)
        if i % cols == 0:
            a.set_ylabel("GPUs", fontsize=8)
        if i == 0:
            a.legend(fontsize=7, loc="upper left")
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _clip(t: np.ndarray, y: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    keep = t <= horizon
    return np.append(t[keep], horizon), np.append(y[keep], y[keep][-1] if keep.any() else 0)
