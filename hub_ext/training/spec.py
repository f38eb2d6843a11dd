"""A training job's request (``TrainingSpec``) and the rules that check it.

The REST API, the CLI and the notebook widget all go through ``parse_training``; a bad
value raises ``FieldError`` naming the field and the allowed range.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scheduler.model import DEFAULT_PRIORITY, Kind, PodDemand

from .. import validation
from ..requests import reader as request_reader
from ..requests.rules import (
    FieldError,
    Limits,
    WorkloadRequest,
    check_can_run,
    check_fields,
    check_name,
    check_names,
    check_number,
)

RESTART_POLICIES = ("OnFailure", "Never")
MAX_WORKERS = 64
MAX_GRACE_S = 3600.0
MAX_BACKOFF_LIMIT = 100
# What a request may hold besides the spec's fields: the one spelling of the GPU ask
# (request_reader), its older one, and a compute template.
REQUEST_FIELDS = {"gpu_mode", "gpu_fraction", "gpus", "template", *request_reader.DEPRECATED}


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
    return request_reader.gib(raw)


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


def parse_training(data: dict, limits: Limits, deprecated: list[str] | None = None) -> TrainingSpec:
    """Check a training request (JSON) against the user's limits; return it typed. The GPU,
    CPU and memory per worker are read by request_reader; an older spelling adds a note to
    ``deprecated``."""
    check_fields(data, set(TrainingSpec.__dataclass_fields__) | REQUEST_FIELDS)
    name = check_name(data.get("name"))
    if not limits.projects:
        raise FieldError("project", "you are not a member of any project; ask an admin")
    project = data.get("project", limits.projects[0])
    if project not in limits.projects:
        raise FieldError("project", f"must be one of {', '.join(limits.projects)} (your projects), "
                         f"got {validation.show(project)}")
    command = validation.command(data.get("command"))
    spec = TrainingSpec(name=name, project=project, command=command)
    layered = request_reader.layer(data, request_reader.TRAINING, limits, project, deprecated)
    data = layered.data
    spec.workers = _number(data, "workers", 1, 1, MAX_WORKERS, integer=True)
    res = layered.resources(pods=spec.workers)
    spec.gpu, spec.gpu_memory_gib = res.gpu, res.gpu_memory_gib
    spec.cpu, spec.memory_gib = res.cpu, res.memory_gib
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
    spec.priority = _number(data, "priority", DEFAULT_PRIORITY[Kind.TRAINING], 0, 99, integer=True)
    spec.credentials = check_names(data.get("credentials"), "credentials")
    spec.datasources = check_names(data.get("datasources"), "datasources")
    pol = limits.policy(project)
    if spec.node_pool is None and pol.allowed("node_pools") is not None:
        pools = limits.allowed(project, "node_pools", limits.node_pools)
        spec.node_pool = pools[0] if pools else None
    if spec.node_pool is not None:
        pol.check_in("node_pool", "node_pools", spec.node_pool)
    check_can_run(limits, project, spec.demand(), res.gpu_field,
                  may_go_over_quota=spec.preemptible, pods=spec.workers, pool=spec.node_pool)
    return spec
