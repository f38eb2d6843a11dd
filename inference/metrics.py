"""Prometheus metrics of the activator, served at its ``/metrics``.

The names are a contract (a dashboard reads them):
``gpupool_activator_requests_total{service,code}`` (counter),
``gpupool_activator_held_requests{service}`` (gauge),
``gpupool_activator_cold_start_seconds{service}`` (histogram: the first held request's
arrival to the first ready replica of a service at zero) and
``gpupool_activator_replicas{service}`` (gauge: live replicas, pending to ready).

The hot path pays one dict lookup and one ``inc`` per request (``count``); the gauges are
read from the controllers when scraped, so they cost nothing between scrapes.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter("gpupool_activator_requests", "Requests answered by the activator",
                   ["service", "code"], registry=REGISTRY)
COLD_START = Histogram("gpupool_activator_cold_start_seconds",
                       "From the first request held at zero replicas to the first ready replica",
                       ["service"], registry=REGISTRY,
                       buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
_children: dict[tuple[str, int], object] = {}
_controllers: weakref.WeakSet = weakref.WeakSet()


def count(service: str, code: int) -> None:
    c = _children.get((service, code))
    if c is None:
        c = _children[(service, code)] = REQUESTS.labels(service, str(code))
    c.inc()


def cold_start(service: str, seconds: float) -> None:
    COLD_START.labels(service).observe(seconds)


def follow(controller) -> None:
    """Report this controller's services in the gauges."""
    _controllers.add(controller)


class _Gauges:
    def collect(self):
        held = GaugeMetricFamily("gpupool_activator_held_requests",
                                 "Requests held while the service has no ready replica",
                                 labels=["service"])
        replicas = GaugeMetricFamily("gpupool_activator_replicas",
                                     "Live replicas of the service (pending, starting, ready)",
                                     labels=["service"])
        for ctl in list(_controllers):
            for name, svc in list(ctl.services.items()):
                held.add_metric([name], len(svc.held))
                replicas.add_metric([name], len(svc.live()))
        return [held, replicas]

    def describe(self):
        return []


REGISTRY.register(_Gauges())


def exposition() -> bytes:
    return generate_latest(REGISTRY)


__all__ = ["REGISTRY", "cold_start", "count", "exposition", "follow"]
