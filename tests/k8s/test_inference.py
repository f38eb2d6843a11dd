"""Inference replicas on the local cluster: the controller's K8sBackend creates replica
pods that gpupool-scheduler places (kind inference, in quota), scales them up and down,
and shows the core's reason for a replica that cannot be placed. Kept small."""

from __future__ import annotations

import sys

import pytest

from hub_ext.inference.backends.k8s import LABEL, K8sBackend, replica_pod
from hub_ext.inference.controller import Controller
from hub_ext.inference.spec import parse_spec
from scheduler.k8s.testcluster import ClusterInfo

from .helpers import (
    SchedulerProcess,
    create_namespace,
    create_org,
    delete_org,
    delete_pods,
    kube,
    list_pods,
    run,
    wait_until,
)

NS = "inference"


def test_replica_pod_manifest():
    spec = parse_spec({"name": "llm", "project": "p", "command": ["serve"], "gpu": 0.25,
                       "port": 9000, "ready_path": "/health"})
    pod = replica_pod(spec, "llm-abc", "ns")
    assert pod["spec"]["schedulerName"] == "gpupool"
    assert pod["metadata"]["annotations"] == {"gpupool.io/project": "p", "gpupool.io/kind": "inference",
                                              "gpupool.io/gpu-fraction": "0.25",
                                              "gpupool.io/config-map": "llm-abc-gpupool",
                                              "gpupool.io/workload": "llm-abc"}
    c = pod["spec"]["containers"][0]
    assert c["envFrom"] == [{"configMapRef": {"name": "llm-abc-gpupool", "optional": False}}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9000}
    whole = replica_pod(parse_spec({"name": "w", "project": "p", "command": ["s"], "gpu": 2}), "w-1", "ns")
    assert whole["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


@pytest.fixture
def sched(k8s_cluster: ClusterInfo, tmp_path):
    s = SchedulerProcess(k8s_cluster, tmp_path)
    s.start()
    yield s
    s.stop()


def test_replicas_are_placed_scaled_and_explained(k8s_cluster: ClusterInfo, sched):
    async def go():
        async with kube(k8s_cluster) as kc:
            await create_namespace(kc, NS)
            await create_org(kc, "inf-dept", 1.0, {"inf-proj": {"gpus": 1.0}})
            controller = Controller(K8sBackend(kc, NS, poll_s=0.3), tick_s=0.3)
            controller.start()
            try:
                base = {"name": "llm", "project": "inf-proj", "command": [sys.executable],
                        "gpu": 0.25, "max_replicas": 8, "stable_window_s": 1,
                        "scale_to_zero_after_s": 0}
                svc = controller.put(parse_spec({**base, "min_replicas": 2}))

                async def placed(n):
                    pods = [p for p in await list_pods(kc, NS)
                            if p["metadata"].get("labels", {}).get(LABEL) == "llm"]
                    return len(pods) == n and all(p["spec"].get("nodeName") for p in pods)

                await wait_until(lambda: placed(2), "2 replica pods bound by gpupool-scheduler")
                # 5 x 0.25 > the project's 1 GPU: inference is in quota only, one waits
                controller.put(parse_spec({**base, "min_replicas": 5}))

                async def explained():
                    return any(r.state.value == "pending" and r.reason for r in svc.replicas)

                await wait_until(explained, "a pending replica with the scheduler's reason")
                controller.put(parse_spec({**base, "min_replicas": 0}))
                await wait_until(lambda: placed(0), "scaled to zero: replica pods deleted")
            finally:
                await controller.stop()
                await delete_pods(kc, NS)
                await delete_org(kc, "inf-dept", ["inf-proj"])

    run(go())
