"""The chart's images, built from the project's own docker/*/Dockerfile without a Docker
engine or a registry (scripts/build-images: buildah on a local Debian base made with
mmdebstrap), cached by their inputs; each image's programs start in its own root filesystem
(chroot), and the node agent's image publishes a declared inventory on the chart tests'
cluster."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.kubernetes.testcluster import ClusterInfo

from .chartlib import REPO
from .imagelib import NAMES, Built, archive_config, build_images, run_in, unpack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.images,
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah's chroot builds and chroot need root"),
]


@pytest.fixture(scope="session")
def images() -> dict[str, Built]:
    """`make images` builds before pytest; alone on a fresh machine, build here (longer than a
    test's timeout: the alarm is off for this first test only)."""
    if any(b.state == "build" for b in build_images(plan=True).values()):
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)
    return build_images()


@pytest.fixture(scope="module")
def rootfs(images, tmp_path_factory):
    """name -> (root filesystem, image config), unpacked once per module."""
    done: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in done:
            root = tmp_path_factory.mktemp(f"rootfs-{name}") / "root"
            done[name] = root, unpack(images[name].archive, root)
        return done[name]

    yield get
    for root, _ in done.values():
        shutil.rmtree(root, ignore_errors=True)


# what each Dockerfile says the image runs, as its config must carry it
PROGRAMS = {
    "hub": {"Entrypoint": ["tini", "--"],
            "Cmd": ["jupyterhub", "-f", "/etc/gpupool/jupyterhub_config.py"], "User": "1000"},
    "scheduler": {"Entrypoint": ["gpupool-scheduler"], "User": "1000"},
    "node-agent": {"Entrypoint": ["gpupool-node-agent"]},
    "workspace": {"Cmd": ["jupyterhub-singleuser"], "User": "1000"},
}


def test_each_image_is_a_docker_archive_of_its_dockerfile(images):
    assert set(images) == set(NAMES)
    for name, built in images.items():
        entry, config = archive_config(built.archive)
        assert entry["RepoTags"] == [built.image]
        assert built.image.startswith(f"localhost/gpupool-{name}:")
        cfg = config["config"]
        for field, want in PROGRAMS[name].items():
            assert cfg.get(field) == want, (name, field, cfg.get(field))
        assert any(e.startswith("PATH=/opt/gpupool/venv/bin:") for e in cfg["Env"]), cfg["Env"]


def test_a_warm_run_builds_nothing(images):
    plan = build_images(plan=True)
    assert {n: (b.image, b.archive, b.state) for n, b in plan.items()} == {
        n: (b.image, b.archive, "cached") for n, b in images.items()}
    assert build_images() == images


def _copy_inputs(dest: Path) -> Path:
    """The files scripts/build-images reads, copied: their keys are then the repository's."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for d in ("docker", "hub_ext", "inference", "scheduler", "gpupool", "native"):
        shutil.copytree(REPO / d, dest / d, ignore=skip, symlinks=True)
    for f in ("pyproject.toml", "README.md", ".dockerignore", "scripts/build-images"):
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    return dest


def test_an_image_is_rebuilt_when_a_file_it_copies_changes(images, tmp_path):
    copy = _copy_inputs(tmp_path / "repo")

    def states() -> dict[str, str]:
        plan = build_images(plan=True, root=copy)
        return {n: b.state for n, b in plan.items()}

    assert states() == dict.fromkeys(NAMES, "cached")
    with (copy / "inference" / "__init__.py").open("a") as f:
        f.write("# changed\n")
    assert states() == {"hub": "build", "scheduler": "cached", "node-agent": "cached",
                        "workspace": "build"}
    (copy / "inference" / "__init__.py").write_bytes((REPO / "inference" / "__init__.py").read_bytes())
    src = next((copy / "native" / "src").glob("*.c"))
    src.write_text(src.read_text() + "\n")
    assert states() == {"hub": "cached", "scheduler": "cached", "node-agent": "build",
                        "workspace": "build"}


# each image's programs, run in its root filesystem as the image's user
CHECKS = {
    "hub": [["python", "-c", ("import hub_ext.hubconfig, kubespawner, oauthenticator, "
             "inference.activator, hub_ext.serving.kubernetes")],
            ["jupyterhub", "--version"], ["configurable-http-proxy", "--version"],
            ["tini", "--version"]],
    "scheduler": [["gpupool-scheduler", "--help"]],
    "node-agent": [["gpupool-node-agent", "--help"]],
    "workspace": [["python", "-c", ("import gpupool.checkpoint, gpupool.widgets, numpy, "
                   "jupyterlab, jupyter_vscode_proxy, jupyter_server_proxy")],
                  ["jupyterhub-singleuser", "--version"], ["code-server", "--version"]],
}


@pytest.mark.parametrize("name", NAMES)
def test_the_image_programs_start(rootfs, name):
    root, config = rootfs(name)
    for argv in CHECKS[name]:
        p = run_in(root, config, argv)
        assert p.returncode == 0, f"{name}: {argv}: {p.stdout[-2000:]}{p.stderr[-2000:]}"
    if name in ("node-agent", "workspace"):  # the interception library, built in the image
        lib = root / "opt/gpupool/lib/libgpupool-cuda.so"
        assert lib.read_bytes()[:4] == b"\x7fELF"


def _kubeconfig_inside(root: Path, info: ClusterInfo) -> str:
    """A kubeconfig in the root filesystem, CA and token inline (the host's paths are not
    there); the API server is on the host's loopback, which chroot shares."""
    ca = base64.b64encode(Path(info.ca_file).read_bytes()).decode()
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": {"server": info.host,
                                                  "certificate-authority-data": ca}}],
           "users": [{"name": "u", "user": {"token": info.token}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp" / "kubeconfig").write_text(yaml.safe_dump(doc))
    return "/tmp/kubeconfig"


def test_node_agent_image_publishes_declared_gpus(rootfs, chart_cluster: ClusterInfo):
    """The image's own entrypoint, without NVML (no GPU here): the declared GPUs go on its
    Node, and the library it carries is copied to the host directory."""
    root, config = rootfs("node-agent")
    node = "image-declared-gpus"
    kubeconfig = _kubeconfig_inside(root, chart_cluster)

    async def api(method: str, path: str, body: dict | None = None):
        kc = await KubeClient.from_kubeconfig(str(chart_cluster.kubeconfig))
        async with kc:
            return await kc.request(method, path, body)

    asyncio.run(api("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"type": "kwok", "gpupool.io/node-pool": node}},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "10"}}}))
    try:
        p = run_in(root, config, [*config["config"]["Entrypoint"], "--once", "--kubeconfig",
                                  kubeconfig, "--node-name", node, "--host-lib-dir", "/tmp/host-lib",
                                  "--preload-src", "/opt/gpupool/lib/libgpupool-cuda.so",
                                  "--declared-gpus", '{"count": 2, "model": "NVIDIA L4"}'])
        n = asyncio.run(api("GET", f"/api/v1/nodes/{node}"))
    finally:
        try:
            asyncio.run(api("DELETE", f"/api/v1/nodes/{node}"))
        except ApiError:
            pass
    assert p.returncode == 0, p.stderr[-3000:]
    assert n["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
    assert n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert n["metadata"]["annotations"]["gpupool.io/gpu-uuids"] == (
        f"GPU-declared-{node}-0,GPU-declared-{node}-1")
    assert (root / "tmp/host-lib/libgpupool.so").read_bytes() == (
        root / "opt/gpupool/lib/libgpupool-cuda.so").read_bytes()
