"""gpupool-node-agent: inventory -> Node labels/annotations (unit), and against the local
cluster: the agent publishes an injected inventory on a fresh kwok node of its own pool and
gpupool-scheduler places a pod there by those labels."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.node_agent import (
    ANN_GPUS,
    ANN_USAGE,
    REPO,
    GpuInfo,
    GpuUsage,
    Inventory,
    NodeAgent,
    copy_preload,
    file_inventory,
    node_patch,
    product_label,
)
from scheduler.kubernetes.objects import parse_node
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import bound, create_org, delete_org, kube, list_pods, make_pod, run, wait_until

INV = Inventory(
    gpus=[GpuInfo(0, "GPU-aaaa", "NVIDIA A100-SXM4-40GB", 40960, [1]),
          GpuInfo(1, "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40960, [0])],
    usage=[GpuUsage(0, 1024, 37), GpuUsage(1, 0, 0)],
)


def test_inventory_to_labels_and_annotations():
    patch = node_patch(INV)
    assert patch["metadata"]["labels"] == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.memory": "40960",
    }  # fmt: skip
    ann = patch["metadata"]["annotations"]
    assert ann["gpupool.io/gpu-uuids"] == "GPU-aaaa,GPU-bbbb"
    assert json.loads(ann[ANN_GPUS]) == [
        {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
         "nvlink_peers": [1]},
        {"index": 1, "uuid": "GPU-bbbb", "model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
         "nvlink_peers": [0]},
    ]
    assert json.loads(ann[ANN_USAGE]) == [
        {"index": 0, "memory_used_mib": 1024, "utilization": 37},
        {"index": 1, "memory_used_mib": 0, "utilization": 0},
    ]
    # What the scheduler reads back from a node carrying the patch (+ the GPU capacity).
    node = {"metadata": {"name": "n", **patch["metadata"]},
            "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}}}
    parsed = parse_node(node)
    assert [(g.index, g.model, g.memory_mib, g.uuid) for g in parsed.gpus] == [
        (0, "NVIDIA-A100-SXM4-40GB", 40960, "GPU-aaaa"), (1, "NVIDIA-A100-SXM4-40GB", 40960, "GPU-bbbb")]
    assert product_label("  Tesla T4 (PCIe) ") == "Tesla-T4-PCIe"
    assert node_patch(Inventory([]))["metadata"]["labels"]["nvidia.com/gpu.count"] == "0"


def test_copy_preload_atomic(tmp_path):
    src = tmp_path / "libgpupool-cuda.so"
    src.write_bytes(b"\x7fELF v1")
    host = tmp_path / "host" / "lib"
    assert copy_preload(src, host) is True
    assert (host / "libgpupool.so").read_bytes() == b"\x7fELF v1"
    assert copy_preload(src, host) is False  # unchanged: not rewritten
    src.write_bytes(b"\x7fELF v2")
    assert copy_preload(src, host) is True
    assert (host / "libgpupool.so").read_bytes() == b"\x7fELF v2"
    assert os.listdir(host) == ["libgpupool.so"]  # no temporary files left


def _node(name: str, pool: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake",
                                         "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"type": "kwok-agent", "kubernetes.io/hostname": name,
                                    "gpupool.io/node-pool": pool}},
            "spec": {},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


@pytest.mark.slow
def test_agent_publishes_and_scheduler_places(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    node, pool = f"agent-{ns[-8:]}", f"agent-{ns[-8:]}"
    inv_file = tmp_path / "inventory.yaml"
    doc = {"gpus": [{"index": i, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
                     "nvlink_peers": g.nvlink_peers} for i, g in enumerate(INV.gpus)],
           "usage": [{"index": 0, "memory_used_mib": 10, "utilization": 5}]}
    inv_file.write_text(yaml.safe_dump(doc))
    lib = tmp_path / "libgpupool-cuda.so"
    lib.write_bytes(b"\x7fELF test")

    async def go():
        async with kube(k8s_cluster) as kc:
            await kc.post("/api/v1/nodes", _node(node, pool))
            await create_org(kc, "d-agent", 2, {"p-agent": {"gpus": 2}}, pool=pool)
            try:
                agent = NodeAgent(kc, node, file_inventory(inv_file), advertise_capacity=True,
                                  preload_src=lib, host_lib_dir=tmp_path / "host")
                await agent.sync()
                n = await kc.get(f"/api/v1/nodes/{node}")
                # usage refresh: only the usage annotation changes
                doc["usage"] = [{"index": 0, "memory_used_mib": 2048, "utilization": 90}]
                inv_file.write_text(yaml.safe_dump(doc))
                await agent.sync()
                n2 = await kc.get(f"/api/v1/nodes/{node}")

                pod = (make_pod("ws").ns(ns).project("p-agent").fraction(0.5).kind("workspace")
                       .pool(pool).annotate("gpupool.io/gpu-model", "NVIDIA-A100-SXM4-40GB"))
                await kc.post(f"/api/v1/namespaces/{ns}/pods", pod.obj())

                async def placed():
                    return bound(await list_pods(kc, ns))

                (p,) = await wait_until(placed, "the pod bound on the agent's node")
                cm = await kc.get(f"/api/v1/namespaces/{ns}/configmaps/ws-gpupool")
                return n, n2, p, cm
            finally:
                await delete_org(kc, "d-agent", ["p-agent"])
                try:
                    await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                                     {"apiVersion": "v1", "kind": "DeleteOptions",
                                      "gracePeriodSeconds": 0})
                    await kc.delete(f"/api/v1/nodes/{node}")
                except ApiError:
                    pass

    n, n2, p, cm = run(go())
    labels, ann = n["metadata"]["labels"], n["metadata"]["annotations"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.memory"] == "40960"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert ann["gpupool.io/gpu-uuids"] == "GPU-aaaa,GPU-bbbb"
    assert [g["uuid"] for g in json.loads(ann[ANN_GPUS])] == ["GPU-aaaa", "GPU-bbbb"]
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert json.loads(ann[ANN_USAGE])[0]["utilization"] == 5
    assert json.loads(n2["metadata"]["annotations"][ANN_USAGE])[0] == {
        "index": 0, "memory_used_mib": 2048, "utilization": 90}
    assert (tmp_path / "host" / "libgpupool.so").read_bytes() == b"\x7fELF test"
    assert p["spec"]["nodeName"] == node
    idx = int(p["metadata"]["annotations"]["gpupool.io/gpu-indices"])
    assert cm["data"]["NVIDIA_VISIBLE_DEVICES"] == ["GPU-aaaa", "GPU-bbbb"][idx]


def test_nvml_inventory_with_fake_nvml(monkeypatch):
    """The NVML path without a GPU: a stand-in pynvml with two GPUs joined by NVLink."""
    import sys
    import types

    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    bus = ["00000000:18:00.0", "00000000:2A:00.0"]
    nv.NVMLError, nv.NVML_FEATURE_ENABLED, nv.NVML_NVLINK_MAX_LINKS = NVMLError, 1, 4
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=143771 * 2**20,
                                                                 used=(h + 1) * 512 * 2**20)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * (h + 1))

    def link_state(h, link):
        if link >= 2:
            raise NVMLError("not supported")
        return 1

    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=bus[1 - h].lower())
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    from scheduler.kubernetes.node_agent import inventory_from

    inv = inventory_from("nvml")()
    assert inv.gpus == [GpuInfo(0, "GPU-0", "NVIDIA H200", 143771, [1]),
                        GpuInfo(1, "GPU-1", "NVIDIA H200", 143771, [0])]
    assert inv.usage == [GpuUsage(0, 512, 10), GpuUsage(1, 1024, 20)]
    assert node_patch(inv)["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"


def callable_inventory() -> dict:
    return {"gpus": [{"index": 0, "uuid": "GPU-c", "model": "Tesla T4", "memory_mib": 15360}]}


def test_inventory_from_callable_and_file(tmp_path):
    from scheduler.kubernetes.node_agent import inventory_from

    inv = inventory_from("tests.k8s.test_node_agent:callable_inventory")()
    assert inv.gpus == [GpuInfo(0, "GPU-c", "Tesla T4", 15360, [])] and inv.usage == []
    f = tmp_path / "inv.json"
    f.write_text(json.dumps(callable_inventory()))
    assert inventory_from(str(f))().gpus == inv.gpus


def test_declared_gpus_where_nvml_finds_none():
    """As embedded mode's declared_gpus: NVML's GPUs win where it finds any."""
    from scheduler.kubernetes.node_agent import declared_gpus, declared_inventory

    decl = declared_gpus('{"count": 2, "model": "NVIDIA L4", "memory_mib": 23034}')

    def no_driver() -> Inventory:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    inv = declared_inventory("n1", decl, nvml=no_driver)()
    assert inv.gpus == [GpuInfo(0, "GPU-declared-n1-0", "NVIDIA L4", 23034),
                        GpuInfo(1, "GPU-declared-n1-1", "NVIDIA L4", 23034)]
    assert node_patch(inv)["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
    assert declared_inventory("n1", decl, nvml=lambda: Inventory([]))().gpus == inv.gpus
    assert declared_inventory("n1", decl, nvml=lambda: INV)() is INV
    # count alone: embedded mode's model and memory
    assert declared_gpus('{"count": 1}') == {"count": 1, "model": "NVIDIA H100 80GB HBM3",
                                             "memory_mib": 81559}


@pytest.mark.parametrize("text, message", [
    ("4", "a JSON object"),
    ("{count: 4}", "not JSON"),
    ('{"count": 0}', "count must be an integer from 1 to 1048576, not 0"),
    ('{"count": true}', "count must be an integer"),
    ('{"count": 1, "memory_mib": "80G"}', "memory_mib must be an integer"),
    ('{"count": 1, "model": ""}', "model must be a non-empty string"),
    ('{"count": 1, "gpus": 2}', "unknown fields ['gpus']"),
])
def test_declared_gpus_refuses_bad_input(text, message, capsys):
    from scheduler.kubernetes.node_agent import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--declared-gpus", text])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_agent_cli_publishes_declared_gpus(k8s_cluster: ClusterInfo, ns, tmp_path):
    """gpupool-node-agent on a node without NVML (this machine) publishes its declared GPUs."""
    import subprocess
    import sys

    node = f"declared-{ns[-8:]}"

    async def add_node():
        async with kube(k8s_cluster) as kc:
            await kc.post("/api/v1/nodes", _node(node, node))

    async def read_and_delete():
        async with kube(k8s_cluster) as kc:
            try:
                return await kc.get(f"/api/v1/nodes/{node}")
            finally:
                await kc.delete(f"/api/v1/nodes/{node}")

    run(add_node())
    try:
        p = subprocess.run(
            [sys.executable, "-m", "scheduler.kubernetes.node_agent", "--once",
             "--node-name", node, "--host-lib-dir", str(tmp_path),
             "--declared-gpus", '{"count": 3, "model": "NVIDIA L4"}'],
            env={**k8s_cluster.env(), "GPUPOOL_INVENTORY": "nvml"}, cwd=REPO,
            capture_output=True, text=True, timeout=60)
    finally:
        n = run(read_and_delete())
    assert p.returncode == 0, p.stderr
    labels, ann = n["metadata"]["labels"], n["metadata"]["annotations"]
    assert labels["nvidia.com/gpu.count"] == "3"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert ann["gpupool.io/gpu-uuids"] == ",".join(f"GPU-declared-{node}-{i}" for i in range(3))
