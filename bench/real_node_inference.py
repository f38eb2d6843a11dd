"""Inference cold start from zero on the test cluster's real node, through the chart.

    python bench/real_node_inference.py [--runs 5] [--warm 50] [--json]   (root)

The chart is installed with its own images (scripts/build-images, cached) on a real node
with cluster DNS, as tests/k8s/test_chart_on_real_node.py does. alice submits a service
through the hub (the workspace image's python serving one file, 0.25 GPU,
``scale_to_zero_after_s`` 2). Each run waits until the service is at zero replicas with
no replica pod left, then times one request with alice's token through the activator's
Service: the activator holds it while it creates the replica pod, gpupool-scheduler binds
it, the kubelet starts the container and its readiness probe passes, and the answer comes
back (``cold_start_s``). Then ``--warm`` requests one after another to the ready replica
(``warm_request_ms``), and, with a new token each, the first request of a token the
activator has not seen (``first_token_ms``: one round trip to the hub's REST API, record
0076) against the same token again (cached). Every request goes through ``kubectl
port-forward`` (the API server and the kubelet), which the three figures include.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from scheduler.contract import L  # noqa: E402
from scheduler.kubernetes.testcluster import REPO, TestCluster, client_for, script_path  # noqa: E402
from tests.chart.imagelib import build_images  # noqa: E402
from tests.hub.hubclient import HubClient, call  # noqa: E402
from tests.k8s.realnode import port_forward  # noqa: E402
from tests.k8s.test_chart_on_real_node import (  # noqa: E402
    CONTROLLERS,
    NS,
    RELEASE,
    USER_PASSWORD,
    _values,
)

SERVICE = {"name": "cold", "project": "nlp", "gpu": 0.25, "port": 8000, "ready_path": "/",
           "command": ["python3", "-m", "http.server", "8000"], "min_replicas": 0,
           "max_replicas": 1, "scale_to_zero_after_s": 2, "stable_window_s": 1}


def get(url: str, token: str, timeout: float = 300) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def status(act: str) -> dict:
    try:
        with urllib.request.urlopen(f"{act}/_status", timeout=10) as r:
            return json.loads(r.read()).get(SERVICE["name"]) or {}
    except OSError:
        return {}


async def replica_pods(info) -> int:
    async with client_for(info) as kc:
        pods = (await kc.get(f"/api/v1/namespaces/{NS}/pods",
                             labelSelector=f"{L.INFERENCE}={SERVICE['name']}"))["items"]
    return len(pods)


def wait(pred, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.2)


def bench(info, runs: int, warm: int) -> dict:
    with port_forward(info, NS, f"svc/{RELEASE}-hub", 80) as hub:
        wait(lambda: _answers(f"{hub}/hub/login"), "the hub's login page")
        alice = HubClient(hub).login("alice", USER_PASSWORD)
        token = alice.token("alice")
        code, body = call(hub, token, "POST", "/inferences", SERVICE)
        assert code in (200, 201), body
        with port_forward(info, NS, f"svc/{RELEASE}-activator", 80) as act:
            url = f"{act}/{SERVICE['name']}/"
            wait(lambda: bool(status(act)), "the activator serves the service")
            assert get(url, "") == 401
            cold = []
            for _ in range(runs):
                wait(lambda: status(act).get("replicas") == 0
                     and asyncio.run(replica_pods(info)) == 0, "back at zero replicas")
                t0 = time.monotonic()
                assert get(url, token) == 200
                cold.append(time.monotonic() - t0)
            warm_ms = []
            for _ in range(warm):
                t0 = time.monotonic()
                assert get(url, token) == 200
                warm_ms.append((time.monotonic() - t0) * 1000)
            first, again = [], []
            for _ in range(5):
                fresh = alice.token("alice")
                t0 = time.monotonic()
                assert get(url, fresh) == 200
                first.append((time.monotonic() - t0) * 1000)
                t0 = time.monotonic()
                assert get(url, fresh) == 200
                again.append((time.monotonic() - t0) * 1000)
        call(hub, token, "DELETE", f"/inferences/{SERVICE['name']}")
    return {"cold_start_s": round(statistics.median(cold), 2),
            "cold_start_min_s": round(min(cold), 2), "cold_start_max_s": round(max(cold), 2),
            "warm_request_ms": round(statistics.median(warm_ms), 1),
            "first_token_ms": round(statistics.median(first), 1),
            "same_token_again_ms": round(statistics.median(again), 1),
            "runs": runs, "warm_requests": warm}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warm", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    subprocess.run([str(REPO / "scripts" / "test-cluster"), "build", "--cluster-dns"], check=True,
                   stdout=subprocess.DEVNULL)
    images = build_images("hub", "scheduler", "node-agent", "workspace")
    cluster = TestCluster(nodes=0, real_node=True, cluster_dns=True, controller_manager=True,
                          kube_scheduler=True, controllers=CONTROLLERS,
                          image_archives=tuple(b.archive for b in images.values()))
    info = cluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-real-inference-") as d:
            values = Path(d) / "values.yaml"
            values.write_text(yaml.safe_dump(_values(images)))
            helm = subprocess.run([str(script_path()), "helm-path"], capture_output=True,
                                  text=True, check=True).stdout.strip()
            t0 = time.monotonic()
            subprocess.run([helm, "install", RELEASE, str(REPO / "chart"), "-n", NS,
                            "--create-namespace", "-f", str(values), "--wait", "--timeout", "10m",
                            "--kubeconfig", str(info.kubeconfig)], check=True, capture_output=True)
            install_s = time.monotonic() - t0
        out = {"chart_ready_s": round(install_s, 1), **bench(info, a.runs, a.warm)}
    finally:
        cluster.stop()
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if not a.json:
        for k, v in out.items():
            print(f"{k:>22}: {v}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
