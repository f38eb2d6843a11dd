"""What the spawn form's verdict reads, live: per node pool its GPUs and how many are free,
and per project of the user its quota, limit and use in each pool, with the ceilings no
request may pass there (the request rules' own, requests.project_ceilings). The form
embeds it when rendered and takes it again from ``GET /capacity`` while it stays open.
From the database, so the hub and the service, and both backends, say the same.

``answer`` is what Start would answer to the form's exact input: the request rules' own
refusal (``parse_request``), or the GPUs the request counts and what its share means on the
GPUs it may land on. The form asks for it (``POST /capacity``) as its fields change, so the
panel holds no rule of its own."""

from __future__ import annotations

from sqlalchemy import select

from scheduler.contract import share_env
from scheduler.model import DEFAULT_POOL, MILLI

from .. import humanize, validation
from ..db.tables import NodeRow
from ..org import projects as org
from ..org.sharing import gpu_sharing
from ..validation import FieldError
from .rules import Limits, WorkloadRequest, parse_request, project_ceilings, request_pools

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


def answer(s, limits: Limits, data) -> dict:
    """What Start would answer to ``data``: the spawn form's fields as it sends them (lists
    of strings) or a ``POST /workloads`` body. Refused: ``{"ok": false, "field", "message"}``,
    the message as Start says it ("gpu_fraction: must be from 0.05 to 1, got '0'"). Else
    ``{"ok": true, "gpus", "one_gpu", "share"}``: the GPUs it counts against its project's
    quota (on the largest GPU), whether that is a share of one GPU, and what it means on the
    GPUs it may land on (``share``, a sentence)."""
    if not isinstance(data, dict):
        return _refused(FieldError("body", "must be a JSON object"))
    data = dict(data)
    server = data.pop("server_name", "")
    try:
        validation.name(server[0] if isinstance(server, list) and server else server or "",
                        "server_name", "server")
        req = parse_request(data, limits)
    except FieldError as e:
        return _refused(e)
    demand = req.demand()
    largest = max(1, round(limits.gpu_memory_gib * 1024))
    return {"ok": True, "gpus": round(demand.gpu_count * demand.milli_on(largest) / MILLI, 3),
            "one_gpu": demand.is_fractional, "share": share(req, _models(s, limits, req))}


def _refused(e: FieldError) -> dict:
    return {"ok": False, "field": e.field, "message": str(e)}


def _models(s, limits: Limits, req: WorkloadRequest) -> list[tuple[str, int]]:
    """(GPU model, its memory in MiB) of the GPUs ``req`` may land on: the model it names, in
    the node pools it may run in; largest first."""
    pools = set(request_pools(limits, req.node_pool))
    found: dict[str, int] = {}
    for n in s.scalars(select(NodeRow)).all():
        if n.pool not in pools:
            continue
        for g in n.gpus:
            if not req.gpu_model or g["model"] == req.gpu_model:
                found[g["model"]] = max(found.get(g["model"], 0), int(g["memory_mib"]))
    return sorted(found.items(), key=lambda m: (-m[1], m[0]))


def _article(model: str) -> str:
    return "an" if model[:1].upper() in "AEIOU" or model.upper().startswith("NVIDIA") else "a"


def share(req: WorkloadRequest, models: list[tuple[str, int]]) -> str:
    """What the request's GPU means on each GPU model it may land on, in the interception
    library's own figures (scheduler.contract.share_env): "0.25 of an NVIDIA H100 80GB HBM3:
    19.9 GiB of GPU memory and a 25% compute share"."""
    if req.gpu_mode == "none":
        return "No GPU: CPUs and memory only."
    if not models:
        return "No GPU of this kind in the node pools this request may run in."
    demand, parts = req.demand(), []
    for model, mib in models:
        gpu = f"{_article(model)} {model}"
        if demand.gpus:
            n = demand.gpus
            each = "" if n == 1 else " each"
            parts.append(f"{n} whole {model} GPU{'s' if n != 1 else ''}: {humanize.mib(mib)} of GPU memory "
                         f"and all of its compute{each}")
            continue
        milli = demand.milli_on(mib)
        env = share_env(mib, milli, demand.gpu_memory_mib)
        memory = humanize.size(int(env["GPUPOOL_MEMORY_LIMIT"]))
        pct = env["GPUPOOL_COMPUTE_SHARE"]
        compute = f"{'an' if pct in ('8', '11', '18') or pct[:1] == '8' and len(pct) == 2 else 'a'} {pct}% compute share"
        if req.gpu_mode == "memory":
            parts.append(f"{memory} of GPU memory on {gpu}: {milli / MILLI:g} of it, {compute}")
        else:
            parts.append(f"{milli / MILLI:g} of {gpu}: {memory} of GPU memory and {compute}")
    return "; ".join(parts) + "."
