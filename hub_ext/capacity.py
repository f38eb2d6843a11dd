"""What the spawn form's verdict reads, live: per node pool its GPUs and how many are free,
and per project of the user its quota, limit and use in each pool, with the ceilings no
request may pass there (the request rules' own, requests.project_ceilings). The form
embeds it when rendered and takes it again from ``GET /capacity`` while it stays open.
From the database, so the hub and the service, and both backends, say the same."""

from __future__ import annotations

from scheduler.model import DEFAULT_POOL, MILLI

from . import org
from .requests import Limits, project_ceilings
from .sharing import gpu_sharing

_EPS = 1e-9


def pools(s) -> tuple[dict[str, dict], dict[tuple[str, str], float]]:
    """(per node pool: GPUs, GPUs free, the largest free share of one GPU, idle whole GPUs,
    GPU models; per (project, pool): GPUs held)."""
    nodes, share = gpu_sharing(s, None)
    out: dict[str, dict] = {}
    held: dict[tuple[str, str], float] = {}
    for n in nodes:
        pool = out.setdefault(n.pool, {"gpus": 0, "free": 0.0, "largest_free_fraction": 0.0,
                                       "whole_free": 0, "models": []})
        for g in n.gpus:
            users = share.get((n.name, g["index"]), [])
            free = max(0.0, 1.0 - sum(u["gpu"] for u in users))
            pool["gpus"] += 1
            pool["free"] += free
            pool["largest_free_fraction"] = max(pool["largest_free_fraction"], free)
            pool["whole_free"] += free >= 1.0 - _EPS
            if g["model"] not in pool["models"]:
                pool["models"].append(g["model"])
            for u in users:
                key = (u["project"], n.pool)
                held[key] = held.get(key, 0.0) + u["gpu"]
    for pool in out.values():
        pool["free"] = round(pool["free"], 3)
        pool["largest_free_fraction"] = round(pool["largest_free_fraction"], 3)
    return out, held


def _quota(p: dict, pool: str) -> tuple[float, float | None]:
    if pool == DEFAULT_POOL:
        return p["gpus"], p["limit"]
    q = p["pools"].get(pool) or {}
    return q.get("gpus", 0.0), q.get("limit")


def status(s, limits: Limits) -> dict:
    """The form's live figures for the projects of ``limits`` (where the user may submit)."""
    by_pool, held = pools(s)
    names = list(limits.node_pools) + sorted(set(by_pool) - set(limits.node_pools))
    projects = {}
    for p in org.list_projects(s, set(limits.projects)):
        per_pool = {}
        for pool in names:
            quota, limit = _quota(p, pool)
            per_pool[pool] = {"quota": quota, "limit": limit, "used": round(held.get((p["name"], pool), 0.0), 3)}
        projects[p["name"]] = {"department": p["department"], "pending": p["pending"], "pools": per_pool}
    return {
        "capacity": sum(x["gpus"] for x in by_pool.values()),
        "pools": by_pool,
        "projects": projects,
        # per project, pool, preemptible or not: [GPUs, what sets it] no request may pass
        "ceilings": {p: {pool: {mode: [[m / MILLI, why] for m, why in project_ceilings(limits, p, over, pool)]
                                for mode, over in (("preemptible", True), ("guaranteed", False))}
                         for pool in names}
                     for p in limits.projects},
    }
