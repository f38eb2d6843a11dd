"""What a user asks for (a workload request) and the one set of rules that checks it.

The spawn form, the REST API and the CLI all go through ``parse_request``; every bad
value raises ``FieldError`` naming the field and the allowed range. The GPU, CPU and memory
ask is read by the reader every kind shares (hub_ext.requests.reader).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from scheduler.model import DEFAULT_POOL, MILLI, Kind, PodDemand, Project, Quota, Workload
from scheduler.quota import ceilings

from .. import validation
from ..org.policy import Effective
from ..validation import FieldError, check_fields
from . import reader as request_reader
from .reader import (  # noqa: F401 (the request's constants, as the form and CLI read them)
    FRACTION_MAX,
    FRACTION_MIN,
    FRACTION_STEP,
    GPU_MEMORY_MIN,
    GPU_MEMORY_STEP,
    GPU_MODES,
    TEMPLATE_FIELDS,
)

KINDS = ("workspace", "training", "inference")
WORKSPACE_KINDS = {"jupyterlab": "JupyterLab", "vscode": "VS Code"}


@dataclass(frozen=True)
class Limits:
    """What the rules check against: the user's projects and the cluster's shape."""

    projects: tuple[str, ...]
    max_gpus: int = 1  # whole GPUs on the largest node
    gpu_memory_gib: float = 80.0  # largest GPU
    max_cpu: float = 16.0
    max_memory_gib: float = 128.0
    environments: tuple[str, ...] = ("default",)
    vscode: bool = False
    cluster_gpus: int | None = None  # all GPUs of all nodes; None: not checked
    # Per project: its scheduler model and its department's quota in each node pool, for the
    # ceilings no request can pass (check_can_run); a project or pool missing here is not checked.
    quotas: Mapping[str, tuple[Project, Mapping[str, Quota]]] = field(default_factory=dict)
    pool_gpus: Mapping[str, int] = field(default_factory=dict)  # node pool -> its GPUs; none: not checked
    # Per project: its policy merged with its department's (hub_ext.policy); none: not limited.
    policies: Mapping[str, Effective] = field(default_factory=dict)
    templates: Mapping[str, dict] = field(default_factory=dict)  # compute templates
    node_pools: tuple[str, ...] = (DEFAULT_POOL,)
    gpu_models: tuple[str, ...] = ()

    def policy(self, project: str) -> Effective:
        return self.policies.get(project) or Effective()

    @property
    def gpu_memory_max_gib(self) -> float:
        """The most GPU memory one request may ask for: the largest GPU's, rounded down to
        GPU_MEMORY_STEP GiB, so the form shows the bound the rules hold it to (79.6, not
        79.6474609375)."""
        return round(math.floor(self.gpu_memory_gib / GPU_MEMORY_STEP + 1e-6) * GPU_MEMORY_STEP, 6)

    def allowed(self, project: str, key: str, names) -> tuple[str, ...]:
        """``names`` (templates, environments, node pools, GPU models) the project's policy
        allows, in their order."""
        only = self.policy(project).allowed(key)
        return tuple(names) if only is None else tuple(n for n in names if n in only)


@dataclass(kw_only=True)
class WorkloadRequest(request_reader.Ask):
    project: str
    kind: str = "workspace"
    workspace_kind: str = "jupyterlab"
    gpu_fraction: float = 0.25
    environment: str = "default"
    node_pool: str = DEFAULT_POOL
    gpu_model: str = ""  # '' any
    preemptible: bool = False
    name: str = ""
    command: list[str] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)  # the project's, by name (attach.py)
    datasources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def demand(self) -> PodDemand:
        cpu, mem = round(self.cpu * 1000), round(self.memory_gib * 1024)
        if self.gpu_mode == "fraction":
            if round(self.gpu_fraction * MILLI) >= MILLI:
                return PodDemand(gpus=1, cpu_milli=cpu, memory_mib=mem)
            return PodDemand(gpu_fraction=self.gpu_fraction, cpu_milli=cpu, memory_mib=mem)
        if self.gpu_mode == "memory":
            return PodDemand(
                gpu_memory_mib=round(self.gpu_memory_gib * 1024), cpu_milli=cpu, memory_mib=mem
            )
        if self.gpu_mode == "whole":
            return PodDemand(gpus=self.gpus, cpu_milli=cpu, memory_mib=mem)
        return PodDemand(cpu_milli=cpu, memory_mib=mem)

    def gpu_label(self) -> str:
        return {
            "fraction": f"{self.gpu_fraction:g} GPU",
            "memory": f"{self.gpu_memory_gib:g} GiB of GPU memory",
            "whole": f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}",
            "none": "no GPU",
        }[self.gpu_mode]

    @property
    def kind_enum(self) -> Kind:
        return Kind(self.kind)

    @property
    def may_go_over_quota(self) -> bool:
        """The scheduler's rule for this request (as hub_ext.requests.store.to_workload submits it)."""
        return Workload("-", self.project, self.kind_enum, preemptible=self.preemptible,
                        allow_over_quota=self.preemptible or None).may_go_over_quota

    @property
    def gpu_field(self) -> str:
        return {"fraction": "gpu_fraction", "memory": "gpu_memory_gib"}.get(self.gpu_mode, "gpus")

    def workload(self, name: str, submit_time: float, grace_period_s: float = 30.0) -> Workload:
        """The scheduler's workload for this request: what the spawner submits, and what a
        stored row makes again (hub_ext.requests.store.to_workload)."""
        return Workload(
            name=name,
            project=self.project,
            kind=self.kind_enum,
            demand=self.demand(),
            preemptible=self.preemptible if self.kind != "inference" else False,
            allow_over_quota=self.preemptible or None,
            submit_time=submit_time,
            grace_period_s=grace_period_s,
            node_pool=self.node_pool if self.node_pool != DEFAULT_POOL else None,
            gpu_models=(self.gpu_model,) if self.gpu_model else (),
        )


def project_ceilings(limits: Limits, project: str, may_go_over_quota: bool,
                     pool: str = DEFAULT_POOL) -> list[tuple[int, str]]:
    """The most milli-GPUs one request in ``project`` may ask for in node pool ``pool``, with
    what sets each (scheduler.quota.ceilings); the spawn form shows the same."""
    entry = limits.quotas.get(project)
    if entry is None or pool not in entry[1]:
        return []
    return ceilings(entry[0], entry[1][pool], pool, may_go_over_quota)


def request_pools(limits: Limits, pool: str | None) -> tuple[str, ...]:
    """The node pools a request may run in: the one it names; naming none or the default pool
    it may run in any (store.to_workload, the pod's annotations), the default pool first."""
    if pool not in (None, DEFAULT_POOL):
        return (pool,)
    return (DEFAULT_POOL, *(p for p in limits.node_pools if p != DEFAULT_POOL))


def check_can_run(limits: Limits, project: str, demand: PodDemand, field_name: str, *,
                  may_go_over_quota: bool, pods: int = 1, pool: str | None = None) -> None:
    """Refuse a request that can never run, naming ``field_name``: more GPUs than the whole
    cluster, or, in every node pool it may run in, more than the pool holds or than a
    ceiling of its project there (limits; quotas for work that may not go over quota; CPU
    and memory quotas). The one rule for the form, the REST API and the CLI; GPUs per node
    are the range of the GPU field itself."""
    whole = pods * demand.gpu_count
    if whole and limits.cluster_gpus is not None and whole > limits.cluster_gpus:
        gang = f" ({pods} workers x {demand.gpu_count})" if pods > 1 else ""
        raise FieldError("workers" if pods > 1 else field_name,
                         f"the cluster has {limits.cluster_gpus} GPUs in all, got {whole}{gang}")
    refusals = [pool_refusal(limits, project, demand, field_name, may_go_over_quota, pods, p)
                for p in request_pools(limits, pool)]
    if all(refusals):
        raise refusals[0]  # the pool named, else the default pool


def pool_refusal(limits: Limits, project: str, demand: PodDemand, field_name: str,
                 may_go_over_quota: bool, pods: int, pool: str) -> FieldError | None:
    """Why the request can never run in node pool ``pool`` (None: it may)."""
    refused = cpu_memory_refusal(limits, project, demand, pods, pool)
    whole = pods * demand.gpu_count
    if refused or not whole:
        return refused
    gang = f" ({pods} workers x {demand.gpu_count})" if pods > 1 else ""
    has = limits.pool_gpus.get(pool)
    if has is not None and whole > has:
        return FieldError("workers" if pods > 1 else field_name,
                          f"node pool {pool} has {has} GPUs in all, got {whole}{gang}")
    # GPU memory is counted on the largest GPU: the least share it can be
    per_pod = demand.gpu_count * demand.milli_on(max(1, round(limits.gpu_memory_gib * 1024)))
    milli = pods * per_pod
    for most, why in project_ceilings(limits, project, may_go_over_quota, pool):
        if milli > most:
            gang = f" ({pods} workers x {per_pod / MILLI:g})" if pods > 1 else ""
            return FieldError(field_name, f"{why}, got {milli / MILLI:g}{gang}")
    return None


def cpu_memory_refusal(limits: Limits, project: str, demand: PodDemand, pods: int = 1,
                       pool: str = DEFAULT_POOL) -> FieldError | None:
    """More CPU or memory than the project's CPU or memory quota in ``pool`` holds in all:
    such work could never start there (the scheduler holds running work to them,
    quota.resource_reason)."""
    entry = limits.quotas.get(project)
    q = None if entry is None else entry[0].quotas.get(pool)
    if q is None:
        return None
    gang = f" ({pods} workers)" if pods > 1 else ""
    where = "" if pool == DEFAULT_POOL else f" in pool {pool}"
    if q.cpu_milli is not None and pods * demand.cpu_milli > q.cpu_milli:
        return FieldError("cpu", f"project {project}'s CPU quota{where} is {q.cpu_milli / 1000:g} CPUs, "
                          f"got {pods * demand.cpu_milli / 1000:g}{gang}")
    if q.memory_mib is not None and pods * demand.memory_mib > q.memory_mib:
        return FieldError("memory_gib", f"project {project}'s memory quota{where} is {q.memory_mib / 1024:g} "
                          f"GiB, got {pods * demand.memory_mib / 1024:g}{gang}")
    return None


_one = request_reader.one


def check_name(name) -> str:
    """Workload and service names: DNS labels, so they work as pod and URL names too."""
    return validation.name(name, "name")


def check_number(raw, key: str, lo: float, hi: float, integer: bool = False, unit: str = ""):
    """The one rule for numeric fields everywhere (forms, REST, CLI, trainings, inference
    services): validation.number."""
    return validation.number(raw, key, lo, hi, integer, unit)


def check_names(raw, key: str, most: int = 16) -> list[str]:
    """A list of names (credentials, data sources): JSON list, form list or 'a,b'."""
    return validation.names(raw, key, "name", most)


def _choice(data, key, default, allowed, what=""):
    v = _one(data, key, default)
    if v not in allowed:
        names = ", ".join(allowed) if allowed else "(none)"
        raise FieldError(key, f"must be one of {names}{what}, got {validation.show(v)}")
    return v


def _bool(data, key, default=False):
    v = _one(data, key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "on", "yes"):
        return True
    if v in (None, "", 0) or (isinstance(v, str) and v.lower() in ("0", "false", "off", "no")):
        return False
    raise FieldError(key, f"must be true or false, got {v!r}")


def parse_request(data: dict, limits: Limits, deprecated: list[str] | None = None) -> WorkloadRequest:
    """Check a request (form data or JSON) and return it typed; raise FieldError on the
    first bad field. Resources are read by request_reader (a value left out comes from the
    compute template, else the project's policy's default, else the built-in default; every
    value is then held to its range and the policy); an older spelling adds a note to
    ``deprecated``."""
    known = set(WorkloadRequest.__dataclass_fields__) | set(request_reader.DEPRECATED)
    check_fields(data, known | {k for k in data if isinstance(k, str) and k.startswith("_")})
    if not limits.projects:
        raise FieldError("project", "you are not a member of any project; ask an admin")
    project = _choice(data, "project", limits.projects[0], limits.projects, " (your projects)")
    pol = limits.policy(project)
    layered = request_reader.layer(data, request_reader.WORKSPACE, limits, project, deprecated)
    data = layered.data
    kind = _choice(data, "kind", "workspace", KINDS)
    ws_allowed = tuple(k for k in WORKSPACE_KINDS if k != "vscode" or limits.vscode)
    workspace_kind = _choice(data, "workspace_kind", "jupyterlab", ws_allowed)
    res = layered.resources()
    mode = res.gpu_mode
    req = WorkloadRequest(project=project, kind=kind, workspace_kind=workspace_kind, gpu_mode=mode,
                          template=layered.template, gpu_memory_gib=res.gpu_memory_gib, gpus=res.gpus,
                          cpu=res.cpu, memory_gib=res.memory_gib)
    if mode == "fraction":
        req.gpu_fraction = res.gpu_fraction
    envs = limits.allowed(project, "environments", limits.environments)
    req.environment = _choice(data, "environment", envs[0] if envs else limits.environments[0],
                              limits.environments)
    pol.check_in("environment", "environments", req.environment)
    pools = limits.allowed(project, "node_pools", limits.node_pools)
    req.node_pool = _choice(data, "node_pool", pools[0] if pools else DEFAULT_POOL, limits.node_pools)
    pol.check_in("node_pool", "node_pools", req.node_pool)
    if mode != "none":
        models = limits.allowed(project, "gpu_models", limits.gpu_models)
        first = models[0] if pol.allowed("gpu_models") is not None and models else ""
        req.gpu_model = _one(data, "gpu_model", first) or ""
        if req.gpu_model and req.gpu_model not in limits.gpu_models:
            raise FieldError("gpu_model", f"must be one of {', '.join(limits.gpu_models) or '(none)'} "
                             f"or empty (any), got {validation.show(req.gpu_model)}")
        if req.gpu_model or pol.allowed("gpu_models") is not None:
            pol.check_in("gpu_model", "gpu_models", req.gpu_model)
    req.preemptible = _bool(data, "preemptible", kind == "training")
    if kind == "inference" and req.preemptible:
        raise FieldError("preemptible", "inference workloads are never preemptible")
    name = _one(data, "name", "") or ""
    req.name = validation.name(name, "name") if name else ""
    command = validation.command(data.get("command", []), required=False)
    if kind != "workspace" and not command:
        raise FieldError("command", f"a {kind} needs a command to run")
    req.command = command
    req.credentials = check_names(data.get("credentials"), "credentials")
    req.datasources = check_names(data.get("datasources"), "datasources")
    check_can_run(limits, project, req.demand(), res.gpu_field, may_go_over_quota=req.may_go_over_quota,
                  pool=req.node_pool)
    return req


def workload_name(user: str, server: str = "") -> str:
    """The scheduler's name for a user's (named) server."""
    base = f"ws-{user}" + (f"-{server}" if server else "")
    return re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:63]
