"""The FGD paper's placement experiment (ATC'23, section 6): how much of a cluster's GPU
capacity a policy can fill before fragmentation stops it.

Protocol, per seed:
1. the trace's pods arrive, then pods drawn from the trace at random with
   ``numpy.random.default_rng(seed)`` (workload inflation). The trace's own pods come in an
   order shuffled with the seed (``order="shuffled"``, the default: what the paper's artifact
   does, ``--shuffle-pod=true``, its pod files carry no creation times) or in creation order
   (``order="creation"``);
2. the stream stops before the pod that would take the arrived GPU (or CPU) requests past
   the cluster's capacity, i.e. at "arrived GPU requests = 100% of capacity";
3. each pod is placed at once or counted as failed: no retries, departures or evictions;
4. the figure is the GPU milli placed divided by the GPU capacity.

The FGD-style policies learn the workload mix from the trace's pods (``prepare``), as the
paper's simulator builds its "typical pods" from the trace. Results are averaged over seeds;
the seed also drives the baselines' random tie-breaking.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, Node
from ..placement import Choice, get_policy
from .trace import TracePod, by_creation
from .variants import TraceVariant, reshape


@dataclass
class SeedResult:
    seed: int
    allocation_pct: float
    placed_milli: int
    arrived_milli: int
    capacity_milli: int
    arrived_pods: int
    failed_pods: int
    inflation_pods: int
    seconds: float


@dataclass
class PlacementResult:
    policy: str
    seeds: int
    order: str
    allocation_pct: float
    allocation_pct_std: float
    unallocated_gpus: float
    arrived_pct: float
    failed_pods: float
    capacity_gpus: float
    per_seed: list[SeedResult]

    def to_json(self) -> dict:
        d = asdict(self)
        d["per_seed"] = [asdict(s) for s in self.per_seed]
        return d


def _model_masks(arrays: ClusterArrays):
    cache: dict[tuple[str, ...], np.ndarray] = {}

    def mask_for(models: tuple[str, ...]) -> np.ndarray:
        m = cache.get(models)
        if m is None:
            ids = [arrays.models.index(x) for x in models if x in arrays.models]
            m = cache[models] = np.isin(arrays.model_id, ids)
        return m

    return mask_for


def run_seed(
    nodes: list[Node],
    pods: list[TracePod],
    policy: str,
    seed: int,
    on_place: Callable[[ClusterArrays, TracePod, Choice], None] | None = None,
    order: str = "shuffled",
) -> SeedResult:
    """One replay of the protocol (module docstring) for one policy and seed; ``on_place``
    sees every placement after it is applied (tests check invariants there)."""
    t0 = time.perf_counter()
    arrays = ClusterArrays.from_nodes(nodes)
    pol = get_policy(policy, seed=seed)
    if hasattr(pol, "prepare"):
        pol.prepare([p.demand for p in pods], [p.gpu_models for p in pods])
    cap_gpu = arrays.capacity_milli()
    cap_cpu = int(sum(n.cpu_milli for n in nodes))
    rng = np.random.default_rng(seed)
    model_mask = _model_masks(arrays)
    ordered = by_creation(pods)
    if order == "shuffled":
        ordered = [ordered[i] for i in rng.permutation(len(ordered))]
    elif order != "creation":
        raise ValueError(f"order: 'shuffled' or 'creation', got {order!r}")

    def stream():
        yield from ordered
        while True:
            yield pods[int(rng.integers(len(pods)))]

    arrived_gpu = arrived_cpu = placed = 0
    arrived = failed = 0
    for pod in stream():
        if arrived_gpu + pod.gpu_request_milli > cap_gpu or arrived_cpu + pod.cpu_milli > cap_cpu:
            break
        arrived_gpu += pod.gpu_request_milli
        arrived_cpu += pod.cpu_milli
        arrived += 1
        d = pod.demand
        mask = (arrays.cpu_free >= d.cpu_milli) & (arrays.mem_free >= d.memory_mib)
        if d.gpu_count:
            mask &= arrays.gpu_count >= d.gpu_count
            if pod.gpu_models:
                mask &= model_mask(pod.gpu_models)
        choice = pol.place(arrays, mask, d) if mask.any() else None
        if choice is None:
            failed += 1
            continue
        arrays.take(choice.node, choice.gpus, choice.milli, d.cpu_milli, d.memory_mib)
        placed += choice.milli * len(choice.gpus)
        if on_place is not None:
            on_place(arrays, pod, choice)
    return SeedResult(
        seed=seed,
        allocation_pct=100.0 * placed / cap_gpu if cap_gpu else 0.0,
        placed_milli=placed,
        arrived_milli=arrived_gpu,
        capacity_milli=cap_gpu,
        arrived_pods=arrived,
        failed_pods=failed,
        inflation_pods=max(0, arrived - len(ordered)),
        seconds=time.perf_counter() - t0,
    )


def run(
    nodes: list[Node],
    pods: list[TracePod],
    policy: str,
    seeds: list[int],
    order: str = "shuffled",
    variant: TraceVariant | None = None,
) -> PlacementResult:
    """``run_seed`` per seed; with ``variant``, each seed on the pods of that variant drawn
    with the variant's seed, else with the run's (``variants.reshape``)."""
    per = [
        run_seed(nodes, pods if variant is None else reshape(pods, nodes, variant, s), policy, s, order=order)
        for s in seeds
    ]
    alloc = [r.allocation_pct for r in per]
    cap = per[0].capacity_milli if per else 0
    return PlacementResult(
        policy=policy,
        seeds=len(per),
        order=order,
        allocation_pct=statistics.fmean(alloc),
        allocation_pct_std=statistics.pstdev(alloc) if len(alloc) > 1 else 0.0,
        unallocated_gpus=statistics.fmean((r.capacity_milli - r.placed_milli) / MILLI for r in per),
        arrived_pct=statistics.fmean(100.0 * r.arrived_milli / r.capacity_milli for r in per),
        failed_pods=statistics.fmean(r.failed_pods for r in per),
        capacity_gpus=cap / MILLI,
        per_seed=per,
    )
