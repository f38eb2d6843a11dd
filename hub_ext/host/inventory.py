"""GPU inventory of the embedded node: NVML when the machine has GPUs, else the declared
list from the config. Also per-GPU utilization for the culler and the chart (NVML only)."""

from __future__ import annotations

import os
import socket

from scheduler.model import DEFAULT_POOL, GPU, Node


def _nvml():
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU
        return None
    return pynvml


def discover(declared: list[dict], use_nvml: bool = True) -> tuple[list[Node], str]:
    """Nodes and where they came from ("nvml" or "declared")."""
    nv = _nvml() if use_nvml else None
    if nv is not None and nv.nvmlDeviceGetCount() > 0:
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            gpus.append(GPU(i, name.decode() if isinstance(name, bytes) else name, int(mem),
                            uuid.decode() if isinstance(uuid, bytes) else uuid))
        return [_local_node(socket.gethostname() or "local", gpus)], "nvml"
    nodes = []
    for i, d in enumerate(declared):
        name = str(d.get("node", f"local-{i}"))
        gpus = [
            GPU(j, str(d.get("model", "GPU")), int(d.get("memory_mib", 81559)), f"GPU-declared-{name}-{j}")
            for j in range(int(d.get("count", 1)))
        ]
        # A declared node stands for a GPU server: its CPU and memory come from the
        # declaration (cpu, memory_gib), not from this machine.
        nodes.append(Node(name=name, gpus=gpus, cpu_milli=round(float(d.get("cpu", 64)) * 1000),
                          memory_mib=round(float(d.get("memory_gib", 256)) * 1024),
                          pool=str(d.get("pool", DEFAULT_POOL))))
    return nodes, "declared"


def _local_node(name: str, gpus: list[GPU]) -> Node:
    mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return Node(name=name, gpus=gpus, cpu_milli=(os.cpu_count() or 1) * 1000, memory_mib=int(mem_mib))


def gpu_utilization() -> dict[int, float] | None:
    """GPU index -> utilization percent now; None where NVML is not available."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return {
            i: float(nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(i)).gpu)
            for i in range(nv.nvmlDeviceGetCount())
        }
    except Exception:
        return None
