"""Idle culler: stop workspaces idle longer than ``cull_idle_s`` (or their project's
policy's idle timeout), suspend trainings idle longer than their policy's training idle
timeout, and end workspaces and trainings that ran past their policy's maximum runtime,
each with an event naming the policy.

One idleness rule for every process on GPUs (``last_busy``), a workspace or one training
worker: on a fraction of a GPU, no kernel launch and no allocation counted by the
interception library in the process's own shared account since the last check (a
neighbour on the same GPU does not count, NVML cannot tell them apart); on whole GPUs
found through NVML, GPU utilization at or under ``cull_gpu_util_pct`` since the last check
on every GPU it holds. A workspace without GPUs falls back on JupyterHub activity
(``last_activity``); a training is idle only when every worker is, and one whose GPU use
cannot be told (no GPUs, whole GPUs without NVML) is never idle. Services are not culled:
the autoscaler scales them to zero (``inference/autoscaler.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select

from ..backends import mode
from ..db.events import add_event
from ..db.tables import WorkloadRow, bump_version
from ..host.activity import Activity, is_fraction
from ..host.inventory import gpu_utilization
from ..org import policy
from ..requests.rules import workload_name
from ..training.db import TrainingRow, worker_region

log = logging.getLogger("gpupool.culler")


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _unseen(region: str) -> Activity | None:
    return None


def last_busy(key: str, region: str, pods: list[dict], util: dict[int, float] | None,
              busy_since: dict[str, float], counts: dict[str, int], now: float, util_pct: float,
              activity: Callable[[str], Activity | None] = _unseen) -> float | None:
    """When the GPUs of one process (``pods``: its placement) were last seen busy, or None
    where that cannot be told. ``key`` names it in ``busy_since`` and ``counts`` (both
    updated here), ``region`` is its interception library account. First sight counts as
    busy."""
    act = activity(region) if is_fraction(pods) else None
    if act is not None:
        if counts.get(key) != act.count or key not in busy_since:
            busy_since[key] = now
        counts[key] = act.count
        return busy_since[key]
    gpus = [i for p in pods for i in p["gpu_indices"]]
    if util is not None and gpus:
        if any(util.get(i, 0.0) > util_pct for i in gpus) or key not in busy_since:
            busy_since[key] = now
        return busy_since[key]
    return None


def _forget_all_but(keys: set[str], busy_since: dict[str, float], counts: dict[str, int]) -> None:
    """A process gone since the last pass starts afresh when it comes back (its account
    file keeps the old count)."""
    for gone in [k for k in busy_since if k not in keys]:
        busy_since.pop(gone, None)
        counts.pop(gone, None)


def idle_servers(users: list[dict], rows: dict[str, WorkloadRow], util: dict[int, float] | None,
                 busy_since: dict[str, float], now: float, idle_s: float, util_pct: float,
                 activity: Callable[[str], Activity | None] = _unseen,
                 counts: dict[str, int] | None = None, idle_for: dict[str, float] | None = None) -> list:
    """(user, server) pairs to stop. ``busy_since`` and ``counts``: ``last_busy``'s memory
    of the workspaces; ``idle_for``: per project, its policy's idle timeout."""
    counts = {} if counts is None else counts
    _forget_all_but(set(rows), busy_since, counts)
    out = []
    for u in users:
        for server, model in (u.get("servers") or {}).items():
            if not model.get("ready"):
                continue
            name = workload_name(u["name"], server)
            row = rows.get(name)
            last = last_busy(name, name, row.placement or [], util, busy_since, counts, now,
                             util_pct, activity) if row is not None else None
            if last is None:
                last = _ts(model.get("last_activity"))
            limit = idle_for.get(row.project, idle_s) if idle_for and row is not None else idle_s
            if limit and now - last > limit:
                out.append((u["name"], server))
    return out


def idle_trainings(rows: list[WorkloadRow], util: dict[int, float] | None,
                   busy_since: dict[str, float], counts: dict[str, int], now: float,
                   util_pct: float, idle_for: dict[str, float],
                   activity: Callable[[str], Activity | None] = _unseen) -> list[WorkloadRow]:
    """Running trainings idle longer than their project's training idle timeout
    (``idle_for``): every worker's GPUs idle (``last_busy``, per worker) that long."""
    watched: set[str] = set()
    out = []
    for w in rows:
        limit = idle_for.get(w.project)
        pods = w.placement or []
        if not limit or not pods:
            continue
        lasts = []
        for rank, pod in enumerate(pods):  # the runner places worker RANK on pods[RANK]
            key = f"{w.name}/{w.start_time}/{rank}"  # a training placed again starts afresh
            watched.add(key)
            lasts.append(last_busy(key, worker_region(w.name, rank), [pod], util, busy_since,
                                   counts, now, util_pct, activity))
        seen = [t for t in lasts if t is not None]
        if len(seen) == len(lasts) and now - max(seen) > limit:
            out.append(w)
    _forget_all_but(watched, busy_since, counts)
    return out


def over_runtime(s, now: float) -> list[tuple[WorkloadRow, str, str]]:
    """Running workloads past their policy's maximum runtime for their kind, each with the
    event's message and the reason a training shows."""
    rows = s.scalars(select(WorkloadRow).where(WorkloadRow.state == "running",
                                               WorkloadRow.start_time.is_not(None))).all()
    pols = policy.all_effective(s, {w.project for w in rows})
    out = []
    for w in rows:
        most = pols[w.project].runtime_s(w.kind)
        if most is not None and now - w.start_time > most:
            limit = f"the maximum runtime of a {w.kind} ({most} s, {pols[w.project].whose(f'max_runtime_{w.kind}_s')})"
            out.append((w, f"{w.name} reached {limit}; stopped", f"reached {limit}"))
    return out


def run_of(w: WorkloadRow) -> str:
    """One run of a workload: placed again (resumed, requeued), it is another."""
    return f"{w.name}@{w.start_time}"


def end(s, w: WorkloadRow, message: str, reason: str, ended: set[str]) -> tuple[str, str] | None:
    """End a workload for its policy, with a ``stopped`` event: a training is suspended
    (its runner ends it; it may be resumed) showing ``reason``, and kept in ``ended`` while
    its workers take their grace period; a workspace is returned as (owner, server) for the
    hub to stop; the hub's runtime ends anything else, as a stop through the API. Caller
    commits."""
    job = s.get(TrainingRow, w.name) if w.kind == "training" else None
    add_event(s, "stopped", message, w.name, w.project)
    log.info("%s", message)
    if job is not None:
        job.request, job.request_reason = "suspend", reason
        ended.add(run_of(w))
    elif w.kind == "workspace":
        return (w.owner, w.server)
    else:
        w.state = "stopping"
        bump_version(s)
    return None


async def _stop_servers(ctx, servers: list[tuple[str, str] | None]) -> None:
    for one in servers:
        if one is not None:
            await ctx.hub.stop_server(*one)


async def end_over_runtime(ctx, now: float, ended: set[str]) -> None:
    with ctx.Session() as s:
        todo = [end(s, w, message, reason, ended) for w, message, reason in over_runtime(s, now)
                if run_of(w) not in ended]
        s.commit()
    await _stop_servers(ctx, todo)


def idle_timeouts(s, projects) -> dict[str, float]:
    """Per project with a policy's workspace idle timeout: that timeout."""
    pols = policy.all_effective(s, projects)
    return {p: t for p, e in pols.items() if (t := e.idle_s("workspace")) is not None}


def end_idle_trainings(ctx, util, busy_since: dict[str, float], counts: dict[str, int],
                       now: float, ended: set[str], activity=_unseen) -> None:
    with ctx.Session() as s:
        rows = s.scalars(select(WorkloadRow).where(WorkloadRow.kind == "training",
                                                   WorkloadRow.state == "running")).all()
        pols = policy.all_effective(s, {w.project for w in rows})
        idle_for: dict[str, float] = {p: t for p, e in pols.items() if (t := e.idle_s("training")) is not None}
        for w in idle_trainings(rows, util, busy_since, counts, now, ctx.cfg.cull_gpu_util_pct,
                                idle_for, activity):
            if run_of(w) in ended:
                continue
            limit = (f"the idle timeout of a training ({idle_for[w.project]:g} s, "
                     f"{pols[w.project].whose('idle_timeout_training_s')})")
            end(s, w, f"{w.name}: no GPU activity on any of its workers for longer than {limit}; "
                "suspended", f"idle longer than {limit}", ended)
        s.commit()


async def run(ctx) -> None:
    busy_since: dict[str, float] = {}
    counts: dict[str, int] = {}
    workers_busy: dict[str, float] = {}
    workers_counts: dict[str, int] = {}
    ended: set[str] = set()
    activity = mode(ctx.cfg).activity(ctx.cfg)
    while True:
        await asyncio.sleep(ctx.cfg.cull_every_s)
        try:
            with ctx.Session() as s:
                running = {run_of(w) for w in s.scalars(select(WorkloadRow).where(WorkloadRow.state == "running"))}
            ended &= running
            util = gpu_utilization()
            refresh = getattr(activity, "refresh", None)
            if refresh is not None:  # counters published elsewhere (the cluster's nodes)
                await refresh()
            await end_over_runtime(ctx, time.time(), ended)
            end_idle_trainings(ctx, util, workers_busy, workers_counts, time.time(), ended, activity)
            code, users = await ctx.hub.users()
            if code >= 400 or not isinstance(users, list):
                continue
            with ctx.Session() as s:
                rows = {w.name: w for w in s.scalars(select(WorkloadRow).where(WorkloadRow.kind == "workspace"))}
                idle_for = idle_timeouts(s, {w.project for w in rows.values()})
            for user, server in idle_servers(users, rows, util, busy_since, time.time(),
                                             ctx.cfg.cull_idle_s, ctx.cfg.cull_gpu_util_pct,
                                             activity, counts, idle_for):
                log.info("culling idle workspace %s/%s", user, server)
                await ctx.hub.stop_server(user, server)
        except Exception:
            log.exception("culler pass failed")
