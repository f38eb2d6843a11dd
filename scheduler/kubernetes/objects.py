"""Kubernetes objects <-> scheduler model: plain functions over JSON dicts, no I/O.

Reading: ``parse_pod`` (a pod's annotations and resources -> ``PodRequest``),
``parse_node``, ``parse_department``, ``parse_project``. Writing: ``binding``,
``fraction_config_map``, ``scheduled_condition``, ``event``. The annotation names are the
adapter's public interface; scheduler/kubernetes/README.md documents them.

Errors: ``parse_pod`` raises ``model.ValidationError`` naming the annotation at fault; the
adapter turns that into an Event on the pod.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from ..constraints import OPERATORS, NodeConstraints, Requirement, Taint, Term, Toleration
from ..contract import (
    DEFAULT_PRELOAD,
    GPU_RESOURCE,
    A,
    config_map_name,
    preemption_condition,
    share_env,
)
from ..model import (
    DEFAULT_POOL,
    GPU,
    MILLI,
    Department,
    Kind,
    Node,
    PodDemand,
    PodPlacement,
    Project,
    Quota,
    ValidationError,
)

__all__ = [
    "A",
    "PodRequest",
    "binding",
    "event",
    "fraction_config_map",
    "parse_department",
    "parse_node",
    "parse_pod",
    "parse_project",
    "parse_quantity",
    "placement_annotations",
    "preemption_mark",
    "recorded_lag",
    "rfc3339",
    "scheduled_condition",
]

JSON = dict[str, Any]
# The names and the environment live in the workload contract; re-exported for readers here.
__all__ += ["GPU_RESOURCE", "DEFAULT_PRELOAD"]


# ------------------------------------------------------------------------------ quantities
_SUFFIX: dict[str, int | Decimal] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(value: Any, where: str = "quantity") -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "2") as a Decimal."""
    q = _quantity(str(value).strip())
    if q is None:
        raise ValidationError(where, f"not a Kubernetes quantity: {value!r}")
    return q


@lru_cache(maxsize=1024)
def _quantity(s: str) -> Decimal | None:
    # Cached: a cluster's pods ask for a handful of distinct quantities ("1", "100m", "64Mi")
    m = _QTY.match(s)
    if not m or m.group(2) not in _SUFFIX:
        return None
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        return None


def _mib(value: Any, where: str) -> int:
    """GPU memory: a quantity ("20Gi", "20480Mi") or a bare number of MiB."""
    s = str(value).strip()
    if re.fullmatch(r"[0-9]+", s):
        return int(s)
    q = parse_quantity(s, where)
    if q <= 0:
        raise ValidationError(where, f"must be > 0, got {value!r}")
    return math.ceil(q / 2**20)


def parse_time(ts: str | None) -> float:
    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _start_time(status: JSON, where: str) -> float | None:
    """``status.startTime`` (set by the kubelet when it takes the pod) as epoch seconds."""
    ts = status.get("startTime")
    if not ts:
        return None
    try:
        return parse_time(ts)
    except (ValueError, TypeError, AttributeError):
        raise ValidationError("status.startTime", f"{where}: not an RFC 3339 time: {ts!r}") from None


# ------------------------------------------------------------------------------------ pods
@dataclass
class PodRequest:
    """What one pod asks the scheduler for, and where it is (if bound)."""

    key: str  # namespace/name
    namespace: str
    name: str
    uid: str
    workload: str  # the scheduler workload this pod belongs to
    project: str
    kind: Kind
    demand: PodDemand
    gang_size: int = 1
    priority: int | None = None
    preemptible: bool | None = None
    allow_over_quota: bool | None = None
    node_pool: str | None = None
    gpu_models: tuple[str, ...] = ()
    topology_key: str | None = None
    constraints: NodeConstraints | None = None  # nodeSelector, node affinity, tolerations
    claims: tuple[str, ...] = ()  # PersistentVolumeClaims its volumes name (volumes.py)
    grace_period_s: float = 30.0
    submit_time: float = 0.0
    config_map: str | None = None  # for fractions: the ConfigMap its envFrom names
    node: str | None = None  # spec.nodeName
    placement: PodPlacement | None = None  # from the scheduler's annotations, when bound
    plan: PodPlacement | None = None  # a gang member's stamped placement, not yet bound
    over_quota: bool = False
    resumed: bool = False  # restarted after a preemption (A.RESUMED)
    start_time: float | None = None  # status.startTime: when the kubelet started it
    deleting: bool = False
    done: bool = False  # Succeeded or Failed: holds nothing
    resource_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    signature: tuple = ()


def _requests(meta: JSON) -> dict[str, str]:
    """The pod's labels and annotations in one dict, annotations first: where requests
    are read from."""
    labels, ann = meta.get("labels"), meta.get("annotations")
    if not labels:
        return ann or {}
    return {**labels, **ann} if ann else labels


def _bool(v: str, where: str) -> bool:
    s = v.strip().lower()
    if s in ("true", "yes", "1"):
        return True
    if s in ("false", "no", "0"):
        return False
    raise ValidationError(where, f"must be true or false, got {v!r}")


def _int(v: str, where: str, lo: int | None = None) -> int:
    try:
        n = int(v.strip())
    except ValueError:
        raise ValidationError(where, f"must be an integer, got {v!r}") from None
    if lo is not None and n < lo:
        raise ValidationError(where, f"must be >= {lo}, got {n}")
    return n


def _sum_requests(spec: JSON, resource: str) -> Decimal:
    total = Decimal(0)
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        if v is not None:
            total += parse_quantity(v, f"containers[{c.get('name')}].resources.{resource}")
    # Init containers run one at a time: the pod needs the larger of the two.
    init = Decimal(0)
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        if v is not None:
            init = max(init, parse_quantity(v, f"initContainers[{c.get('name')}].{resource}"))
    return max(total, init)


# ----------------------------------------------------------------------------- constraints
def pod_claims(spec: JSON, pod_name: str) -> tuple[str, ...]:
    """The claims a pod's volumes name: its PersistentVolumeClaims, and the claim of each
    generic ephemeral volume (named POD-VOLUME by the ephemeral volume controller)."""
    out = []
    for v in spec.get("volumes") or ():
        if "persistentVolumeClaim" in v:
            out.append(str(v["persistentVolumeClaim"].get("claimName", "")))
        elif "ephemeral" in v:
            out.append(f"{pod_name}-{v.get('name', '')}")
    return tuple(out)


def _requirements(items: Any, where: str, fields: bool = False) -> tuple[Requirement, ...]:
    out = []
    for i, r in enumerate(items or ()):
        at = f"{where}[{i}]"
        op = r.get("operator")
        if op not in OPERATORS:
            raise ValidationError(f"{at}.operator", f"must be one of {', '.join(OPERATORS)}, got {op!r}")
        if fields and (r.get("key") != "metadata.name" or op not in ("In", "NotIn")):
            raise ValidationError(f"{at}", "matchFields takes only metadata.name with In or NotIn")
        values = tuple(str(v) for v in r.get("values") or ())
        if op in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
            raise ValidationError(f"{at}.values", f"{op} takes one integer, got {list(values)}")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValidationError(f"{at}.values", f"{op} takes no values")
        out.append(Requirement(str(r.get("key", "")), op, values))
    return tuple(out)


def node_terms(selector: JSON | None, where: str) -> tuple[Term, ...] | None:
    """A NodeSelector (``nodeSelectorTerms``) as terms, any of which a node must match;
    None when there is none."""
    if selector is None:
        return None
    return tuple(
        Term(_requirements(t.get("matchExpressions"), f"{where} nodeSelectorTerms[{i}].matchExpressions"),
             _requirements(t.get("matchFields"), f"{where} nodeSelectorTerms[{i}].matchFields", fields=True))
        for i, t in enumerate(selector.get("nodeSelectorTerms") or ()))


def preferred_terms(items: Any, where: str) -> tuple[tuple[int, Term], ...]:
    """``preferredDuringSchedulingIgnoredDuringExecution``: (weight, term) pairs, weights 1-100
    as the API server's validation has them."""
    out = []
    for i, p in enumerate(items or ()):
        at = f"{where} preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        weight = p.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise ValidationError(f"{at}.weight", f"must be an integer from 1 to 100, got {weight!r}")
        t = p.get("preference") or {}
        out.append((weight, Term(_requirements(t.get("matchExpressions"), f"{at}.preference.matchExpressions"),
                                 _requirements(t.get("matchFields"), f"{at}.preference.matchFields",
                                               fields=True))))
    return tuple(out)


def parse_constraints(spec: JSON, where: str = "pod") -> NodeConstraints | None:
    """A pod's nodeSelector, required and preferred node affinity and tolerations; None when
    it has none (the core then keeps it off tainted nodes only)."""
    selector = spec.get("nodeSelector") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    preferred = preferred_terms(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), where)
    tolerations = spec.get("tolerations") or ()
    if not (selector or required or tolerations or preferred):
        return None
    terms = node_terms(required, where)
    tols = []
    for i, t in enumerate(tolerations):
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise ValidationError(f"{where} tolerations[{i}].operator", f"must be Equal or Exists, got {op!r}")
        tols.append(Toleration(t.get("key") or "", op, str(t.get("value") or ""), t.get("effect") or ""))
    return NodeConstraints(tuple(sorted((str(k), str(v)) for k, v in selector.items())), terms, tuple(tols),
                           preferred=preferred)


def workload_name(namespace: str, name: str, gang: str | None) -> str:
    return f"{namespace}/gang/{gang}" if gang else f"{namespace}/{name}"


def parse_pod(pod: JSON) -> PodRequest:
    """Read a gpupool pod. Raises ValidationError naming the bad annotation."""
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    ns, name = meta.get("namespace", "default"), meta["name"]
    where = f"pod {ns}/{name}"
    get = _requests(meta).get

    project = get(A.PROJECT) or ns
    kind_s = get(A.KIND)
    try:
        kind = Kind(kind_s.strip().lower()) if kind_s else Kind.TRAINING
    except ValueError:
        allowed = ", ".join(k.value for k in Kind)
        raise ValidationError(A.KIND, f"{where}: must be one of {allowed}, got {kind_s!r}") from None

    whole = _sum_requests(spec, GPU_RESOURCE)
    if whole != int(whole) or whole < 0:
        raise ValidationError(f"resources.{GPU_RESOURCE}", f"{where}: must be a whole number")
    frac_s, mem_s = get(A.FRACTION), get(A.MEMORY)
    fraction, mem_mib = 0.0, 0
    if frac_s is not None:
        try:
            fraction = float(frac_s)
        except ValueError:
            raise ValidationError(A.FRACTION, f"{where}: must be a number in (0, 1), got {frac_s!r}") from None
        if not (0 < fraction < 1) or not math.isfinite(fraction):
            raise ValidationError(A.FRACTION, f"{where}: must be a number in (0, 1), got {frac_s!r}")
    if mem_s is not None:
        mem_mib = _mib(mem_s, A.MEMORY)
        if mem_mib <= 0:
            raise ValidationError(A.MEMORY, f"{where}: must be > 0, got {mem_s!r}")
    if sum(1 for v in (whole, fraction, mem_mib) if v) > 1:
        raise ValidationError(
            A.FRACTION, f"{where}: give only one of {GPU_RESOURCE} limits, {A.FRACTION}, {A.MEMORY}"
        )
    cpu = _sum_requests(spec, "cpu")
    mem = _sum_requests(spec, "memory")
    demand = PodDemand(
        gpus=int(whole), gpu_fraction=fraction, gpu_memory_mib=mem_mib,
        cpu_milli=math.ceil(cpu * 1000), memory_mib=math.ceil(mem / 2**20),
    )  # fmt: skip
    try:
        demand.validate(where)
    except ValidationError as e:
        raise ValidationError(A.FRACTION, str(e)) from None

    gang = get(A.GANG)
    gang_size = 1
    if gang is not None:
        if not gang.strip():
            raise ValidationError(A.GANG, f"{where}: must name the gang")
        size_s = get(A.GANG_SIZE)
        if size_s is None:
            raise ValidationError(A.GANG_SIZE, f"{where}: a gang pod needs {A.GANG_SIZE}")
        gang_size = _int(size_s, A.GANG_SIZE, lo=1)
    elif get(A.GANG_SIZE) is not None:
        raise ValidationError(A.GANG, f"{where}: {A.GANG_SIZE} without {A.GANG}")

    prio_s, pre_s, oq_s = get(A.PRIORITY), get(A.PREEMPTIBLE), get(A.OVER_QUOTA)
    resumed_s = get(A.RESUMED)
    models = get(A.GPU_MODEL)
    grace = spec.get("terminationGracePeriodSeconds")
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    node = spec.get("nodeName") or None
    placement, plan, over_quota = _where(ann, node, where)
    return PodRequest(
        key=f"{ns}/{name}", namespace=ns, name=name, uid=meta.get("uid", ""),
        workload=workload_name(ns, name, gang), project=project, kind=kind, demand=demand,
        gang_size=gang_size,
        priority=None if prio_s is None else _int(prio_s, A.PRIORITY),
        preemptible=None if pre_s is None else _bool(pre_s, A.PREEMPTIBLE),
        allow_over_quota=None if oq_s is None else _bool(oq_s, A.OVER_QUOTA),
        node_pool=get(A.NODE_POOL),
        gpu_models=tuple(m.strip() for m in models.split(",") if m.strip()) if models else (),
        topology_key=get(A.TOPOLOGY),
        constraints=parse_constraints(spec, where),
        claims=pod_claims(spec, name),
        grace_period_s=float(30 if grace is None else grace),
        submit_time=parse_time(meta.get("creationTimestamp")),
        config_map=(get(A.CONFIG_MAP) or config_map_name(name)) if demand.is_fractional else None,
        node=node, placement=placement, plan=plan,
        over_quota=over_quota,
        resumed=False if resumed_s is None else _bool(resumed_s, A.RESUMED),
        start_time=_start_time(status, where),
        deleting=bool(meta.get("deletionTimestamp")),
        done=status.get("phase") in ("Succeeded", "Failed"),
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        signature=request_signature(pod),
    )  # fmt: skip


def _where(ann: dict[str, str], node: str | None, where: str):
    """(placement if bound, stamped gang plan if not, over quota) from the annotations
    the scheduler wrote."""
    idx_s = ann.get(A.GPU_INDICES)
    idx: tuple[int, ...] = ()
    milli = 0
    if idx_s is not None:
        try:
            idx = tuple(int(i) for i in idx_s.split(",") if i != "")
            milli = int(ann.get(A.GPU_MILLI, MILLI))
        except ValueError:
            raise ValidationError(A.GPU_INDICES, f"{where}: unreadable {idx_s!r}") from None
    over_quota = _bool(ann.get(A.OVER_QUOTA_PLACED, "false"), A.OVER_QUOTA_PLACED)
    if node:
        # No annotations: CPU-only, or bound by someone else.
        return PodPlacement(node, idx, milli), None, over_quota
    if idx_s is not None and A.PLANNED_NODE in ann:
        return None, PodPlacement(ann[A.PLANNED_NODE], idx, milli), over_quota
    return None, None, over_quota


_WRITTEN = (A.GPU_INDICES, A.GPU_MILLI, A.OVER_QUOTA_PLACED, A.PLANNED_NODE)


def request_signature(pod: JSON) -> tuple:
    """What ``parse_pod`` reads apart from the fields the pod's life changes (node,
    deletion, phase): equal signatures parse to the same request."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ann = meta.get("annotations") or {}
    if any(k in ann for k in _WRITTEN):
        ann = {k: v for k, v in ann.items() if k not in _WRITTEN}
    # Only gpupool's labels are requests: the API server copies the node's topology labels
    # onto the pod when it is bound, and that must not make the bind a new request.
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(A.PREFIX)}
    return (meta.get("uid"), ann, labels,
            [c.get("resources") for c in spec.get("containers") or ()],
            [c.get("resources") for c in spec.get("initContainers") or ()],
            spec.get("terminationGracePeriodSeconds"),
            spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations"),
            pod_claims(spec, meta["name"]))


def update_pod(old: PodRequest, pod: JSON) -> PodRequest:
    """``parse_pod`` for a pod whose ``request_signature`` did not change: only the
    fields its life changes (node, the scheduler's annotations, deletion, phase) are read
    again. Most watch events are these: the bind, kwok's or the kubelet's status updates."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    node = spec.get("nodeName") or None
    new = copy.copy(old)  # a shallow copy: dataclasses.replace re-runs __init__, 3x slower
    new.placement, new.plan, new.over_quota = _where(meta.get("annotations") or {}, node, old.key)
    new.node = node
    new.deleting = bool(meta.get("deletionTimestamp"))
    status = pod.get("status") or {}
    new.done = status.get("phase") in ("Succeeded", "Failed")
    new.start_time = _start_time(status, f"pod {old.key}")
    new.resource_version = meta.get("resourceVersion", "")
    new.labels = meta.get("labels") or {}
    return new


# ----------------------------------------------------------------------------------- nodes
def parse_node(node: JSON, pool_label: str = "gpupool.io/node-pool") -> Node:
    meta, status = node["metadata"], node.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    count = int(parse_quantity(alloc.get(GPU_RESOURCE, 0), f"node {meta['name']} {GPU_RESOURCE}"))
    model = labels.get(A.NODE_GPU_PRODUCT, "unknown")
    mem = int(labels.get(A.NODE_GPU_MEMORY) or 0) or 1
    uuids = [u.strip() for u in (meta.get("annotations") or {}).get(A.NODE_GPU_UUIDS, "").split(",")]
    gpus = [GPU(i, model, mem, uuids[i] if i < len(uuids) else "") for i in range(count)]
    cpu = parse_quantity(alloc.get("cpu", "0"), "cpu")
    memory = parse_quantity(alloc.get("memory", "0"), "memory")
    return Node(
        name=meta["name"], gpus=gpus, cpu_milli=int(cpu * 1000), memory_mib=int(memory / 2**20),
        pool=labels.get(pool_label, DEFAULT_POOL), labels=dict(labels),
        taints=parse_taints(node.get("spec") or {}),
    )


def parse_taints(spec: JSON) -> tuple[Taint, ...]:
    return tuple(Taint(t.get("key", ""), str(t.get("value") or ""), t.get("effect", ""))
                 for t in spec.get("taints") or ())


def node_schedulable(node: JSON) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


# ------------------------------------------------------------------------ custom resources
def _quotas(spec: JSON) -> dict[str, Quota]:
    out = {}
    for pool, q in (spec.get("quotas") or {}).items():
        out[pool] = Quota(
            gpus=float(q.get("gpus", 0)),
            over_quota_weight=float(q.get("overQuotaWeight", 1)),
            limit=None if q.get("limit") is None else float(q["limit"]),
            cpu=None if q.get("cpu") is None else float(q["cpu"]),
            memory_gib=None if q.get("memoryGib") is None else float(q["memoryGib"]),
        )
    return out


def parse_department(obj: JSON) -> Department:
    return Department(obj["metadata"]["name"], _quotas(obj.get("spec") or {}))


def parse_project(obj: JSON) -> Project:
    spec = obj.get("spec") or {}
    return Project(obj["metadata"]["name"], spec.get("department", ""), _quotas(spec))


# -------------------------------------------------------------------------------- writing
def placement_annotations(p: PodPlacement, over_quota: bool) -> dict[str, str]:
    return {
        A.GPU_INDICES: ",".join(str(i) for i in p.gpu_indices),
        A.GPU_MILLI: str(p.gpu_milli),
        A.OVER_QUOTA_PLACED: "true" if over_quota else "false",
        A.PLANNED_NODE: p.node,
    }


def binding(pod: PodRequest, p: PodPlacement, over_quota: bool) -> JSON:
    """A Binding that also stamps the placement on the pod (the API server copies a
    Binding's annotations onto the pod), so binding and the restart state are one write."""
    return {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                     "annotations": placement_annotations(p, over_quota)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": p.node},
    }  # fmt: skip


def fraction_config_map(pod: PodRequest, p: PodPlacement, node: Node,
                        preload: str = DEFAULT_PRELOAD, reserved: str | None = None) -> JSON:
    """The per-pod ConfigMap a fractional pod's ``envFrom`` names: which GPU (``reserved``:
    the UUID of the GPU the kubelet gave the slot's reservation), the memory cap in bytes, and
    the interception library to preload."""
    gpu = node.gpus[p.gpu_indices[0]]
    uuid = reserved or gpu.uuid
    data = {
        "NVIDIA_VISIBLE_DEVICES": uuid or str(gpu.index),
        "GPUPOOL_GPU_INDEX": str(gpu.index),
        "GPUPOOL_GPU_UUID": uuid,
        "GPUPOOL_GPU_MODEL": gpu.model,
        "GPUPOOL_GPU_MILLI": str(p.gpu_milli),
        **share_env(gpu.memory_mib, p.gpu_milli, pod.demand.gpu_memory_mib),
        "LD_PRELOAD": preload,
    }
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": pod.config_map, "namespace": pod.namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpupool-scheduler"},
            "annotations": {"gpupool.io/pod": pod.name},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                 "uid": pod.uid}],
        },
        "data": data,
    }  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(t: float) -> str:
    """Epoch seconds as an RFC 3339 time, to the microsecond."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def recorded_lag(projects: list[JSON]) -> tuple[dict[tuple[str, str], float], float] | None:
    """The over-quota lag the Projects' status holds (milli-GPU-seconds per (project, pool))
    and the latest time it was recorded; None when no status holds one."""
    lag: dict[tuple[str, str], float] = {}
    at = 0.0
    for obj in projects:
        st = obj.get("status") or {}
        when = st.get("overQuotaLagAt")
        if not when:
            continue
        try:
            at = max(at, parse_time(when))
            for pool, x in (st.get("overQuotaLagGpuSeconds") or {}).items():
                lag[(obj["metadata"]["name"], pool)] = float(x) * MILLI
        except (ValueError, TypeError, AttributeError):
            continue  # an unreadable status: that project starts even
    return (lag, at) if at else None


def scheduled_condition(reason: str, message: str) -> JSON:
    """A strategic-merge patch for the pod status: PodScheduled=False with our reason."""
    return {"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": reason,
        "message": message, "lastTransitionTime": _now(),
    }]}}  # fmt: skip


def preemption_mark(message: str) -> JSON:
    """A strategic-merge patch for the pod status: DisruptionTarget=True, before an eviction."""
    return preemption_condition(message, _now())


def event(pod_ns: str, pod_name: str, pod_uid: str, reason: str, message: str,
          etype: str = "Warning", component: str = "gpupool-scheduler") -> JSON:
    now = _now()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{pod_name}.", "namespace": pod_ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod_ns,
                           "name": pod_name, "uid": pod_uid},
        "reason": reason, "message": message[:1024], "type": etype,
        "source": {"component": component}, "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }  # fmt: skip
