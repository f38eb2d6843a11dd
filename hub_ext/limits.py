"""The request rules' limits for a user, from the database (works in any process)."""

from __future__ import annotations

from sqlalchemy import select

from . import org
from .config import Gpupool
from .db import NodeRow
from .requests import Limits


def limits_for(s, cfg: Gpupool, user: str, projects: tuple[str, ...] | None = None) -> Limits:
    """``projects``: where the user may submit (hub_ext.roles.submit_projects); default: the
    projects they are a member of."""
    nodes = s.scalars(select(NodeRow)).all()
    gpus = [g for n in nodes for g in n.gpus]
    return Limits(
        projects=tuple(org.projects_of(s, user)) if projects is None else projects,
        max_gpus=max((len(n.gpus) for n in nodes), default=0),
        gpu_memory_gib=max((g["memory_mib"] for g in gpus), default=0) / 1024,
        max_cpu=cfg.max_cpu,
        max_memory_gib=cfg.max_memory_gib,
        environments=tuple(cfg.environments) or ("default",),
        vscode=bool(cfg.code_server),
    )
