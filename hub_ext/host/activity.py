"""GPU activity of one fractional workload, from the interception library's shared account.

NVML sees a whole GPU: a 0.25 share beside a busy neighbour looks busy. The library counts
each workload's kernel launches and allocations in its own shared region (native/src/
account.c, ``struct gp_region``); the counters sit at fixed offsets after the header and
are read here from the file without joining the account's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler.contract import REGION_HEAD, region_counters

from . import regions


@dataclass(frozen=True)
class Activity:
    launches: int
    allocs: int
    last_active_s: float  # wall clock of the last launch or allocation; 0: none yet

    @property
    def count(self) -> int:
        return self.launches + self.allocs


NONE = Activity(0, 0, 0.0)


def read_region(path: str | Path) -> Activity | None:
    """The counters in a region file; ``NONE`` when the workload never touched the GPU
    (no file, or the empty one its launcher made), None when the file is not a region this
    library version wrote."""
    try:
        with open(regions.open_for_reading(path), "rb") as f:
            head = f.read(REGION_HEAD.size)
    except FileNotFoundError:
        return NONE
    except OSError:
        return None
    counters = region_counters(head)
    return None if counters is None else Activity(*counters)


def reader(state_dir: str | Path) -> Callable[[str], Activity | None]:
    """``workload -> Activity | None`` for the workloads of the hub whose state is in
    ``state_dir`` (its launcher's regions)."""
    folder = regions.of_state(state_dir)

    def workload_activity(workload: str) -> Activity | None:
        return read_region(folder / workload)

    return workload_activity


def is_fraction(placement: list[dict] | None) -> bool:
    """Placed on part of one GPU: the library enforces and counts it (scheduler/embedded/adapter.py
    gpu_env preloads it only there)."""
    return bool(placement) and any(0 < int(p.get("gpu_milli", 0)) < 1000 for p in placement or [])
