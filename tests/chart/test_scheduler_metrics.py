"""gpupool-scheduler's metrics in the chart: the Deployment starts it with --metrics-port,
names the port and carries Prometheus' scrape annotations; the NetworkPolicy lets scrapers
in on that port only; all of it follows scheduler.metrics (the API server validates the
default rendering in test_render.py)."""

from __future__ import annotations

import json

import pytest

from .chartlib import CHART, by_kind, helm_run, render

NAME = "gpupool-scheduler"


def _parts(objs):
    dep = by_kind(objs, "Deployment")[NAME]["spec"]["template"]
    return dep, dep["spec"]["containers"][0], by_kind(objs, "NetworkPolicy")[NAME]["spec"]


def test_default_serves_metrics(helm, tmp_path):
    pod, c, policy = _parts(render(helm, tmp_path, {}, "metrics"))
    assert "--metrics-port=9090" in c["args"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true",
                                              "prometheus.io/port": "9090",
                                              "prometheus.io/path": "/metrics"}
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_port_annotations_and_scrapers_are_configurable(helm, tmp_path):
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    pod, c, policy = _parts(render(helm, tmp_path, {"scheduler": {"metrics": {
        "port": 9400, "podAnnotations": False, "scrapeFrom": [peer]}}}, "metrics"))
    assert "--metrics-port=9400" in c["args"]
    assert c["ports"][0]["containerPort"] == 9400
    assert "annotations" not in pod["metadata"]
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}],
                                  "from": [peer]}]


def test_disabled_serves_nothing(helm, tmp_path):
    pod, c, policy = _parts(render(helm, tmp_path, {"scheduler": {"metrics": {"enabled": False}}},
                                   "metrics"))
    assert not [a for a in c["args"] if a.startswith("--metrics-port")]
    assert "ports" not in c and "annotations" not in pod["metadata"]
    assert policy["ingress"] == []


@pytest.mark.parametrize("metrics,message", [
    ({"port": 0}, "at '/scheduler/metrics/port': minimum"),
    ({"port": "http"}, "at '/scheduler/metrics/port'"),
    ({"prot": 9090}, "at '/scheduler/metrics': additional properties 'prot' not allowed"),
])
def test_bad_metrics_values_name_the_field(helm, metrics, message):
    p = helm_run(helm, "template", "gpupool", str(CHART), "--set-json",
                 f"scheduler.metrics={json.dumps(metrics)}", check=False)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr
