"""The spawn form: JupyterHub's ``options_form``, rendered from ``templates/form.html``
with the user's projects, their quota and usage per node pool, and the last choices. While
it stays open its script takes the live figures again from the service's ``GET /capacity``
(hub_ext.requests.capacity), with a short-lived token of the user's made for it here: the form is a
hub page, and the service's API takes no hub cookie. A user has at most one such token:
every form shows the same one until less than half its lifetime is left, then a new one
replaces it. As its fields change the form asks the same endpoint what Start would answer to
them (``POST /capacity``, hub_ext.requests.capacity.answer): the panel says the request rules' own
words and holds no rule of its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from ..requests import capacity
from ..requests.rules import (
    FRACTION_MAX,
    FRACTION_MIN,
    FRACTION_STEP,
    GPU_MEMORY_MIN,
    GPU_MEMORY_STEP,
    WORKSPACE_KINDS,
    WorkloadRequest,
)

NOTICE_S = 900  # how long the form names a request that was cancelled while queued
FORM_REFRESH_MS = 5000  # how often an open form takes the free capacity again
FORM_TOKEN_S = 4 * 3600  # how long an open form keeps taking it (its token's lifetime)
SERVICE = "gpupool"
FORM_TOKEN_NOTE = "gpupool spawn form (live capacity)"
# the user's form token as made (the hub keeps only its hash), by user name; a hub that
# restarts makes a new one and removes the old
_form_tokens: dict[str, str] = {}

_env = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
    autoescape=select_autoescape(["html"]),
)


def form_context(rt, user: str, scopes=(), workload: str = "", live_url: str = "", token: str = "") -> dict:
    """``workload``: the server's workload name, to name its request if it was just cancelled;
    ``live_url`` and ``token``: where and with what the open form takes the live figures
    again (none: it does not)."""
    limits = rt.limits(user, scopes)
    cancelled = rt.store.cancelled_since(workload, time.time() - NOTICE_S) if workload else None
    last = rt.store.last_options(user)
    if last.get("project") not in limits.projects:
        last.pop("project", None)
    defaults = WorkloadRequest(project=limits.projects[0] if limits.projects else "").to_dict()
    choice = {**defaults, **{k: v for k, v in last.items() if k in defaults}}
    with rt.Session() as s:
        # what Start would answer to the choices the form opens with (the form asks again
        # for every change)
        live = {**capacity.status(s, limits), "request": capacity.answer(s, limits, _as_form(choice))}
    gpu = max((g for n in rt.backend.nodes for g in n.gpus), key=lambda g: g.memory_mib, default=None)
    allowed = {p: {"templates": list(limits.allowed(p, "templates", limits.templates)),
                   "environments": list(limits.allowed(p, "environments", limits.environments)),
                   "node_pools": list(limits.allowed(p, "node_pools", limits.node_pools)),
                   "gpu_models": list(limits.allowed(p, "gpu_models", limits.gpu_models))}
               for p in limits.projects}
    return {
        "limits": limits,
        "choice": choice,
        "cancelled": cancelled.message if cancelled is not None else "",
        "kinds": {k: v for k, v in WORKSPACE_KINDS.items() if k != "vscode" or limits.vscode},
        "environments": rt.cfg.environments,
        "templates": rt.cfg.compute_templates,
        "pools": live["pools"],
        "refresh_ms": FORM_REFRESH_MS,
        # per project: what its policy allows (the rules refuse the rest, naming the policy)
        "allowed": allowed,
        "fraction": {"min": FRACTION_MIN, "max": FRACTION_MAX, "step": FRACTION_STEP},
        "gpu_memory": {"min": GPU_MEMORY_MIN, "max": limits.gpu_memory_max_gib, "step": GPU_MEMORY_STEP},
        "gpu_model": gpu.model if gpu else "none",
        "attachables": rt.attachables(limits.projects),  # credentials, data sources by project
        # in a <script> element: "</" is escaped so that no value can close it
        "status_json": _script_json({
            "templates": rt.cfg.compute_templates, "allowed": allowed,
            "live_url": live_url, "token": token}),
        "live_json": _script_json(live),
    }


def _as_form(choice: dict) -> dict:
    """The choices as the form shows them: the fields of the GPU mode chosen, the memory and
    GPU fields' own fallbacks (templates/form.html)."""
    out = {k: v for k, v in choice.items() if k in ("project", "template", "workspace_kind", "gpu_mode",
                                                   "cpu", "memory_gib", "environment", "node_pool",
                                                   "gpu_model", "preemptible", "credentials", "datasources")}
    out.update(gpu_fraction=choice.get("gpu_fraction"), gpu_memory_gib=choice.get("gpu_memory_gib") or 8,
               gpus=choice.get("gpus") or 1)
    return out


def _script_json(data) -> str:
    return json.dumps(data).replace("</", "<\\/")


def live_access(spawner) -> tuple[str, str]:
    """(the service's ``GET /capacity`` URL, a token of the user's for it that expires after
    FORM_TOKEN_S, holding only the access to the service and the user's gpupool scopes);
    ("", "") without a hub user (unit tests)."""
    try:
        user, base = spawner.user, spawner.hub.base_url
        own = {s for s in spawner.hub_scopes if s.startswith("custom:gpupool")}
    except AttributeError:
        return "", ""
    if not hasattr(user, "new_api_token"):
        return "", ""
    token = form_token(user, sorted(own | {f"access:services!service={SERVICE}"}))
    prefix = base[: -len("hub/")] if base.endswith("hub/") else base
    return f"{prefix}services/{SERVICE}/api/v1/capacity", token


def form_token(user, scopes: list[str]) -> str:
    """The user's one form token with ``scopes``: the one made before while it is valid for
    at least half of FORM_TOKEN_S more, else a new one; the user's other form tokens go."""
    from jupyterhub.orm import APIToken

    db, held = user.db, _form_tokens.get(user.name)
    keep = APIToken.find(db, held) if held else None  # None: revoked or expired
    if keep is not None and (keep.user_id != user.orm_user.id or keep.note != FORM_TOKEN_NOTE
                             or sorted(keep.scopes) != scopes or keep.expires_at is None
                             or (keep.expires_at - keep.now()).total_seconds() < FORM_TOKEN_S / 2):
        keep = None
    stale = [t for t in user.orm_user.api_tokens if t.note == FORM_TOKEN_NOTE and t is not keep]
    for t in stale:
        db.delete(t)
    if stale:
        db.commit()
    if keep is not None:
        return held
    token = user.new_api_token(note=FORM_TOKEN_NOTE, expires_in=FORM_TOKEN_S, scopes=scopes)
    _form_tokens[user.name] = token
    return token


def render_form(spawner) -> str:
    rt = spawner.gpupool
    scopes = getattr(spawner, "hub_scopes", ())
    url, token = live_access(spawner)
    return _env.get_template("form.html").render(
        **form_context(rt, spawner.user.name, scopes, spawner.workload, url, token))
