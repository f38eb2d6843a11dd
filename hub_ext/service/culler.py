"""Idle culler: stop workspaces idle longer than ``cull_idle_s``.

Idle means, for a workspace on a fraction of a GPU: no kernel launch and no allocation
counted by the interception library in the workspace's own shared account since the last
check (a neighbour on the same GPU does not count, NVML cannot tell them apart); on whole
GPUs found through NVML, GPU utilization at or under ``cull_gpu_util_pct`` since the last
check on every GPU the workspace holds; without GPUs, no JupyterHub activity
(``last_activity``) for that long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select

from ..activity import Activity, is_fraction, workload_activity
from ..db import WorkloadRow
from ..inventory import gpu_utilization
from ..requests import workload_name

log = logging.getLogger("gpupool.culler")


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def idle_servers(users: list[dict], rows: dict[str, WorkloadRow], util: dict[int, float] | None,
                 busy_since: dict[str, float], now: float, idle_s: float, util_pct: float,
                 activity: Callable[[str], Activity | None] = workload_activity,
                 counts: dict[str, int] | None = None) -> list:
    """(user, server) pairs to stop. ``busy_since`` remembers the last time a workspace's
    GPUs were busy, ``counts`` the launch and allocation count of each fraction at that
    check (both updated here)."""
    counts = {} if counts is None else counts
    # a workspace stopped since the last pass starts afresh when it comes back (its account
    # file keeps the old count)
    for gone in [n for n in busy_since if n not in rows]:
        busy_since.pop(gone, None)
        counts.pop(gone, None)
    out = []
    for u in users:
        for server, model in (u.get("servers") or {}).items():
            if not model.get("ready"):
                continue
            name = workload_name(u["name"], server)
            row = rows.get(name)
            last = _ts(model.get("last_activity"))
            act = activity(name) if row is not None and is_fraction(row.placement) else None
            if act is not None:
                if counts.get(name) != act.count or name not in busy_since:
                    busy_since[name] = now
                counts[name] = act.count
                last = busy_since[name]
            elif util is not None and row is not None and row.placement:
                gpus = [i for p in row.placement for i in p["gpu_indices"]]
                if any(util.get(i, 0.0) > util_pct for i in gpus) or name not in busy_since:
                    busy_since[name] = now
                last = busy_since[name]
            if now - last > idle_s:
                out.append((u["name"], server))
    return out


async def run(ctx) -> None:
    busy_since: dict[str, float] = {}
    counts: dict[str, int] = {}
    while True:
        await asyncio.sleep(ctx.cfg.cull_every_s)
        try:
            code, users = await ctx.hub.users()
            if code >= 400 or not isinstance(users, list):
                continue
            with ctx.Session() as s:
                rows = {w.name: w for w in s.scalars(select(WorkloadRow).where(WorkloadRow.kind == "workspace"))}
            for user, server in idle_servers(users, rows, gpu_utilization(), busy_since, time.time(),
                                             ctx.cfg.cull_idle_s, ctx.cfg.cull_gpu_util_pct,
                                             counts=counts):
                log.info("culling idle workspace %s/%s", user, server)
                await ctx.hub.stop_server(user, server)
        except Exception:
            log.exception("culler pass failed")
