"""Prometheus metrics of the scheduler, the same for both adapters.

The embedded loop runs in the hub process, so its metrics are in the hub's default
registry and JupyterHub serves them at ``/hub/metrics`` (a token with ``read:metrics``);
``gpupool-scheduler`` serves them itself with ``--metrics-port`` (``serve``).

* Counters and the cycle histogram are updated once per cycle (``observe_cycle``).
* Gauges (queue, pending reasons, allocated and guaranteed GPUs, capacity) are read from
  the adapter's snapshot and last decisions when scraped (``SNAPSHOT.watch``), so they are
  current even when no cycle ran for a while and a deleted project leaves no stale series.
  Scrapes must run on the adapter's event loop (both endpoints do): the snapshot is not
  thread-safe.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from ..model import MILLI, Decisions
from ..snapshot import Snapshot

__all__ = ["SNAPSHOT", "observe_cycle", "pending_reason", "serve"]

CYCLE_SECONDS = Histogram(
    "gpupool_scheduler_cycle_seconds", "Time of one scheduling cycle: decide and apply",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
PREEMPTIONS = Counter(
    "gpupool_preemptions_total", "Workloads evicted by the scheduler (preempted or reclaimed), "
    "by the evicted workload's project", ["project"],
)
BINDS = Counter("gpupool_binds_total", "Workloads placed by the scheduler, by project", ["project"])
LEADER = Gauge("gpupool_scheduler_leader", "1 while this process is the active scheduler")

# The core writes pending reasons as sentences (scheduler/actions/, scheduler/quota.py);
# a label needs a small fixed set. First match wins; the order matters ("at its limit"
# sentences may also mention the quota).
REASON_KINDS = (
    ("over-quota is off", "quota"),
    ("at its limit", "limit"),
    ("fair share", "fair_share"),
    ("at its quota", "quota"),
    ("at its CPU quota", "quota"),
    ("at its memory quota", "quota"),
    ("no node in", "capacity"),
    ("nodes are available", "node_constraints"),  # selector, affinity, taints: kube-scheduler's words
)


def pending_reason(text: str) -> str:
    """The label value for a pending reason: quota, limit, fair_share, capacity,
    node_constraints or other."""
    for needle, kind in REASON_KINDS:
        if needle in text:
            return kind
    return "other"


def observe_cycle(snapshot: Snapshot, decisions: Decisions, seconds: float) -> None:
    CYCLE_SECONDS.observe(seconds)
    for b in decisions.binds:
        w = snapshot.workloads.get(b.workload)
        BINDS.labels(w.project if w else "").inc()
    for e in decisions.evictions:
        w = snapshot.workloads.get(e.workload)
        PREEMPTIONS.labels(w.project if w else "").inc()


class SnapshotCollector:
    """Gauges computed from the watched adapter's snapshot at scrape time."""

    def __init__(self) -> None:
        self._source: Callable[[], tuple[Snapshot, Decisions | None]] | None = None

    def watch(self, source: Callable[[], tuple[Snapshot, Decisions | None]]) -> None:
        """The adapter whose state to export (the latest one to call this)."""
        self._source = source

    def describe(self):
        return []  # nothing to check at registration; collect() names every family

    def collect(self):
        if self._source is None:
            return
        snap, last = self._source()
        dept_of = {p.name: p.department for p in snap.projects.values()}
        queue = GaugeMetricFamily("gpupool_queue_length", "Pending workloads, by project", labels=["project"])
        pending = GaugeMetricFamily("gpupool_pending_workloads",
                                    "Pending workloads by project and why they wait "
                                    "(quota, limit, fair_share, capacity, other)",
                                    labels=["project", "reason"])
        running = GaugeMetricFamily("gpupool_running_workloads",
                                    "Workloads holding GPUs (running or releasing), by project",
                                    labels=["project"])
        alloc = GaugeMetricFamily("gpupool_allocated_gpus", "GPUs allocated, by project",
                                  labels=["project", "department"])
        quota = GaugeMetricFamily("gpupool_guaranteed_gpus", "GPU quota (guaranteed GPUs), by project",
                                  labels=["project", "department"])
        d_alloc = GaugeMetricFamily("gpupool_department_allocated_gpus", "GPUs allocated, by department",
                                    labels=["department"])
        d_quota = GaugeMetricFamily("gpupool_department_guaranteed_gpus",
                                    "GPU quota (guaranteed GPUs), by department", labels=["department"])
        capacity = GaugeMetricFamily("gpupool_capacity_gpus", "GPUs in the cluster, by node pool",
                                     labels=["pool"])

        n_queue: dict[str, int] = dict.fromkeys(snap.projects, 0)
        for w in snap.pending.values():
            n_queue[w.project] = n_queue.get(w.project, 0) + 1
        for project, n in sorted(n_queue.items()):
            queue.add_metric([project], n)
        reasons: dict[tuple[str, str], int] = defaultdict(int)
        for p in last.pending if last is not None else ():
            w = snap.pending.get(p.workload)
            if w is not None:  # still waiting (a quiet adapter may not have cycled since)
                reasons[(w.project, pending_reason(p.reason))] += 1
        for key, n in sorted(reasons.items()):
            pending.add_metric(list(key), n)
        for project in sorted(set(snap.projects) | set(snap.holding)):
            running.add_metric([project], len(snap.holding.get(project, ())))

        used: dict[str, int] = dict.fromkeys(snap.projects, 0)
        for (project, _pool), milli in snap.usage.items():
            used[project] = used.get(project, 0) + milli
        by_dept: dict[str, int] = dict.fromkeys(snap.departments, 0)
        for project, milli in sorted(used.items()):
            dept = dept_of.get(project, "")
            alloc.add_metric([project, dept], milli / MILLI)
            by_dept[dept] = by_dept.get(dept, 0) + milli
        for dept, milli in sorted(by_dept.items()):
            d_alloc.add_metric([dept], milli / MILLI)
        for p in sorted(snap.projects.values(), key=lambda p: p.name):
            quota.add_metric([p.name, p.department], sum(q.gpus for q in p.quotas.values()))
        for d in sorted(snap.departments.values(), key=lambda d: d.name):
            d_quota.add_metric([d.name], sum(q.gpus for q in d.quotas.values()))
        pools: dict[str, int] = defaultdict(int)
        for n in snap.nodes.values():
            pools[n.pool] += len(n.gpus)
        for pool, n in sorted(pools.items()):
            capacity.add_metric([pool], n)
        yield from (queue, pending, running, alloc, quota, d_alloc, d_quota, capacity)


SNAPSHOT = SnapshotCollector()
REGISTRY.register(SNAPSHOT)


async def serve(port: int, host: str = "0.0.0.0"):  # noqa: S104 (scraped from other pods)
    """Serve ``/metrics`` on the running event loop (gpupool-scheduler). Returns the server."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    class Metrics(RequestHandler):
        def get(self):
            self.set_header("Content-Type", CONTENT_TYPE_LATEST)
            self.finish(generate_latest(REGISTRY))

    server = HTTPServer(Application([(r"/metrics", Metrics)]))
    server.listen(port, host)
    return server
