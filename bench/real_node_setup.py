"""Set-up time of the test cluster's real node (``scripts/test-cluster up --real-node``),
against a kwok-only cluster started in the same run.

    python bench/real_node_setup.py [--runs 3] [--cold] [--cluster-dns] [--json]

Warm (binaries cached): for each run, a kwok-only ``up`` (1 node) to ready, then a
real-node ``up`` (containerd, kubelet, the pause and busybox images imported) to node
Ready, a busybox pod created to Running, and the teardown. Medians are reported, with
``real_node_vs_kwok``, the ratio of the two start times.

``--cold`` first times what a machine with a warm Go build cache but no real-node binaries
builds: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl (one
``go build``) and the sandbox image, into a scratch ``GPUPOOL_CACHE`` that shares the other
binaries. Debian packages (scripts/setup-system) are not counted.

``--cluster-dns``: the real node also runs kube-proxy and CoreDNS (``up --cluster-dns``), and
``--cold`` builds those too.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.kubernetes.testcluster import REPO, TestCluster, client_for  # noqa: E402
from tests.k8s.realnode import build_test_image, pinned_pod  # noqa: E402

CACHE = Path(os.environ.get("GPUPOOL_CACHE", Path.home() / ".cache" / "gpupool"))


async def pod_running(info) -> float:
    t0 = time.monotonic()
    async with client_for(info) as kc:
        await kc.post("/api/v1/namespaces/default/pods",
                      pinned_pod("bench", info.real_node, "exec /bin/busybox sleep 3600"))
        while True:
            p = await kc.get("/api/v1/namespaces/default/pods/bench")
            if (p.get("status") or {}).get("phase") == "Running":
                return time.monotonic() - t0
            await asyncio.sleep(0.05)


def one_run(image: Path, tmp: Path, i: int, cluster_dns: bool = False) -> dict:
    for d in (f"kwok-{i}", f"real-{i}"):
        (tmp / d).mkdir()
    t0 = time.monotonic()
    with TestCluster(nodes=1, state_dir=tmp / f"kwok-{i}"):
        kwok_up = time.monotonic() - t0
    cluster = TestCluster(nodes=0, real_node=True, cluster_dns=cluster_dns,
                          image_archives=(image,), state_dir=tmp / f"real-{i}")
    t0 = time.monotonic()
    info = cluster.start()
    real_up = time.monotonic() - t0
    try:
        pod = asyncio.run(pod_running(info))
    finally:
        t0 = time.monotonic()
        cluster.stop()
        down = time.monotonic() - t0
    return {"kwok_up_s": kwok_up, "real_node_up_s": real_up, "pod_running_s": pod,
            "teardown_s": down}


def cold_build(tmp: Path, cluster_dns: bool = False) -> float:
    """The real node's binaries built anew; the other cached binaries are linked in."""
    scratch = tmp / "cache"
    scratch.mkdir()
    for d in CACHE.iterdir():
        if not d.name.startswith(("k8s-", "pause-", "src", "kube-proxy-", "coredns-")):
            (scratch / d.name).symlink_to(d)
    t0 = time.monotonic()
    subprocess.run([str(REPO / "scripts" / "test-cluster"), "build",
                    *(["--cluster-dns"] if cluster_dns else [])], check=True,
                   env={**os.environ, "GPUPOOL_CACHE": str(scratch)}, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--cluster-dns", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    subprocess.run([str(REPO / "scripts" / "test-cluster"), "build",
                    *(["--cluster-dns"] if a.cluster_dns else [])], check=True,
                   stdout=subprocess.DEVNULL)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-real-node-") as d:
        tmp = Path(d)
        if a.cold:
            out["cold_build_s"] = round(cold_build(tmp, a.cluster_dns), 1)
            print(f"cold build: {out['cold_build_s']} s", file=sys.stderr)
        image = build_test_image(tmp / "busybox.tar")
        runs = [one_run(image, tmp, i, a.cluster_dns) for i in range(a.runs)]
    for key in runs[0]:
        out[key] = round(statistics.median(r[key] for r in runs), 2)
    out["real_node_vs_kwok"] = round(out["real_node_up_s"] / out["kwok_up_s"], 2)
    out["runs"] = a.runs
    out["cluster_dns"] = a.cluster_dns
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if not a.json:
        for k, v in out.items():
            print(f"{k:>20}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
