"""A local Kubernetes control plane for tests and benchmarks.

Thin wrapper over ``scripts/test-cluster up``: starts it in its own process group, waits
for its ``ready`` file, and stops it (SIGTERM; the script tears down every process it
started). Nothing here fakes the API server: the cluster is etcd + kube-apiserver (+ kwok
for nodes and, on request, kube-controller-manager and kube-scheduler) built from the
pinned upstream sources. With ``real_node=True`` it also runs one real node (containerd and
kubelet in a network namespace of the run's own; docs/decisions/0064); with
``fake_gpus=N`` N fake GPUs there through a device plugin of the kubelet's (scripts/fake-gpu),
with ``cluster_dns=True`` that node's Services and cluster DNS (kube-proxy and CoreDNS;
docs/decisions/0065), and with ``provisioner=True`` a host-path provisioner and its
``WaitForFirstConsumer`` StorageClass (scripts/hostpath-provisioner; docs/decisions/0066).

Errors: ``TestClusterError`` when the script fails or the cluster does not come up; its
message carries the tail of the script's output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.errors import GpupoolError

__all__ = [
    "ClusterInfo",
    "TestCluster",
    "TestClusterError",
    "apply_crds",
    "binaries_cached",
    "build_binaries",
    "client_for",
    "script_path",
]

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "chart" / "crds"


def script_path() -> Path:
    return REPO / "scripts" / "test-cluster"


class TestClusterError(GpupoolError, RuntimeError):
    """The test cluster could not be built or started."""

    __test__ = False  # not a pytest test class


def _flags(cluster_dns: bool, provisioner: bool) -> list[str]:
    return [*(["--cluster-dns"] if cluster_dns else []), *(["--provisioner"] if provisioner else [])]


def build_binaries(cluster_dns: bool = False, provisioner: bool = False) -> dict[str, Path]:
    """Build (or reuse from the cache) the pinned binaries; returns their directories.
    ``cluster_dns``: kube-proxy and CoreDNS too (``TestCluster(cluster_dns=True)``);
    ``provisioner``: the host-path provisioner (``TestCluster(provisioner=True)``)."""
    proc = subprocess.run(
        [str(script_path()), "build", *_flags(cluster_dns, provisioner)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise TestClusterError(f"scripts/test-cluster build failed:\n{proc.stderr[-4000:]}")
    k8s, etcd, kwok = proc.stdout.split()
    return {"k8s": Path(k8s), "etcd": Path(etcd), "kwok": Path(kwok)}


def binaries_cached(cluster_dns: bool = False, provisioner: bool = False) -> bool:
    """Whether ``scripts/test-cluster build`` has nothing left to build (checks quickly)."""
    proc = subprocess.run(
        [str(script_path()), "cached", *_flags(cluster_dns, provisioner)],
        capture_output=True,
    )
    return proc.returncode == 0


@dataclass(frozen=True)
class ClusterInfo:
    """How to reach a running test cluster (an admin bearer token, CA-verified TLS)."""

    kubeconfig: Path
    host: str
    token: str
    ca_file: Path
    state_dir: Path
    kubernetes_bin: Path
    real_node: str | None = None  # the real node's name (up --real-node), else None
    holder_pid: int | None = None  # the process that holds the real node's namespaces
    node_cgroup: str | None = None  # the real node's cgroupRoot, e.g. /gpupool-0123456789
    fake_gpus: int = 0  # nvidia.com/gpu of the real node's fake device plugin (up --fake-gpus)
    fake_gpu_uuid_prefix: str | None = None  # its devices' UUIDs: PREFIX0, PREFIX1, ...
    fake_gpu_image: str | None = None  # the image whose entrypoint is `fake-gpu report`
    cluster_dns: str | None = None  # the kube-dns Service's address (cluster_dns=True), else None
    storage_class: str | None = None  # the provisioner's StorageClass (provisioner=True), else None

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}


@dataclass
class TestCluster:
    """Start with ``start()`` (or as a context manager); ``info`` says how to reach it."""

    __test__ = False

    nodes: int = 4
    gpus_per_node: int = 8
    gpu_model: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    controller_manager: bool = False
    controllers: str | None = None  # kube-controller-manager's --controllers (KCM_CONTROLLERS)
    kube_scheduler: bool = False
    real_node: bool = False
    image_archives: tuple[Path, ...] = ()
    fake_gpus: int = 0
    cluster_dns: bool = False  # with real_node: kube-proxy and CoreDNS (up --cluster-dns)
    provisioner: bool = False  # with real_node: a host-path provisioner (up --provisioner)
    state_dir: Path | None = None
    start_timeout_s: float = 600.0
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    info: ClusterInfo | None = None

    def start(self) -> ClusterInfo:
        if self.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="gpupool-cluster-")
            self.state_dir = Path(self._tmp.name)
        d = self.state_dir
        cmd = [
            str(script_path()), "up", "--dir", str(d),
            "--nodes", str(self.nodes), "--gpus-per-node", str(self.gpus_per_node),
            "--gpu-model", self.gpu_model, "--gpu-memory-mib", str(self.gpu_memory_mib),
        ]  # fmt: skip
        if self.controller_manager:
            cmd.append("--controller-manager")
        if self.kube_scheduler:
            cmd.append("--kube-scheduler")
        if self.real_node:
            cmd.append("--real-node")
        if self.cluster_dns:
            cmd.append("--cluster-dns")
        if self.provisioner:
            cmd.append("--provisioner")
        for archive in self.image_archives:
            cmd += ["--image-archive", str(archive)]
        if self.fake_gpus:
            cmd += ["--fake-gpus", str(self.fake_gpus)]
        log = open(d / "test-cluster.out", "wb")  # noqa: SIM115 - lives as long as the cluster
        env = {**os.environ, "KCM_CONTROLLERS": self.controllers} if self.controllers else None
        self._proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        log.close()
        ready = d / "ready"
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.exists():
            if self._proc.poll() is not None:
                raise TestClusterError(f"test cluster exited early:\n{self._output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TestClusterError(f"test cluster not ready in {self.start_timeout_s}s")
            time.sleep(0.2)
        env = dict(
            line.split("=", 1) for line in (d / "env").read_text().splitlines() if "=" in line
        )
        self.info = ClusterInfo(
            kubeconfig=Path(env["KUBECONFIG"]),
            host=env["K8S_HOST"],
            token=env["K8S_TOKEN"],
            ca_file=Path(env["K8S_CA"]),
            state_dir=d,
            kubernetes_bin=Path(env["K8S_BIN"]),
            real_node=env.get("REAL_NODE"),
            holder_pid=int(env["REAL_NODE_HOLDER_PID"]) if "REAL_NODE_HOLDER_PID" in env else None,
            node_cgroup=env.get("REAL_NODE_CGROUP"),
            fake_gpus=int(env.get("FAKE_GPUS", 0)),
            fake_gpu_uuid_prefix=env.get("FAKE_GPU_UUID_PREFIX"),
            fake_gpu_image=env.get("FAKE_GPU_IMAGE"),
            cluster_dns=env.get("CLUSTER_DNS"),
            storage_class=env.get("STORAGE_CLASS"),
        )
        return self.info

    def _output(self) -> str:
        assert self.state_dir is not None
        try:
            return (self.state_dir / "test-cluster.out").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ClusterInfo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client_for(info: ClusterInfo, **kw: object):
    """A ``KubeClient`` for the cluster (admin token, CA-verified)."""
    from .client import KubeClient

    return KubeClient(info.host, info.token, str(info.ca_file), **kw)  # type: ignore[arg-type]


async def apply_crds(info: ClusterInfo, crd_dir: Path = CRD_DIR, timeout_s: float = 60) -> None:
    """Create (or replace) the CustomResourceDefinitions in ``chart/crds`` and wait until
    the API server serves them."""
    import asyncio

    import yaml

    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    async with client_for(info) as kc:
        names = []
        for f in sorted(crd_dir.glob("*.yaml")):
            crd = yaml.safe_load(f.read_text())
            name = crd["metadata"]["name"]
            names.append(name)
            await kc.apply(base, crd, versioned=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for name in names:
            while True:
                got = await kc.get(f"{base}/{name}")
                conds = (got.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    break
                if loop.time() > deadline:
                    raise TestClusterError(f"CRD {name} not established in {timeout_s}s")
                await asyncio.sleep(0.1)
