"""The workload mix: the pod shapes a cluster expects, each with its probability, which
the fragmentation views measure against."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..model import MILLI, PodDemand


@dataclass(frozen=True)
class Shape:
    """One pod shape of a workload mix: CPU, milli per GPU (0: CPU-only), GPU count, models."""

    cpu: int
    milli: int
    count: int
    models: tuple[str, ...] = ()


class Mix:
    """The pod shapes a cluster expects, each with its probability (they sum to 1)."""

    def __init__(self, shapes: Sequence[Shape], probs: Sequence[float]):
        total = float(sum(probs))
        if not shapes or total <= 0:
            raise ValueError("mix: needs at least one shape with a positive weight")
        self.shapes = tuple(shapes)
        self.probs = np.asarray(probs, dtype=np.float64) / total
        self.key = tuple(zip(self.shapes, np.round(self.probs, 6).tolist()))
        self.token = hash(self.key)  # hashed once: part of every call's cache key

    @classmethod
    def from_counts(cls, counts: dict[Shape, float], coverage: float = 0.95) -> Mix:
        """The most frequent shapes that together make ``coverage`` of the count (the FGD
        simulator's "typical pods": popularity threshold 95%), renormalised."""
        items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].cpu, kv[0].milli, kv[0].count, kv[0].models))
        total = sum(v for _, v in items)
        keep, acc = [], 0.0
        for shape, v in items:
            if acc >= coverage * total:
                break
            keep.append((shape, v))
            acc += v
        return cls([s for s, _ in keep], [v for _, v in keep])

    @classmethod
    def from_demands(
        cls,
        demands: Iterable[PodDemand],
        models: Iterable[tuple[str, ...]] | None = None,
        coverage: float = 0.95,
        gpu_weight: float = 0.0,
    ) -> Mix:
        """Shape counts from demands; ``gpu_weight`` counts a pod as ``1 + gpu_weight x its
        GPU milli / 1000`` instead of 1 (the FGD simulator's ``gpuResWeight``, generalised to
        fractions)."""
        counts: dict[Shape, float] = {}
        models_it = iter(models) if models is not None else None
        for d in demands:
            m = next(models_it) if models_it is not None else ()
            s = shape_of(d, m)
            counts[s] = counts.get(s, 0.0) + 1.0 + gpu_weight * s.milli * s.count / MILLI
        if not counts:
            return default_mix()
        return cls.from_counts(counts, coverage)


def shape_of(d: PodDemand, models: tuple[str, ...] = ()) -> Shape:
    if d.gpus:
        return Shape(d.cpu_milli, MILLI, d.gpus, tuple(models))
    if d.gpu_fraction:
        return Shape(d.cpu_milli, round(d.gpu_fraction * MILLI), 1, tuple(models))
    if d.gpu_memory_mib:
        # Memory requests become milli on the GPU they land on; 16 GiB GPUs as the yardstick.
        return Shape(d.cpu_milli, min(MILLI, math.ceil(d.gpu_memory_mib * MILLI / 16384)), 1, tuple(models))
    return Shape(d.cpu_milli, 0, 0, tuple(models))


def default_mix() -> Mix:
    """Used when no one told the policy what to expect: the shape mix of the Alibaba openb
    2023 trace, rounded (whole GPUs dominate; fractions near 1/4, 1/2 and 4/5)."""
    shapes = [
        Shape(8000, MILLI, 1),
        Shape(4000, 500, 1),
        Shape(4000, 800, 1),
        Shape(2000, 250, 1),
        Shape(16000, MILLI, 2),
        Shape(32000, MILLI, 4),
        Shape(64000, MILLI, 8),
        Shape(4000, 0, 0),
    ]
    return Mix(shapes, [48, 12, 13, 9, 1, 1, 1, 13])
