"""Fixtures for the chart's tests: helm (built from its Go module by scripts/test-cluster),
and a local cluster of their own that can run Deployments and DaemonSets.

The cluster is the same etcd + kube-apiserver + kwok as tests/k8s's ``k8s_cluster``, plus
kube-controller-manager (with the deployment, replicaset, daemonset and
persistent volume controllers) and kube-scheduler, all built from the pinned
upstream sources. It lives for this package only (the chart installs cluster-wide objects:
CRDs, ClusterRoles, the organisation), so tests/k8s keeps its own cluster.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from scheduler.kubernetes.testcluster import (
    ClusterInfo,
    TestCluster,
    apply_crds,
    binaries_cached,
    build_binaries,
    script_path,
)

NODES = 4
GPUS_PER_NODE = 8
CONTROLLERS = ("serviceaccount,serviceaccount-token,namespace,garbagecollector,"
               "deployment,replicaset,daemonset,persistentvolume-binder,pvc-protection,"
               "pv-protection")


def pytest_collection_modifyitems(config, items):
    if shutil.which("go") is None:
        skip = pytest.mark.skip(reason="Go is needed to build helm and the local test cluster")
        for item in items:
            if "tests/chart" in str(item.fspath):
                item.add_marker(skip)


def _build_first() -> None:
    """``make k8s`` builds before pytest; alone on a fresh machine, build here (longer than
    a test's timeout: the alarm is off for this first test only)."""
    if binaries_cached():
        return
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
    build_binaries()


def _tool(which: str) -> Path:
    out = subprocess.run([str(script_path()), which], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def helm() -> Path:
    _build_first()
    return _tool("helm-path")


@pytest.fixture(scope="session")
def dockerfile_lint() -> Path:
    _build_first()
    return _tool("dockerfile-lint-path")


@pytest.fixture(scope="package")
def chart_cluster(helm) -> ClusterInfo:
    cluster = TestCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE, controller_manager=True,
                          controllers=CONTROLLERS, kube_scheduler=True)
    info = cluster.start()
    try:
        asyncio.run(apply_crds(info))
        yield info
    finally:
        cluster.stop()
