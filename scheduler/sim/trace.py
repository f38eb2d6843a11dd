"""Load the Alibaba GPU cluster trace v2023 ("openb") CSVs into gpupool's model.

Nodes: ``sn, cpu_milli, memory_mib, gpu, model`` -> ``model.Node`` (GPUs get the model's
memory size; unknown models, such as the trace's anonymised G2/G3, get 16 GiB).
Pods: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
creation_time, deletion_time, scheduled_time`` -> ``TracePod``, which keeps every column so
a replay with departures can use the times; ``TracePod.demand`` is the ``PodDemand``.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from ..model import GPU, MILLI, Node, PodDemand, ValidationError


def default_trace_dir() -> Path:
    """``$GPUPOOL_TRACES``, else the copy in the repository's ``data/openb-2023``."""
    env = os.environ.get("GPUPOOL_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "data" / "openb-2023"


# MiB per GPU by model name (the FGD simulator's table); others get DEFAULT_GPU_MEMORY_MIB.
GPU_MEMORY_MIB = {
    "P4": 7611,
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "V100M32": 32510,
    "A100": 81251,
}
DEFAULT_GPU_MEMORY_MIB = 16384


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_models: tuple[str, ...]  # empty: any model
    qos: str = ""
    phase: str = ""
    creation_time: int = 0
    deletion_time: int | None = None
    scheduled_time: int | None = None

    @property
    def demand(self) -> PodDemand:
        if self.num_gpu == 0 or self.gpu_milli == 0:
            return PodDemand(cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return PodDemand(gpu_fraction=self.gpu_milli / MILLI, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)
        return PodDemand(gpus=self.num_gpu, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def ran_s(self) -> float:
        """How long the pod ran in the trace (a replay takes only pods that ran)."""
        if self.deletion_time is None or self.scheduled_time is None:
            raise ValidationError(f"pod[{self.name}]", "has no scheduled or deletion time: it never ran")
        return float(self.deletion_time - self.scheduled_time)


def _int(row: dict, key: str, where: str) -> int:
    try:
        return int(row[key])
    except (KeyError, ValueError):
        raise ValidationError(f"{where}.{key}", f"must be an integer, got {row.get(key)!r}") from None


def _opt_int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def load_nodes(path: str | Path, pool: str = "default") -> list[Node]:
    nodes = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            where = f"{Path(path).name}[{i}]"
            model = (row.get("model") or "").strip()
            count = _int(row, "gpu", where)
            mem = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
            node = Node(
                name=row["sn"],
                gpus=[GPU(index=j, model=model, memory_mib=mem) for j in range(count)],
                cpu_milli=_int(row, "cpu_milli", where),
                memory_mib=_int(row, "memory_mib", where),
                pool=pool,
            )
            node.validate()
            nodes.append(node)
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """Pods in file order; ``by_creation`` sorts them for a replay."""
    pods = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            where = f"{Path(path).name}[{i}]"
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(dict.fromkeys(m for m in spec.split("|") if m))
            num_gpu = _int(row, "num_gpu", where)
            gpu_milli = _int(row, "gpu_milli", where)
            if num_gpu < 0 or not (0 <= gpu_milli <= MILLI) or (num_gpu > 1 and gpu_milli not in (0, MILLI)):
                raise ValidationError(where, f"bad GPU request num_gpu={num_gpu} gpu_milli={gpu_milli}")
            pods.append(
                TracePod(
                    name=row["name"],
                    cpu_milli=_int(row, "cpu_milli", where),
                    memory_mib=_int(row, "memory_mib", where),
                    num_gpu=num_gpu,
                    gpu_milli=gpu_milli,
                    gpu_models=models,
                    qos=row.get("qos", ""),
                    phase=row.get("pod_phase", ""),
                    creation_time=_opt_int(row.get("creation_time")) or 0,
                    deletion_time=_opt_int(row.get("deletion_time")),
                    scheduled_time=_opt_int(row.get("scheduled_time")),
                )
            )
    return pods


def by_creation(pods: list[TracePod]) -> list[TracePod]:
    return sorted(pods, key=lambda p: (p.creation_time, p.name))
