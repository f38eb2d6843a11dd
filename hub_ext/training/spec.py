"""A training job's request (``TrainingSpec``) and the rules that check it.

The REST API, the CLI and the notebook widget all go through ``parse_training``; a bad
value raises ``FieldError`` naming the field and the allowed range.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from scheduler.model import DEFAULT_PRIORITY, Kind, PodDemand

from .. import validation
from ..requests.rules import (
    GPU_MEMORY_MIN,
    FieldError,
    Limits,
    WorkloadRequest,
    check_can_run,
    check_fields,
    check_name,
    check_names,
    check_number,
    check_policy,
)

RESTART_POLICIES = ("OnFailure", "Never")
MAX_WORKERS = 64
MAX_GRACE_S = 3600.0
MAX_BACKOFF_LIMIT = 100
_MEM_RE = re.compile(r"\s*([0-9]{0,12}\.?[0-9]{1,12})\s*(GiB|GB|G|MiB|MB|M)?\s*", re.IGNORECASE)


@dataclass
class TrainingSpec:
    name: str
    project: str
    command: list[str]
    gpu: float = 1.0  # per worker: a fraction in (0, 1) or whole GPUs; 0 = no GPU
    gpu_memory_gib: float = 0.0  # per worker, instead of gpu
    workers: int = 1
    preemptible: bool = True
    node_pool: str | None = None
    checkpoint_dir: str = ""  # empty: ~/.gpupool/workloads/NAME/checkpoints of the owner's account
    image: str = ""  # Kubernetes only; embedded runs the hub's Python
    env: dict[str, str] = field(default_factory=dict)
    restart_policy: str = "OnFailure"
    backoff_limit: int = 3
    backoff_s: float = 10.0  # first wait before a restart; doubles each time, at most 5 min
    grace_period_s: float = 60.0
    cpu: float = 1.0
    memory_gib: float = 4.0
    priority: int = DEFAULT_PRIORITY[Kind.TRAINING]
    credentials: list[str] = field(default_factory=list)  # the project's, by name (attach.py)
    datasources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainingSpec:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def demand(self) -> PodDemand:
        return self.request().demand()

    def request(self) -> WorkloadRequest:
        """The hub's own request form of this job (what its workload row and views hold)."""
        req = WorkloadRequest(project=self.project, kind="training", cpu=self.cpu,
                              memory_gib=self.memory_gib, preemptible=self.preemptible,
                              name=self.name, command=list(self.command),
                              credentials=list(self.credentials), datasources=list(self.datasources))
        if self.gpu_memory_gib:
            req.gpu_mode, req.gpu_memory_gib = "memory", self.gpu_memory_gib
        elif self.gpu >= 1:
            req.gpu_mode, req.gpus = "whole", int(self.gpu)
        elif self.gpu > 0:
            req.gpu_mode, req.gpu_fraction = "fraction", self.gpu
        else:
            req.gpu_mode = "none"
        return req

    def gpu_label(self) -> str:
        one = self.request().gpu_label()
        return one if self.workers == 1 else f"{self.workers} workers x {one}"


def parse_gpu_memory(raw) -> float:
    """``20GiB``, ``20G``, ``512MiB`` or a number of GiB -> GiB."""
    if isinstance(raw, bool):
        raise FieldError("gpu_memory", f"must be a size like 20GiB or 512MiB, got {raw!r}")
    if isinstance(raw, (int, float)):
        return validation.number(raw, "gpu_memory", 0, validation.MAX_GPU_MEMORY_GIB, unit=" GiB")
    m = _MEM_RE.fullmatch(validation.text(raw, "gpu_memory", 32))
    if not m:
        raise FieldError("gpu_memory", f"must be a size like 20GiB or 512MiB, got {raw!r}")
    value, unit = float(m.group(1)), (m.group(2) or "GiB").lower()
    return value / 1024 if unit.startswith("m") else value


def _number(data: dict, key: str, default, lo: float, hi: float, integer: bool = False,
            unit: str = ""):
    return check_number(data.get(key, default), key, lo, hi, integer, unit)


def _bool(data: dict, key: str, default: bool) -> bool:
    v = data.get(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise FieldError(key, f"must be true or false, got {validation.show(v)}")


def parse_training(data: dict, limits: Limits) -> TrainingSpec:
    """Check a training request (JSON) against the user's limits; return it typed."""
    check_fields(data, set(TrainingSpec.__dataclass_fields__) | {"gpu_memory"})
    name = check_name(data.get("name"))
    if not limits.projects:
        raise FieldError("project", "you are not a member of any project; ask an admin")
    project = data.get("project", limits.projects[0])
    if project not in limits.projects:
        raise FieldError("project", f"must be one of {', '.join(limits.projects)} (your projects), "
                         f"got {validation.show(project)}")
    command = validation.command(data.get("command"))
    spec = TrainingSpec(name=name, project=project, command=command)
    if "gpu_memory" in data and "gpu_memory_gib" in data:
        raise FieldError("gpu_memory", "give gpu_memory or gpu_memory_gib, not both")
    mem = data.get("gpu_memory", data.get("gpu_memory_gib"))
    if mem is not None:
        if "gpu" in data:
            raise FieldError("gpu", "give gpu or gpu_memory, not both")
        gib = parse_gpu_memory(mem)
        spec.gpu_memory_gib = _number({"gpu_memory": gib}, "gpu_memory", None, GPU_MEMORY_MIN,
                                      limits.gpu_memory_max_gib, unit=" GiB")
        spec.gpu = 0.0
    else:
        gpu = _number(data, "gpu", 1, 0, max(limits.max_gpus, 1))
        if 0 < gpu < 1:
            steps = gpu / 0.05
            if abs(steps - round(steps)) > 1e-6:
                raise FieldError("gpu", f"a fraction must be a multiple of 0.05 from 0.05 to 0.95, got {gpu:g}")
            gpu = round(round(steps) * 0.05, 2)
        elif gpu >= 1 and gpu != int(gpu):
            raise FieldError("gpu", f"must be a fraction below 1 or a whole number of GPUs "
                             f"from 1 to {limits.max_gpus}, got {gpu:g}")
        if gpu > limits.max_gpus:
            raise FieldError("gpu", f"must be from 0 to {limits.max_gpus} (GPUs of the largest node), got {gpu:g}")
        spec.gpu = gpu
    spec.workers = _number(data, "workers", 1, 1, MAX_WORKERS, integer=True)
    spec.preemptible = _bool(data, "preemptible", True)
    pool = data.get("node_pool")
    spec.node_pool = None if pool is None else validation.name(pool, "node_pool")
    ckpt = data.get("checkpoint_dir", "")
    spec.checkpoint_dir = validation.path(ckpt, "checkpoint_dir") if ckpt != "" else ""
    spec.image = validation.text(data.get("image", ""), "image", validation.MAX_IMAGE_CHARS)
    spec.env = validation.env(data.get("env", {}))
    policy = data.get("restart_policy", "OnFailure")
    if policy not in RESTART_POLICIES:
        raise FieldError("restart_policy", f"must be one of {', '.join(RESTART_POLICIES)}, "
                         f"got {validation.show(policy)}")
    spec.restart_policy = policy
    spec.backoff_limit = _number(data, "backoff_limit", 3, 0, MAX_BACKOFF_LIMIT, integer=True)
    spec.backoff_s = _number(data, "backoff_s", 10.0, 0, 300, unit=" s")
    spec.grace_period_s = _number(data, "grace_period_s", 60.0, 0, MAX_GRACE_S, unit=" s")
    spec.cpu = _number(data, "cpu", 1, 0.1, limits.max_cpu)
    spec.memory_gib = _number(data, "memory_gib", 4, 0.25, limits.max_memory_gib, unit=" GiB")
    spec.priority = _number(data, "priority", DEFAULT_PRIORITY[Kind.TRAINING], 0, 99, integer=True)
    spec.credentials = check_names(data.get("credentials"), "credentials")
    spec.datasources = check_names(data.get("datasources"), "datasources")
    pol = limits.policy(project)
    if spec.node_pool is None and pol.allowed("node_pools") is not None:
        pools = limits.allowed(project, "node_pools", limits.node_pools)
        spec.node_pool = pools[0] if pools else None
    if spec.node_pool is not None:
        pol.check_in("node_pool", "node_pools", spec.node_pool)
    gpu = ({"gpu_memory_gib": ("gpu_memory", spec.gpu_memory_gib)} if spec.gpu_memory_gib else
           {"gpu_fraction": ("gpu", spec.gpu)} if 0 < spec.gpu < 1 else
           {"gpus": ("gpu", spec.gpu * spec.workers)} if spec.gpu else {})
    check_policy(limits, project, {**gpu, "cpu": ("cpu", spec.cpu), "memory_gib": ("memory_gib", spec.memory_gib)})
    check_can_run(limits, project, spec.demand(), "gpu_memory" if spec.gpu_memory_gib else "gpu",
                  may_go_over_quota=spec.preemptible, pods=spec.workers, pool=spec.node_pool)
    return spec
