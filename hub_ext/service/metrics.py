"""Prometheus metrics of the gpupool service process, at ``/services/gpupool/metrics``
(no login, like JupyterHub's own with ``authenticate_prometheus`` off).

Read from the database when scraped: workloads by state and kind, and the latest NVML
utilization of each GPU (absent on a hub whose GPUs are declared). The scheduler's metrics
(queue, allocation, quota, preemptions, cycle time) and spawn durations are the hub
process's: JupyterHub serves them at ``/hub/metrics`` (scheduler/metrics/prometheus.py,
hub_ext/workspaces/metrics.py).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select
from tornado import web

from ..db.tables import GpuSampleRow, WorkloadRow

__all__ = ["DATABASE", "MetricsHandler"]


class DatabaseCollector:
    def __init__(self) -> None:
        self.Session = None

    def watch(self, session_factory) -> None:
        self.Session = session_factory

    def describe(self):
        return []

    def collect(self):
        if self.Session is None:
            return
        workloads = GaugeMetricFamily("gpupool_workloads", "Workloads by state and kind",
                                      labels=["state", "kind"])
        util = GaugeMetricFamily("gpupool_gpu_utilization_percent",
                                 "Latest NVML utilization of each GPU (absent without NVML)",
                                 labels=["node", "gpu"])
        with self.Session() as s:
            for state, kind, n in s.execute(select(WorkloadRow.state, WorkloadRow.kind, func.count())
                                            .group_by(WorkloadRow.state, WorkloadRow.kind)):
                workloads.add_metric([state, kind], n)
            last = s.scalar(select(func.max(GpuSampleRow.ts)))
            if last is not None:
                for r in s.scalars(select(GpuSampleRow).where(GpuSampleRow.ts == last)
                                   .order_by(GpuSampleRow.node, GpuSampleRow.gpu_index)):
                    util.add_metric([r.node, str(r.gpu_index)], r.utilization_pct)
        yield workloads
        yield util


DATABASE = DatabaseCollector()
REGISTRY.register(DATABASE)


class MetricsHandler(web.RequestHandler):
    def get(self):
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(REGISTRY))
