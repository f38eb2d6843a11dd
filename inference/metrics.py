"""Prometheus metrics of the activator, served at its ``/metrics``.

The names are a contract (a dashboard reads them):
``gpupool_activator_requests_total{service,code}`` (counter),
``gpupool_activator_held_requests{service}`` (gauge),
``gpupool_activator_cold_start_seconds{service}`` (histogram: the first held request's
arrival to the first ready replica of a service at zero) and
``gpupool_activator_replicas{service}`` (gauge: live replicas, pending to ready).

The hot path pays one dict increment per request (``count``: a plain count, turned into
the counter family when scraped); the gauges are read from the controllers when scraped,
so they cost nothing between scrapes.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

REGISTRY = CollectorRegistry(auto_describe=True)
COLD_START = Histogram("gpupool_activator_cold_start_seconds",
                       "From the first request held at zero replicas to the first ready replica",
                       ["service"], registry=REGISTRY,
                       buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
_requests: dict[tuple[str, int], int] = {}  # (service, code) -> requests answered
_controllers: weakref.WeakSet = weakref.WeakSet()


def count(service: str, code: int) -> None:
    key = (service, code)
    _requests[key] = _requests.get(key, 0) + 1


def cold_start(service: str, seconds: float) -> None:
    COLD_START.labels(service).observe(seconds)


def follow(controller) -> None:
    """Report this controller's services in the gauges."""
    _controllers.add(controller)


class _Scraped:
    """What is read when scraped: the request counts and the services' gauges."""

    def collect(self):
        requests = CounterMetricFamily("gpupool_activator_requests",
                                       "Requests answered by the activator",
                                       labels=["service", "code"])
        for (service, code), n in sorted(_requests.items()):
            requests.add_metric([service, str(code)], n)
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
        return [requests, held, replicas]

    def describe(self):
        return []


REGISTRY.register(_Scraped())


def exposition() -> bytes:
    return generate_latest(REGISTRY)


__all__ = ["REGISTRY", "cold_start", "count", "exposition", "follow"]
