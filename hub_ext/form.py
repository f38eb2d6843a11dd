"""The spawn form: JupyterHub's ``options_form``, rendered from ``templates/form.html``
with the user's projects, their quota and usage, and the last choices."""

from __future__ import annotations

import json
import time
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from scheduler.model import MILLI

from .requests import (
    FRACTION_MAX,
    FRACTION_MIN,
    FRACTION_STEP,
    WORKSPACE_KINDS,
    WorkloadRequest,
    project_ceilings,
)

NOTICE_S = 900  # how long the form names a request that was cancelled while queued
FORM_REFRESH_MS = 5000  # how often an open form takes the free capacity again

_env = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
    autoescape=select_autoescape(["html"]),
)


def form_context(rt, user: str, scopes=(), workload: str = "") -> dict:
    """``workload``: the server's workload name, to name its request if it was just cancelled."""
    limits = rt.limits(user, scopes)
    cancelled = rt.store.cancelled_since(workload, time.time() - NOTICE_S) if workload else None
    last = rt.store.last_options(user)
    if last.get("project") not in limits.projects:
        last.pop("project", None)
    defaults = WorkloadRequest(project=limits.projects[0] if limits.projects else "").to_dict()
    choice = {**defaults, **{k: v for k, v in last.items() if k in defaults}}
    gpu = max((g for n in rt.nodes for g in n.gpus), key=lambda g: g.memory_mib, default=None)
    return {
        "limits": limits,
        "choice": choice,
        "cancelled": cancelled.message if cancelled is not None else "",
        "kinds": {k: v for k, v in WORKSPACE_KINDS.items() if k != "vscode" or limits.vscode},
        "environments": rt.cfg.environments,
        "templates": rt.cfg.compute_templates,
        "pools": rt.free_per_pool(),
        "refresh_ms": FORM_REFRESH_MS,
        # per project: what its policy allows (the rules refuse the rest, naming the policy)
        "allowed": {p: {"templates": list(limits.allowed(p, "templates", limits.templates)),
                        "environments": list(limits.allowed(p, "environments", limits.environments)),
                        "node_pools": list(limits.allowed(p, "node_pools", limits.node_pools)),
                        "gpu_models": list(limits.allowed(p, "gpu_models", limits.gpu_models))}
                    for p in limits.projects},
        "fraction": {"min": FRACTION_MIN, "max": FRACTION_MAX, "step": FRACTION_STEP},
        "gpu_model": gpu.model if gpu else "none",
        "attachables": rt.attachables(limits.projects),  # credentials, data sources by project
        # in a <script> element: "</" is escaped so that no value can close it
        "status_json": json.dumps(
            {**rt.project_status(limits.projects),
             "gpu_memory_gib": limits.gpu_memory_gib, "max_gpus": limits.max_gpus,
             "ceilings": _ceilings(limits), "templates": rt.cfg.compute_templates,
             "allowed": {p: {"templates": list(limits.allowed(p, "templates", limits.templates)),
                             "environments": list(limits.allowed(p, "environments", limits.environments)),
                             "node_pools": list(limits.allowed(p, "node_pools", limits.node_pools))}
                         for p in limits.projects}}
        ).replace("</", "<\\/"),
    }


def _ceilings(limits) -> dict:
    """Per project, preemptible or not: [GPUs, what sets it] that no request may pass, the
    request rules' own (requests.check_can_run), so the form says what a submit would."""
    return {p: {mode: [[m / MILLI, why] for m, why in project_ceilings(limits, p, over)]
                for mode, over in (("preemptible", True), ("guaranteed", False))}
            for p in limits.projects}


def render_form(spawner) -> str:
    rt = spawner.gpupool
    scopes = getattr(spawner, "hub_scopes", ())
    return _env.get_template("form.html").render(
        **form_context(rt, spawner.user.name, scopes, spawner.workload))
