"""Variants of a trace's pods for the placement experiment: the same cluster, pods reshaped
from the trace's own by a seed, with a chosen share of GPU pods that name a GPU model, that
ask for several whole GPUs, or that ask for a fraction of one.

A variant keeps the trace's pod count and its CPU-only pods. Its GPU pods are drawn anew,
each kind from the trace's pods of that kind (the pods the trace has, with their CPU and
memory): ``fraction_share`` of them fractional (one GPU, less than 1000 milli),
``multi_gpu_share`` multi-GPU (2 or more whole GPUs), the rest single whole GPUs. Within a
kind the trace's pods are taken in a seeded order, all of them before any a second time.
Then ``model_share`` of the GPU pods, drawn with the seed, name one GPU model: one of the
models the cluster has nodes of that could hold the pod, each as likely
(``model_weight: uniform``, the default: scarce models are asked for as often as common
ones, so the pods that name them compete for few nodes), or weighted by that model's GPUs
on those nodes (``model_weight: gpus``: asked for as the cluster offers them). Where
``model_share`` is given, the trace's own model constraints are dropped first, so the share
is exact (of the GPU pods some node could hold; a pod no node holds names none).

A share left out (None) keeps the trace's: its pods of that kind as they are (for
``model_share``: the trace's own constraints). The same trace, cluster and variant (seed
included) give the same pods, in the same file order, on every machine.

The Alibaba trace's own variant files (``gpushareNN``, ``multigpuNN``, ``gpuspecNN``) are
samples of the default list built the same way, one kind of work at a time; this draws any
mix of the three, with a seed, so a policy can be checked on variants nobody tuned it on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..model import MILLI, Node, ValidationError
from .trace import TracePod

SHARES = ("model_share", "multi_gpu_share", "fraction_share")
MODEL_WEIGHTS = ("uniform", "gpus")


@dataclass(frozen=True)
class TraceVariant:
    """How to reshape a trace's pods (module docstring). ``seed`` None: the caller's seed
    (the placement experiment draws one variant per seed)."""

    model_share: float | None = None
    multi_gpu_share: float | None = None
    fraction_share: float | None = None
    seed: int | None = None
    model_weight: str = "uniform"  # or "gpus": a model as often as the cluster has its GPUs

    def __post_init__(self) -> None:
        for key in SHARES:
            v = getattr(self, key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
                raise ValidationError(f"variant.{key}", f"must be a share between 0 and 1, got {v!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValidationError("variant.seed", f"must be an integer >= 0, got {self.seed!r}")
        if self.model_weight not in MODEL_WEIGHTS:
            raise ValidationError("variant.model_weight", f"must be one of {', '.join(MODEL_WEIGHTS)}, got {self.model_weight!r}")
        if (self.multi_gpu_share or 0.0) + (self.fraction_share or 0.0) > 1.0 + 1e-9:
            raise ValidationError(
                "variant.fraction_share",
                f"fraction_share + multi_gpu_share must be at most 1, got {self.fraction_share} + {self.multi_gpu_share}",
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TraceVariant:
        """From a mapping of the field names (a scenario's or the command line's); an
        unknown key or a bad value is an error naming it."""
        if not isinstance(data, Mapping):
            raise ValidationError("variant", f"must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ValidationError(f"variant.{key}", f"unknown key; known: {', '.join(sorted(known))}")
        return cls(**data)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, text: str) -> TraceVariant:
        """``model_share=0.33,multi_gpu_share=0.05,seed=3,model_weight=gpus`` (the command
        line's spelling)."""
        data: dict[str, object] = {}
        for part in (x.strip() for x in text.split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq:
                raise ValidationError(f"variant.{key}", f"must be key=value, got {part!r}")
            try:
                data[key] = value.strip() if key == "model_weight" else int(value) if key == "seed" else float(value)
            except ValueError:
                raise ValidationError(f"variant.{key}", f"must be a number, got {value.strip()!r}") from None
        return cls.from_dict(data)

    def label(self) -> str:
        """A short name for tables: ``m0.33-g0.05-f0.44`` (``-`` where the trace's share is kept)."""
        parts = []
        for tag, v in zip("mgf", (self.model_share, self.multi_gpu_share, self.fraction_share)):
            parts.append(f"{tag}{'-' if v is None else f'{v:.2f}'}")
        return "-".join(parts)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def kind_of(p: TracePod) -> str:
    """``cpu`` (no GPU), ``fraction``, ``single`` (one whole GPU) or ``multi``."""
    if p.num_gpu == 0 or p.gpu_milli == 0:
        return "cpu"
    if p.num_gpu == 1:
        return "fraction" if p.gpu_milli < MILLI else "single"
    return "multi"


def shares_of(pods: list[TracePod]) -> dict[str, float]:
    """The shares a variant sets, as ``pods`` have them (of the GPU pods)."""
    gpu = [p for p in pods if kind_of(p) != "cpu"]
    n = len(gpu) or 1
    return {
        "model_share": sum(1 for p in gpu if p.gpu_models) / n,
        "multi_gpu_share": sum(1 for p in gpu if kind_of(p) == "multi") / n,
        "fraction_share": sum(1 for p in gpu if kind_of(p) == "fraction") / n,
    }


def _draw(rng: np.random.Generator, pool: list[TracePod], n: int) -> list[TracePod]:
    """``n`` pods of ``pool`` in a seeded order: every pod once before any twice."""
    out: list[TracePod] = []
    while len(out) < n:
        order = rng.permutation(len(pool))
        out.extend(pool[i] for i in order[: n - len(out)])
    return out


def reshape(pods: list[TracePod], nodes: list[Node], variant: TraceVariant, seed: int | None = None) -> list[TracePod]:
    """The pods of ``variant`` drawn from ``pods`` on ``nodes`` (module docstring), with
    ``variant.seed``, else ``seed``. Each pod keeps its source's creation time; its name
    gains ``~k`` where the source is drawn for the k-th time (k >= 1), so names stay unique."""
    s = variant.seed if variant.seed is not None else seed
    if s is None:
        raise ValidationError("variant.seed", "a variant needs a seed (its own or the run's)")
    rng = np.random.default_rng([int(s), 0x7A12A27])
    by_kind: dict[str, list[TracePod]] = {"cpu": [], "fraction": [], "single": [], "multi": []}
    for p in pods:
        by_kind[kind_of(p)].append(p)
    n_gpu = len(pods) - len(by_kind["cpu"])
    want = {k: len(v) for k, v in by_kind.items() if k != "cpu"}
    if variant.fraction_share is not None:
        want["fraction"] = round(variant.fraction_share * n_gpu)
    if variant.multi_gpu_share is not None:
        want["multi"] = round(variant.multi_gpu_share * n_gpu)
    if variant.fraction_share is not None or variant.multi_gpu_share is not None:
        want["single"] = n_gpu - want["fraction"] - want["multi"]
        if want["single"] < 0:  # one share given, the trace's other one too big for it
            raise ValidationError(
                "variant.fraction_share" if variant.fraction_share is not None else "variant.multi_gpu_share",
                f"with the trace's other share it leaves {want['single']} single-GPU pods",
            )
    key_of = {"fraction": "fraction_share", "multi": "multi_gpu_share", "single": "fraction_share"}
    out = list(by_kind["cpu"])
    for kind in ("fraction", "single", "multi"):
        if want[kind] and not by_kind[kind]:
            raise ValidationError(f"variant.{key_of[kind]}", f"asks for {kind} GPU pods and the trace has none")
        if want[kind] == len(by_kind[kind]):
            out.extend(by_kind[kind])  # a kind whose share is kept keeps its pods as they are
        else:
            out.extend(_draw(rng, by_kind[kind], want[kind]))
    if variant.model_share is not None:
        out = _name_models(rng, out, nodes, variant.model_share, variant.model_weight == "uniform")
    seen: dict[str, int] = {}
    named = []
    for p in out:
        k = seen.get(p.name, 0)
        seen[p.name] = k + 1
        named.append(p if k == 0 else dataclasses.replace(p, name=f"{p.name}~{k}"))
    return named


def _name_models(
    rng: np.random.Generator, pods: list[TracePod], nodes: list[Node], share: float, uniform: bool
) -> list[TracePod]:
    """``share`` of the GPU pods (drawn with ``rng``) name one model, the others none."""
    models = sorted({n.gpus[0].model for n in nodes if n.gpus and n.gpus[0].model})
    if share and not models:
        raise ValidationError("variant.model_share", "the cluster's nodes name no GPU model")
    mid = {m: i for i, m in enumerate(models)}
    gpus = np.array([len(n.gpus) for n in nodes if n.gpus and n.gpus[0].model], dtype=np.int64)
    cpu = np.array([n.cpu_milli for n in nodes if n.gpus and n.gpus[0].model], dtype=np.int64)
    mem = np.array([n.memory_mib for n in nodes if n.gpus and n.gpus[0].model], dtype=np.int64)
    model = np.array([mid[n.gpus[0].model] for n in nodes if n.gpus and n.gpus[0].model], dtype=np.int64)
    weight_cache: dict[tuple[int, int, int], np.ndarray] = {}

    def weights(p: TracePod) -> np.ndarray:
        shape = (p.num_gpu, p.cpu_milli, p.memory_mib)
        w = weight_cache.get(shape)
        if w is None:
            hosts = (gpus >= p.num_gpu) & (cpu >= p.cpu_milli) & (mem >= p.memory_mib)
            w = np.bincount(model[hosts], weights=gpus[hosts], minlength=len(models))
            weight_cache[shape] = w = (w > 0).astype(np.float64) if uniform else w
        return w

    # Of the GPU pods some node could hold (a pod no node holds names no model: it fails anyway).
    gpu_idx = [i for i, p in enumerate(pods) if kind_of(p) != "cpu"]
    k = min(round(share * len(gpu_idx)), len(gpu_idx))
    able = np.asarray([i for i in gpu_idx if weights(pods[i]).sum() > 0], dtype=np.int64)
    chosen = set(rng.choice(able, size=min(k, len(able)), replace=False).tolist()) if k else set()
    out = []
    for i, p in enumerate(pods):
        if i not in chosen:
            out.append(p if not p.gpu_models else dataclasses.replace(p, gpu_models=()))
            continue
        w = weights(p)
        m = models[int(rng.choice(len(models), p=w / float(w.sum())))]
        out.append(dataclasses.replace(p, gpu_models=(m,)))
    return out
