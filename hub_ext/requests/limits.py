"""The request rules' limits for a user, from the database (works in any process)."""

from __future__ import annotations

from sqlalchemy import select

from scheduler.model import DEFAULT_POOL, NO_QUOTA, ValidationError
from scheduler.quota import department_quota

from ..config import Gpupool
from ..db.tables import NodeRow
from ..org import policy
from ..org import projects as org
from .rules import Limits


def limits_for(s, cfg: Gpupool, user: str, projects: tuple[str, ...] | None = None) -> Limits:
    """``projects``: where the user may submit (hub_ext.org.roles.submit_projects); default: the
    projects they are a member of."""
    nodes = s.scalars(select(NodeRow)).all()
    gpus = [g for n in nodes for g in n.gpus]
    projects = tuple(org.projects_of(s, user)) if projects is None else projects
    pools = tuple(sorted({n.pool for n in nodes} | {DEFAULT_POOL}))
    pool_gpus: dict[str, int] = {}
    for n in nodes:
        pool_gpus[n.pool] = pool_gpus.get(n.pool, 0) + len(n.gpus)
    return Limits(
        projects=projects,
        max_gpus=max((len(n.gpus) for n in nodes), default=0),
        gpu_memory_gib=max((g["memory_mib"] for g in gpus), default=0) / 1024,
        max_cpu=cfg.max_cpu,
        max_memory_gib=cfg.max_memory_gib,
        environments=tuple(cfg.environments) or ("default",),
        vscode=bool(cfg.code_server),
        cluster_gpus=len(gpus),
        quotas=_quotas(s, projects, pools),
        pool_gpus=pool_gpus,
        policies=policy.all_effective(s, projects),
        templates=dict(cfg.compute_templates),
        node_pools=pools,
        gpu_models=tuple(sorted({g["model"] for g in gpus})),
    )


def _quotas(s, projects: tuple[str, ...], pools: tuple[str, ...]) -> dict:
    """Per project: its scheduler model and its department's quota in each pool (the model's
    rule). A pool where the project's or the department's stored value is one the model
    refuses is left out, as the scheduler leaves it out of scheduling: its work is accepted
    and waits with that reason."""
    models = {p.name: p for p in org.model_projects(s)}
    depts = {d.name: d for d in org.model_departments(s)}
    out = {}
    for name in projects:
        p = models.get(name)
        d = depts.get(p.department) if p is not None else None
        if d is None:
            continue
        siblings = [q for q in models.values() if q.department == d.name]
        by_pool = {}
        for pool in sorted(set(pools) | set(p.quotas) | set(d.quotas)):
            try:
                dq = department_quota(d, siblings, pool)
                for q in (p.quotas.get(pool, NO_QUOTA), dq):
                    q.validate(f"project[{name}]")
            except (ValidationError, TypeError):
                continue
            by_pool[pool] = dq
        out[name] = (p, by_pool)
    return out
