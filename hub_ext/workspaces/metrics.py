"""Prometheus metrics of the hub process that are not the scheduler's (those are in
scheduler/metrics/prometheus.py): how long a workspace takes to start. JupyterHub serves the hub's
registry at ``/hub/metrics``."""

from __future__ import annotations

from prometheus_client import Histogram

__all__ = ["SPAWN_QUEUE_SECONDS", "SPAWN_SECONDS"]

_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
SPAWN_SECONDS = Histogram(
    "gpupool_spawn_duration_seconds",
    "From the gpupool spawner's start to the workspace process running (queue wait included), "
    "by project and outcome (started, failed, or cancelled while queued)",
    ["project", "outcome"], buckets=_BUCKETS,
)
SPAWN_QUEUE_SECONDS = Histogram(
    "gpupool_spawn_queue_seconds", "Time a workspace waited in the queue before it was placed, by project",
    ["project"], buckets=_BUCKETS,
)
