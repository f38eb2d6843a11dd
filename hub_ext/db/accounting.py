"""GPU-hours by user, project or department for any time range, from the event log.

The one place this is computed; the REST API (``/usage``, ``/usage.csv``) and the admin
panel's Usage page call ``report``.

* An allocation opens at a ``placed`` event (which carries the GPUs taken, fractions as
  fractions: a 0.25 GPU workspace counts 0.25 GPU-hours per hour; events from before that
  field are read from their message) and closes at the
  workload's next ``released`` or ``requeued`` event (after a preemption the GPUs are held
  until the process exits, so ``preempted`` itself closes nothing). A ``placed`` while one
  is open closes the open one there.
* Still open: counts up to ``now``. Everything is clipped to the range.
* User and department are the ones recorded on the ``placed`` event (the owner and the
  project's department then), so moving a project later does not rewrite history.
* Utilization (NVML only, ``GpuSampleRow``): the mean utilization of an allocation's GPUs
  over the samples taken while it held them, times its GPU-hours. A GPU shared by
  fractions reports one figure for the whole GPU; each sharer is credited that figure
  times its own fraction, so this is an estimate for shared GPUs.
"""

from __future__ import annotations

import bisect
import csv
import io
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, select

from .. import validation
from ..validation import FieldError
from .tables import EventRow, GpuSampleRow, NodeRow, SampleRow

__all__ = ["GROUPS", "Allocation", "allocations", "close_open_allocations", "parse_range",
           "report", "to_csv", "usage"]

OPENS = "placed"
CLOSES = ("released", "requeued")
ALLOCATION_EVENTS = (OPENS, *CLOSES)
GROUPS = ("user", "project", "department")
MAX_RANGE_DAYS = 400
DEFAULT_RANGE_DAYS = 7


@dataclass(frozen=True)
class Allocation:
    workload: str
    user: str
    project: str
    department: str
    gpus: float
    start: float
    end: float | None  # None: still held
    placement: tuple[tuple[str, tuple[int, ...], int], ...] = ()  # (node, gpu indices, milli each)

    def overlap_s(self, start: float, end: float, now: float) -> float:
        stop = min(end, now if self.end is None else self.end)
        return max(0.0, stop - max(start, self.start))


def allocations(events) -> list[Allocation]:
    """Allocations from allocation events (objects with ts, kind, workload, project, user,
    department, gpus, placement) in log order."""
    open_: dict[str, Allocation] = {}
    out: list[Allocation] = []
    for e in events:
        if e.kind not in ALLOCATION_EVENTS:
            continue
        held = open_.pop(e.workload, None)
        if held is not None:
            out.append(_closed(held, e.ts))
        gpus = e.gpus if e.gpus is not None else _gpus_in_message(getattr(e, "message", ""))
        if e.kind == OPENS and gpus:
            open_[e.workload] = Allocation(
                e.workload, e.user or "", e.project or "", e.department or "", float(gpus), e.ts, None,
                tuple((p["node"], tuple(p["gpu_indices"]), int(p["gpu_milli"])) for p in e.placement or ()),
            )
    return out + list(open_.values())


# "placed" events written before they carried ``gpus`` say it in words
# (scheduler/embedded/adapter.py): "w placed on node GPU 0,1 (0.5 each); node2 GPU 3 (0.5 each)".
_PLACED_WORDS = re.compile(r"GPU ([\d,]+) \(([\d.]+) each\)")


def _gpus_in_message(message: str) -> float:
    return sum(len(idx.split(",")) * float(each) for idx, each in _PLACED_WORDS.findall(message or ""))


def _closed(a: Allocation, ts: float) -> Allocation:
    return Allocation(a.workload, a.user, a.project, a.department, a.gpus, a.start, ts, a.placement)


class Utilization:
    """Per-GPU utilization samples, for the mean over any stretch of time."""

    def __init__(self, samples) -> None:
        series: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for s in samples:
            series[(s.node, s.gpu_index)].append((s.ts, s.utilization_pct))
        self.ts: dict[tuple[str, int], list[float]] = {}
        self.sums: dict[tuple[str, int], list[float]] = {}  # prefix sums of the values
        for key, points in series.items():
            points.sort()
            self.ts[key] = [t for t, _ in points]
            acc = [0.0]
            for _, v in points:
                acc.append(acc[-1] + v)
            self.sums[key] = acc

    def mean(self, a: Allocation, start: float, end: float, now: float) -> float | None:
        """Mean utilization percent of ``a``'s GPUs while it held them inside the range,
        weighted by its share of each GPU; None when no sample fell in that time."""
        t0, t1 = max(start, a.start), min(end, now if a.end is None else a.end)
        total = weight = 0.0
        for node, indices, milli in a.placement:
            for i in indices:
                ts = self.ts.get((node, i))
                if not ts:
                    continue
                lo, hi = bisect.bisect_left(ts, t0), bisect.bisect_right(ts, t1)
                if hi > lo:
                    sums = self.sums[(node, i)]
                    total += milli * (sums[hi] - sums[lo]) / (hi - lo)
                    weight += milli
        return total / weight if weight else None


def usage(allocs: list[Allocation], start: float, end: float, by: str, now: float | None = None,
          util: Utilization | None = None) -> list[dict]:
    """Rows {name, gpu_hours, used_gpu_hours, utilization_pct, workloads}, most GPU-hours
    first. used_gpu_hours and utilization_pct are None where nothing was measured."""
    now = time.time() if now is None else now
    hours: dict[str, float] = defaultdict(float)
    used: dict[str, float] = defaultdict(float)
    measured: dict[str, float] = defaultdict(float)  # GPU-hours that had samples
    names: dict[str, set] = defaultdict(set)
    for a in allocs:
        s = a.overlap_s(start, end, now)
        if s <= 0:
            continue
        key = getattr(a, by)
        h = a.gpus * s / 3600
        hours[key] += h
        names[key].add(a.workload)
        pct = util.mean(a, start, end, now) if util is not None else None
        if pct is not None:
            used[key] += h * pct / 100
            measured[key] += h
    rows = [{
        "name": key, "gpu_hours": round(h, 6),
        "used_gpu_hours": round(used[key], 6) if measured[key] else None,
        "utilization_pct": round(100 * used[key] / measured[key], 2) if measured[key] else None,
        "workloads": len(names[key]),
    } for key, h in hours.items()]
    return sorted(rows, key=lambda r: (-r["gpu_hours"], r["name"]))


# -- the database side ------------------------------------------------------------------
_COLUMNS = (EventRow.id, EventRow.ts, EventRow.kind, EventRow.workload, EventRow.project, EventRow.user,
            EventRow.department, EventRow.gpus, EventRow.placement, EventRow.message)


def load_allocations(session, start: float, end: float) -> list[Allocation]:
    """The allocations overlapping [start, end): the allocation events inside the range,
    and each workload's last one before it where that one left GPUs held."""
    alloc = EventRow.kind.in_(ALLOCATION_EVENTS)
    inside = session.execute(select(*_COLUMNS).where(alloc, EventRow.ts >= start, EventRow.ts < end)).all()
    last_before = (select(func.max(EventRow.id).label("id")).where(alloc, EventRow.ts < start)
                   .group_by(EventRow.workload).subquery())
    held_at_start = session.execute(select(*_COLUMNS).join(last_before, EventRow.id == last_before.c.id)
                                    .where(EventRow.kind == OPENS)).all()
    return allocations(sorted([*held_at_start, *inside], key=lambda e: (e.ts, e.id)))


def utilization_measured(session) -> bool:
    """True where GPUs come from NVML (so utilization is sampled)."""
    return session.scalar(select(func.count()).select_from(NodeRow).where(NodeRow.source == "nvml")) > 0


def report(session, start: float, end: float, by: str, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    allocs = load_allocations(session, start, end)
    nvml = utilization_measured(session)
    util = None
    if nvml:
        util = Utilization(session.scalars(
            select(GpuSampleRow).where(GpuSampleRow.ts >= start, GpuSampleRow.ts <= min(end, now))).all())
    rows = usage(allocs, start, end, by, now, util)
    return {
        "from": _iso(start), "to": _iso(end), "by": by, "items": rows,
        "total_gpu_hours": round(sum(r["gpu_hours"] for r in rows), 6),
        "utilization_measured": nvml,
    }


def close_open_allocations(session, message: str = "hub restarted", running=frozenset()) -> int:
    """After a restart: close every open allocation at the last allocation sample the old
    hub took (or now, without one), except those of ``running`` workloads (their processes
    outlived the hub, so their GPU-hours go on without a gap). Returns how many."""
    at = session.scalar(select(func.max(SampleRow.ts))) or time.time()
    latest = (select(EventRow.workload, func.max(EventRow.id).label("id"))
              .where(EventRow.kind.in_(ALLOCATION_EVENTS)).group_by(EventRow.workload).subquery())
    still_open = session.scalars(
        select(EventRow).join(latest, EventRow.id == latest.c.id).where(EventRow.kind == OPENS)).all()
    for e in still_open:
        if e.workload in running:
            continue
        session.add(EventRow(ts=max(at, e.ts), kind="released", workload=e.workload, project=e.project,
                             user=e.user, department=e.department,
                             message=f"{e.workload} released its GPUs ({message})"))
    return sum(e.workload not in running for e in still_open)


# -- request parameters and CSV ---------------------------------------------------------
def _parse_time(field: str, text: str, end_of_day: bool) -> float:
    """A date (``end_of_day``: its end) or date-time, years 1970-9999 (validation.utc_time)."""
    return validation.utc_time(text, field, end_of_day)


def parse_range(args: dict[str, str], now: float | None = None) -> tuple[float, float, str]:
    """(start, end, by) from query arguments ``from``, ``to`` and ``by``.

    Dates without a time are UTC days, and ``to`` includes its day (from=2026-11-01&
    to=2026-11-30 is all of November); times without a zone are UTC. Defaults: ``to`` now,
    ``from`` 7 days before ``to``, ``by`` project."""
    now = time.time() if now is None else now
    by = args.get("by") or "project"
    if by not in GROUPS:
        raise FieldError("by", f"must be one of {', '.join(GROUPS)}, got {validation.show(by)}")
    end = _parse_time("to", args["to"], True) if args.get("to") else now
    start = _parse_time("from", args["from"], False) if args.get("from") else end - DEFAULT_RANGE_DAYS * 86400
    if end <= start:
        raise FieldError("to", f"must be after from ({_iso(start)}), got {_iso(end)}")
    if end - start > MAX_RANGE_DAYS * 86400:
        raise FieldError("to", f"the range may span at most {MAX_RANGE_DAYS} days, "
                               f"got {(end - start) / 86400:.0f}")
    return start, end, by


def to_csv(rep: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([rep["by"], "gpu_hours", "used_gpu_hours", "utilization_pct", "workloads", "from", "to"])
    for r in rep["items"]:
        w.writerow([r["name"], r["gpu_hours"], "" if r["used_gpu_hours"] is None else r["used_gpu_hours"],
                    "" if r["utilization_pct"] is None else r["utilization_pct"], r["workloads"],
                    rep["from"], rep["to"]])
    return out.getvalue()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")
