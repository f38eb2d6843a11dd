"""Where one pod goes: placement policies over ``ClusterArrays``.

A policy sees every node at once (a boolean ``mask`` of the nodes whose pool, model, CPU
and memory already allow the pod) and returns the node, the GPU slots and the milli-GPUs
per slot, or None when no node can hold the pod. Policies never change the arrays.

A policy may also have ``prepare(demands)``: the core calls it once per cycle with the
demands of the pending and running workloads, so a fragmentation-aware policy knows the
workload mix it should keep room for.

The package, by what each module holds:
  choice       ``Choice``, the "does not fit" score, tie order, fit tests
  mix          the workload mix (pod shapes and their probabilities)
  views        fragmentation views: the measure, bound to a cluster's model numbering
  score_cache  per-node scores kept in step with the arrays' stamps
  frag_policy  the base of the policies that score nodes by a view
  baselines    the FGD paper's baselines: random, tightpack, bestfit, fgd
  gpupool      gpupool's own policies
This module holds the interface and the registry.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..cluster import ClusterArrays
from ..model import PodDemand
from .baselines import FGD, BestFit, RandomFit, TightPack
from .choice import Choice
from .gpupool import GpupoolKeepWhole, GpupoolPolicy

__all__ = ["Choice", "PlacementPolicy", "POLICIES", "get_policy"]


class PlacementPolicy(Protocol):
    name: str

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None: ...


# One registry, in the order the README table lists them: the paper's baselines from the
# weakest up, then gpupool's own. "gpupool" is the policy the scheduler core uses by default.
# Every class takes an optional ``seed``: None (the scheduler) breaks ties by lowest node
# index, deterministically; a seed (the simulator) breaks them at random, as Kubernetes does.
POLICIES: dict[str, type] = {
    "random": RandomFit,
    "tightpack": TightPack,
    "bestfit": BestFit,
    "fgd": FGD,
    "gpupool": GpupoolPolicy,
    "gpupool-keepwhole": GpupoolKeepWhole,
}


def get_policy(name: str, seed: int | None = None) -> PlacementPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"policy: unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return cls(seed=seed)
