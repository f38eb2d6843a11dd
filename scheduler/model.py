"""The scheduler's model: what a snapshot holds and what a decision says.

All GPU amounts are integer milli-GPUs (1000 = one whole GPU) so sums are exact;
a request for GPU memory is turned into milli-GPUs on the GPU it lands on.

Errors: every invalid input raises ``ValidationError`` naming the field and the
allowed range; nothing here clamps silently.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field

from gpupool.errors import GpupoolError

from .constraints import NodeConstraints, Taint

MILLI = 1000
DEFAULT_POOL = "default"
# The most GPUs a quota or limit may name: far beyond any cluster, and small enough that
# milli-GPU sums stay exact integers (1e307 GPUs would overflow to inf).
MAX_GPUS = 1_000_000
MAX_CPU_MEMORY = 1e9  # CPUs or GiB in a CPU or memory quota


class ValidationError(GpupoolError, ValueError):
    """Bad input to the scheduler; ``field`` names what was wrong."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def check_seconds(field_name: str, value: object, positive: bool = False) -> None:
    """A duration setting: a finite number of seconds, >= 0 (> 0 with ``positive``)."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or value < 0 or (positive and value == 0)):
        bound = "> 0" if positive else ">= 0"
        raise ValidationError(field_name, f"must be a finite number {bound} (seconds), got {value!r}")


class Kind(str, enum.Enum):
    TRAINING = "training"
    WORKSPACE = "workspace"
    INFERENCE = "inference"


# Run:ai's defaults: inference outranks interactive work, which outranks training.
DEFAULT_PRIORITY = {Kind.INFERENCE: 125, Kind.WORKSPACE: 100, Kind.TRAINING: 50}
DEFAULT_PREEMPTIBLE = {Kind.INFERENCE: False, Kind.WORKSPACE: False, Kind.TRAINING: True}


class State(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    # Evicted but still holding its GPUs until it exits (grace period); never a victim
    # again, and the scheduler counts its GPUs as soon-free instead of evicting more.
    RELEASING = "releasing"


@dataclass(frozen=True)
class GPU:
    index: int
    model: str
    memory_mib: int
    uuid: str = ""


@dataclass
class Node:
    name: str
    gpus: list[GPU]
    cpu_milli: int = 64_000
    memory_mib: int = 256 * 1024
    pool: str = DEFAULT_POOL
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()  # only pods that tolerate them go here (constraints.py)

    def validate(self) -> None:
        if not self.name:
            raise ValidationError("node.name", "must not be empty")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValidationError(f"node[{self.name}].cpu_milli/memory_mib", "must be >= 0")
        for i, g in enumerate(self.gpus):
            if g.index != i:
                raise ValidationError(f"node[{self.name}].gpus[{i}].index", f"must be {i}")
            if g.memory_mib <= 0:
                raise ValidationError(f"node[{self.name}].gpus[{i}].memory_mib", "must be > 0")


@dataclass(frozen=True)
class Quota:
    """A queue's share of one node pool, in GPUs.

    ``gpus`` is guaranteed (deserved); ``over_quota_weight`` divides idle capacity;
    ``limit`` caps the queue even when GPUs are idle (None = no cap).
    """

    gpus: float = 0.0
    over_quota_weight: float = 1.0
    limit: float | None = None
    # CPU and memory quotas: caps on what the queue's work holds in the pool (None = none);
    # work that would pass one waits, with its own reason (quota.resource_reason).
    cpu: float | None = None
    memory_gib: float | None = None

    def validate(self, where: str) -> None:
        for key in ("cpu", "memory_gib"):
            v = getattr(self, key)
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                               and math.isfinite(v) and 0 <= v <= MAX_CPU_MEMORY)
            if not ok:
                raise ValidationError(f"{where}.{key}", f"must be a number from 0 to {MAX_CPU_MEMORY:g} or unset, got {v!r}")
        for key in ("gpus", "over_quota_weight", "limit"):
            v = getattr(self, key)
            if key == "limit" and v is None:
                continue
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or not 0 <= v <= MAX_GPUS:
                raise ValidationError(f"{where}.{key}", f"must be a number from 0 to {MAX_GPUS}, got {v!r}")
        if self.limit is not None and not (self.limit >= self.gpus):
            raise ValidationError(
                f"{where}.limit", f"must be >= the quota ({self.gpus}) or unset, got {self.limit}"
            )

    @functools.cached_property  # asked in every verdict; a Quota never changes
    def quota_milli(self) -> int:
        return round(self.gpus * MILLI)

    @functools.cached_property
    def limit_milli(self) -> int | None:
        return None if self.limit is None else round(self.limit * MILLI)

    @functools.cached_property
    def cpu_milli(self) -> int | None:
        return None if self.cpu is None else round(self.cpu * 1000)

    @functools.cached_property
    def memory_mib(self) -> int | None:
        return None if self.memory_gib is None else round(self.memory_gib * 1024)


# A project's quota in a pool it has none for. Shared (a Quota never changes), so that
# ``quotas.get(pool, NO_QUOTA)`` does not build one on every quota check.
NO_QUOTA = Quota()


@dataclass
class Department:
    name: str
    quotas: dict[str, Quota] = field(default_factory=dict)  # node pool -> quota


@dataclass
class Project:
    name: str
    department: str
    quotas: dict[str, Quota] = field(default_factory=dict)  # node pool -> quota


@dataclass(frozen=True)
class PodDemand:
    """What one pod of a workload asks for.

    Exactly one GPU form: ``gpus`` whole GPUs (>= 1), or ``gpu_fraction`` in (0, 1),
    or ``gpu_memory_mib`` (> 0) on a single GPU; or none of them for a CPU-only pod.
    """

    gpus: int = 0
    gpu_fraction: float = 0.0
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def __hash__(self) -> int:
        # Kept once worked out (a demand never changes): snapshots and cycles key tables on
        # demands for every workload that comes and goes.
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.gpus, self.gpu_fraction, self.gpu_memory_mib, self.cpu_milli, self.memory_mib))
        return h

    def validate(self, where: str) -> None:
        if self.__dict__.get("_valid"):  # checked before (a demand never changes)
            return
        self._check(where)
        self.__dict__["_valid"] = True

    def _check(self, where: str) -> None:
        forms = sum(1 for v in (self.gpus, self.gpu_fraction, self.gpu_memory_mib) if v)
        if forms > 1:
            raise ValidationError(where, "give only one of gpus, gpu_fraction, gpu_memory_mib")
        if not isinstance(self.gpus, int) or self.gpus < 0:
            raise ValidationError(f"{where}.gpus", f"whole GPUs must be an integer >= 0, got {self.gpus!r}")
        if not (0 <= self.gpu_fraction < 1) or not math.isfinite(self.gpu_fraction):
            raise ValidationError(
                f"{where}.gpu_fraction", f"must be > 0 and < 1 (use gpus for whole GPUs), got {self.gpu_fraction!r}"
            )
        if self.gpu_fraction and round(self.gpu_fraction * MILLI) < 1:
            raise ValidationError(f"{where}.gpu_fraction", "must be at least 0.001")
        if self.gpu_memory_mib < 0:
            raise ValidationError(f"{where}.gpu_memory_mib", "must be >= 0")
        if self.cpu_milli < 0:
            raise ValidationError(f"{where}.cpu_milli", "must be >= 0")
        if self.memory_mib < 0:
            raise ValidationError(f"{where}.memory_mib", "must be >= 0")

    @functools.cached_property  # asked for every pod placed; a demand never changes
    def is_fractional(self) -> bool:
        return bool(self.gpu_fraction or self.gpu_memory_mib)

    def milli_on(self, gpu_memory_mib: int) -> int:
        """Milli-GPUs this pod takes on each GPU it uses, on a GPU of that memory size."""
        if self.gpus:
            return MILLI
        if self.gpu_fraction:
            return round(self.gpu_fraction * MILLI)
        if self.gpu_memory_mib:
            return min(MILLI, math.ceil(self.gpu_memory_mib * MILLI / gpu_memory_mib))
        return 0

    @functools.cached_property
    def gpu_count(self) -> int:
        """Physical GPUs one pod touches."""
        return self.gpus if self.gpus else (1 if self.is_fractional else 0)


@dataclass(frozen=True)
class PodPlacement:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_milli: int  # per GPU


@dataclass
class Workload:
    name: str
    project: str
    kind: Kind = Kind.TRAINING
    demand: PodDemand = PodDemand()
    pods: int = 1  # gang size: all pods placed together or none
    priority: int | None = None  # None: the kind's default
    preemptible: bool | None = None  # None: the kind's default
    allow_over_quota: bool | None = None  # None: preemptible work may, others may not
    node_pool: str | None = None  # None: any pool
    gpu_models: tuple[str, ...] = ()  # empty: any model
    topology_key: str | None = None  # node label a gang prefers to share (e.g. "rack")
    # Node selector, required node affinity, tolerations (None: none, yet no tainted node)
    constraints: NodeConstraints | None = None
    submit_time: float = 0.0
    state: State = State.PENDING
    placement: tuple[PodPlacement, ...] = ()  # for running workloads, one per pod
    grace_period_s: float = 60.0
    # Running workloads: whether they were placed over quota (reclaimable).
    over_quota: bool = False
    # Requeued after a preemption: queued one priority step up, so it is placed before new
    # work of its priority, but that step never lets it preempt anything.
    resumed: bool = False
    started_at: float | None = None  # when it last started running (adapter's clock)

    @property
    def effective_priority(self) -> int:
        return DEFAULT_PRIORITY[self.kind] if self.priority is None else self.priority

    @property
    def queue_priority(self) -> int:
        return self.effective_priority + (1 if self.resumed else 0)

    @property
    def is_preemptible(self) -> bool:
        return DEFAULT_PREEMPTIBLE[self.kind] if self.preemptible is None else self.preemptible

    @property
    def may_go_over_quota(self) -> bool:
        if self.kind == Kind.INFERENCE:
            return False
        if self.allow_over_quota is not None:
            return self.allow_over_quota
        return self.is_preemptible

    @property
    def gives_way(self) -> bool:
        """Preemptible and allowed over quota: the GPUs it holds are ones its project may
        lose (reclaimed by others, or preempted for its own work that may not go over quota),
        so they do not count against that work's quota (quota.counted_usage)."""
        return self.is_preemptible and self.may_go_over_quota

    def validate(self) -> None:
        # Field names are formatted only for an error: every workload event is validated.
        if not self.name:
            raise ValidationError("workload.name", "must not be empty")
        if not self.project:
            raise ValidationError(f"workload[{self.name}].project", "must name a project")
        if not isinstance(self.pods, int) or self.pods < 1:
            raise ValidationError(f"workload[{self.name}].pods", f"gang size must be an integer >= 1, got {self.pods!r}")
        if not self.demand.__dict__.get("_valid"):  # a demand object is checked once
            self.demand.validate(f"workload[{self.name}].demand")
        if self.state != State.PENDING and len(self.placement) != self.pods:
            raise ValidationError(f"workload[{self.name}].placement", f"a running workload needs {self.pods} pod placements")
        if self.grace_period_s < 0:
            raise ValidationError(f"workload[{self.name}].grace_period_s", "must be >= 0")

    def gpu_milli_estimate(self, gpu_memory_mib: int) -> int:
        """Total milli-GPUs of the whole gang on GPUs of the given memory size."""
        return self.pods * self.demand.gpu_count * self.demand.milli_on(gpu_memory_mib)

    def allocated_milli(self) -> int:
        return sum(p.gpu_milli * len(p.gpu_indices) for p in self.placement)


@dataclass(frozen=True)
class Bind:
    workload: str
    pods: tuple[PodPlacement, ...]
    over_quota: bool


class EvictionCause(str, enum.Enum):
    """Which way of making room chose a victim (``scheduler.actions.evictions``)."""

    RECLAIM = "reclaim"  # for a project below its quota
    FAIR_SHARE = "fair share"  # for a project below its fair share of the idle GPUs
    CATCH_UP = "catch up"  # for a project behind its fair share over time
    PREEMPT = "preempt"  # for higher-priority work of the victim's own project
    CONSOLIDATE = "consolidate"  # moved elsewhere to free a whole node (actions.consolidate)


@dataclass(frozen=True)
class Evict:
    workload: str
    reason: str  # the sentence users read
    grace_period_s: float
    cause: EvictionCause


@dataclass(frozen=True)
class Pending:
    workload: str
    reason: str
    queue_position: int  # 1-based among the project's pending work


@dataclass
class Decisions:
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    fair_share_milli: dict[tuple[str, str], int] = field(default_factory=dict)  # (project, pool)
    timings: dict[str, float] = field(default_factory=dict)

    def reason(self, workload: str) -> str | None:
        for p in self.pending:
            if p.workload == workload:
                return p.reason
        return None
