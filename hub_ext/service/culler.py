"""Idle culler: stop workspaces idle longer than ``cull_idle_s`` (or their project's
policy's idle timeout), and end workspaces and trainings that ran past their policy's
maximum runtime, with an event naming the policy.

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

from .. import policy
from ..activity import Activity, is_fraction, workload_activity
from ..db import WorkloadRow, bump_version
from ..events import add_event
from ..inventory import gpu_utilization
from ..requests import workload_name
from ..training.db import TrainingRow

log = logging.getLogger("gpupool.culler")


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def idle_servers(users: list[dict], rows: dict[str, WorkloadRow], util: dict[int, float] | None,
                 busy_since: dict[str, float], now: float, idle_s: float, util_pct: float,
                 activity: Callable[[str], Activity | None] = workload_activity,
                 counts: dict[str, int] | None = None, idle_for: dict[str, float] | None = None) -> list:
    """(user, server) pairs to stop. ``busy_since`` remembers the last time a workspace's
    GPUs were busy, ``counts`` the launch and allocation count of each fraction at that
    check (both updated here); ``idle_for``: per project, its policy's idle timeout."""
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
            limit = idle_for.get(row.project, idle_s) if idle_for and row is not None else idle_s
            if limit and now - last > limit:
                out.append((u["name"], server))
    return out


def over_runtime(s, now: float) -> list[tuple[WorkloadRow, str]]:
    """Running workloads past their policy's maximum runtime for their kind, each with the
    event's message."""
    rows = s.scalars(select(WorkloadRow).where(WorkloadRow.state == "running",
                                               WorkloadRow.start_time.is_not(None))).all()
    pols = policy.all_effective(s, {w.project for w in rows})
    out = []
    for w in rows:
        most = pols[w.project].runtime_s(w.kind)
        if most is not None and now - w.start_time > most:
            whose = pols[w.project].whose(f"max_runtime_{w.kind}_s")
            out.append((w, (f"{w.name} reached the maximum runtime of a {w.kind} ({most} s, "
                            f"{whose}); stopped")))
    return out


async def end_over_runtime(ctx, now: float) -> None:
    with ctx.Session() as s:
        todo = []
        for w, message in over_runtime(s, now):
            add_event(s, "stopped", message, w.name, w.project)
            job = s.get(TrainingRow, w.name) if w.kind == "training" else None
            if job is not None:
                job.request = "suspend"  # the job runner ends it; it may be resumed
            elif w.kind == "workspace":
                todo.append((w.owner, w.server))
            else:  # the hub's runtime ends what it started, as a stop through the API
                w.state = "stopping"
                bump_version(s)
            log.info("%s", message)
        s.commit()
    for owner, server in todo:
        await ctx.hub.stop_server(owner, server)


def idle_timeouts(s, projects) -> dict[str, float]:
    """Per project with a policy's workspace idle timeout: that timeout."""
    pols = policy.all_effective(s, projects)
    return {p: e.idle_s("workspace") for p, e in pols.items() if e.idle_s("workspace") is not None}


async def run(ctx) -> None:
    busy_since: dict[str, float] = {}
    counts: dict[str, int] = {}
    while True:
        await asyncio.sleep(ctx.cfg.cull_every_s)
        try:
            await end_over_runtime(ctx, time.time())
            code, users = await ctx.hub.users()
            if code >= 400 or not isinstance(users, list):
                continue
            with ctx.Session() as s:
                rows = {w.name: w for w in s.scalars(select(WorkloadRow).where(WorkloadRow.kind == "workspace"))}
                idle_for = idle_timeouts(s, {w.project for w in rows.values()})
            for user, server in idle_servers(users, rows, gpu_utilization(), busy_since, time.time(),
                                             ctx.cfg.cull_idle_s, ctx.cfg.cull_gpu_util_pct,
                                             counts=counts, idle_for=idle_for):
                log.info("culling idle workspace %s/%s", user, server)
                await ctx.hub.stop_server(user, server)
        except Exception:
            log.exception("culler pass failed")
