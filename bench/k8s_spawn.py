"""Spawn-to-JupyterLab on the test cluster's real node through the chart: gpupool's
GpupoolKubeSpawner against JupyterHub's stock KubeSpawner with the same workspace image, in
the same run.

    python bench/k8s_spawn.py [--runs 3] [--json]      (as root; the chart's images cached)

The cluster of tests/k8s/test_chart_on_real_node.py (one real node, cluster DNS,
kube-controller-manager and kube-scheduler), the chart installed with its own images. For
each spawner: one warm-up spawn, then ``--runs`` spawns of alice's server through the hub's
REST API and the chart's proxy, each timed until ``/user/alice/lab`` answers 200, then
stopped until its pod is gone.

- gpupool: the chart as installed; the request's rules, gpupool-scheduler's placement of
  0.25 GPU (its ConfigMap, the interception library's mount), VS Code's postStart hook.
- stock: the same release upgraded with ``hub.extraConfig`` that makes the hub's spawner
  ``kubespawner.KubeSpawner`` after the chart's configuration: the workspace image, 0.5 CPU
  and 2 GiB as guarantee and limit, the same home claim; bound by kube-scheduler.

The two blocks run one after the other (gpupool first) on the same node. Prints one JSON
object as its last line: gpupool_p50_s, stock_p50_s, ratio (gpupool / stock), the p95s,
runs and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.kubernetes.testcluster import TestCluster, script_path  # noqa: E402
from tests.chart.imagelib import build_images  # noqa: E402
from tests.hub.hubclient import HubClient, call  # noqa: E402
from tests.k8s import test_chart_on_real_node as chart  # noqa: E402
from tests.k8s.realnode import port_forward  # noqa: E402

OPTIONS = {"project": "nlp", "workspace_kind": "jupyterlab", "gpu_mode": "fraction",
           "gpu_fraction": 0.25, "cpu": 0.5, "memory_gib": 2}
# After the chart's configuration: configure(c) sets the mode's spawner, so the stock one
# replaces it there.
STOCK = """
import hub_ext.hubconfig as _hubconfig
_configure = _hubconfig.configure
def _stock(c):
    _configure(c)
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
_hubconfig.configure = _stock
c.KubeSpawner.cpu_guarantee = c.KubeSpawner.cpu_limit = 0.5
c.KubeSpawner.mem_guarantee = c.KubeSpawner.mem_limit = "2G"
c.KubeSpawner.storage_pvc_ensure = True
c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
"""


def helm(info, action: str, values: dict, tmp: Path) -> None:
    path = tmp / f"values-{action}.json"
    path.write_text(json.dumps(values))
    binary = subprocess.run([str(script_path()), "helm-path"], capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run([binary, action, chart.RELEASE, str(ROOT / "chart"), "-n", chart.NS,
                    "--create-namespace", "-f", str(path), "--kubeconfig", str(info.kubeconfig)],
                   check=True, capture_output=True, timeout=300)


def hub_pod_ready(info, not_uid: str = "") -> str:
    p = chart.run(chart.wait_until(lambda: chart._hub_ready(info), "the hub pod Ready",
                                   timeout=300))
    while p["metadata"]["uid"] == not_uid:
        time.sleep(1)
        p = chart.run(chart._hub_ready(info)) or p
    return p["metadata"]["uid"]


def spawn_once(info, base: str, token: str, options: dict) -> float:
    t0 = time.perf_counter()
    status, body = call(base, token, "POST", "/hub/api/users/alice/server", options, api=False)
    assert status in (201, 202), (status, body)
    while True:
        s, _ = call(base, token, "GET", "/user/alice/lab", api=False)
        if s == 200:
            elapsed = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > 400:
            raise RuntimeError("spawn timed out")
        time.sleep(0.1)
    call(base, token, "DELETE", "/hub/api/users/alice/server", api=False)
    while True:  # stopped, and its pod gone (the next spawn starts from nothing)
        s, u = call(base, token, "GET", "/hub/api/users/alice", api=False)
        if not u.get("servers") and not [p for p in chart.run(chart._pods(info))
                                         if p["metadata"]["name"] == "jupyter-alice"]:
            break
        time.sleep(0.5)
    return elapsed


def block(info, runs: int) -> list[float]:
    with port_forward(info, chart.NS, f"svc/{chart.RELEASE}-hub", 80) as base:
        chart.run(chart.wait_until(chart._async(lambda: chart._answers(f"{base}/hub/login")),
                                   "the hub's login page", timeout=120, interval=1))
        token = HubClient(base).login("alice", chart.USER_PASSWORD).token("alice")
        spawn_once(info, base, token, OPTIONS)  # warm-up
        return [spawn_once(info, base, token, OPTIONS) for _ in range(runs)]


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from tests.conftest import _build_first

    _build_first(cluster_dns=True)
    images = build_images("hub", "scheduler", "node-agent", "workspace")
    cluster = TestCluster(nodes=0, real_node=True, cluster_dns=True, controller_manager=True,
                          kube_scheduler=True, controllers=chart.CONTROLLERS,
                          image_archives=tuple(b.archive for b in images.values()))
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-k8s-spawn-") as d:
        tmp = Path(d)
        info = cluster.start()
        try:
            for name in ("hub-state", "home"):
                (tmp / name).mkdir(mode=0o777)
                os.chmod(tmp / name, 0o777)  # the images' user (1000) writes there
            chart.run(chart._volume(info, chart.HUB_STATE, tmp / "hub-state"))
            values = chart._values(images)
            helm(info, "install", values, tmp)
            chart.run(chart._volume(info, "real-node-chart-home-0", tmp / "home"))
            uid = hub_pod_ready(info)
            times["gpupool"] = block(info, a.runs)
            values["hub"]["extraConfig"] += STOCK
            helm(info, "upgrade", values, tmp)
            hub_pod_ready(info, not_uid=uid)
            times["stock"] = block(info, a.runs)
        finally:
            cluster.stop()
    g, s = statistics.median(times["gpupool"]), statistics.median(times["stock"])
    out = {"gpupool_p50_s": round(g, 2), "gpupool_p95_s": round(p95(times["gpupool"]), 2),
           "stock_p50_s": round(s, 2), "stock_p95_s": round(p95(times["stock"]), 2),
           "ratio": round(g / s, 2), "runs": a.runs,
           "all_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    if not a.json:
        for k, v in out.items():
            print(f"{k:>14}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
