"""What the activator, the controller and the autoscaler read of an inference service's
description. The hub's request rules build one (``hub_ext.serving.spec.ServiceSpec``, from
a user's request or the chart's values); this package reads it through this protocol and
imports nothing of the hub. The replica backend they drive is ``controller.Backend``."""

from __future__ import annotations

from typing import Protocol


class ServiceSpec(Protocol):
    name: str
    command: tuple[str, ...]
    gpu: float  # < 1: a fraction of one GPU; >= 1: whole GPUs
    image: str
    env: dict
    min_replicas: int
    max_replicas: int
    metric: str  # concurrency: in-flight requests; throughput: requests/s
    target: float  # per replica
    scale_to_zero_after_s: float
    stable_window_s: float
    panic_window_pct: float
    panic_threshold_pct: float
    queue_limit: int  # requests held while no replica is ready
    request_timeout_s: float  # longest a request is held waiting for a replica
    max_body_bytes: int
    public: bool  # True: no JupyterHub token needed


__all__ = ["ServiceSpec"]
