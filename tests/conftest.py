"""Fixtures every test folder may use: the local Kubernetes cluster (scripts/test-cluster).

One cluster for the whole test run (a session-scoped fixture): etcd + kube-apiserver built from the pinned upstream
sources, kwok for fake GPU nodes; nothing is mocked. Tests anywhere under tests/ ask for
``k8s_cluster`` (and ``ns``, a fresh namespace) by name; no module imports them, since a
fixture imported into a module is a second fixture there (a second cluster). tests/chart
starts its own cluster with controllers (``chart_cluster``). The first run on a machine
builds the binaries (``make k8s`` does it ahead of pytest so that no test's timeout
includes the build); later runs reuse the cache under ``$GPUPOOL_CACHE`` (default
``~/.cache/gpupool``) and start in seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import signal
from pathlib import Path

import pytest

from scheduler.kubernetes.testcluster import (
    ClusterInfo,
    TestCluster,
    apply_crds,
    binaries_cached,
    build_binaries,
)

NODES = 4
GPUS_PER_NODE = 8

# The OS accounts this run's hubs make carry a prefix of the run's own (tests/hub/hubproc.py
# reads it), drawn once here so that every module and every child process of the run agrees.
PRODUCT_ACCOUNT_PREFIX = "gpupool-"  # hub_ext/config.py's default: a serving hub's accounts
os.environ.setdefault("GPUPOOL_TEST_ACCOUNT_PREFIX", f"gpt{secrets.token_hex(3)}-")
if os.environ["GPUPOOL_TEST_ACCOUNT_PREFIX"].startswith(PRODUCT_ACCOUNT_PREFIX):
    raise pytest.UsageError("GPUPOOL_TEST_ACCOUNT_PREFIX must not start with the product's own "
                            f"account prefix {PRODUCT_ACCOUNT_PREFIX!r}: a test run would take over "
                            "the accounts of a gpupool serving users on this machine")


def pytest_collection_modifyitems(config, items):
    # A cold build of the chart's images takes 25-40 minutes on 2 cores, more than the CI
    # budget leaves (record 0049): their tests run with `make test-images`.
    if os.environ.get("GPUPOOL_TEST_IMAGES") != "1":
        skip = pytest.mark.skip(reason="needs the chart's images: make test-images")
        for item in items:
            if item.get_closest_marker("images"):
                item.add_marker(skip)
    # Without Go nothing can be built: say so once instead of failing every test.
    if shutil.which("go") is None:
        skip = pytest.mark.skip(reason="Go is needed to build the local Kubernetes test cluster")
        for item in items:
            if "k8s_cluster" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


def _build_first(cluster_dns: bool = False, provisioner: bool = False) -> None:
    """``make k8s`` builds before pytest starts. When pytest runs alone on a machine that
    has not built yet, build here; the build outlasts a test's timeout on a cold machine, so
    the per-test alarm of pytest-timeout is switched off for this (first) test only.
    ``cluster_dns``: kube-proxy and CoreDNS too (the real node's Services and DNS);
    ``provisioner``: the real node's host-path provisioner."""
    if binaries_cached(cluster_dns, provisioner):
        return
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
    build_binaries(cluster_dns, provisioner)


@pytest.fixture(scope="session")
def k8s_cluster() -> ClusterInfo:
    _build_first()
    cluster = TestCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE)
    info = cluster.start()
    try:
        asyncio.run(apply_crds(info))
        yield info
    finally:
        cluster.stop()


@pytest.fixture
def ns(k8s_cluster: ClusterInfo, request) -> str:
    """A fresh namespace for one test; its pods are deleted afterwards."""
    from tests.k8s.helpers import create_namespace, delete_pods, kube

    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    name = request.node.originalname.lower().replace("_", "-")[:40].strip("-")
    name = f"{name}-{digest}"

    async def setup():
        async with kube(k8s_cluster) as kc:
            await create_namespace(kc, name)
            await delete_pods(kc, name)

    async def teardown():
        async with kube(k8s_cluster) as kc:
            await delete_pods(kc, name)

    asyncio.run(setup())
    yield name
    asyncio.run(teardown())


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium (tests/chromium.py), one per test module."""
    from playwright.sync_api import sync_playwright

    from tests import chromium

    with sync_playwright() as p:
        b = chromium.launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Folder for screenshots: $GPUPOOL_SCREENSHOTS, or a temporary one."""
    d = Path(os.environ.get("GPUPOOL_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session", autouse=True)
def _remove_workload_accounts():
    """OS accounts that this run's hubs made (the run's own prefix, made during the run) go
    at the end: those a hub's own stop could not remove (a hub that never stopped)."""
    def accounts() -> set[str]:
        return {line.split(":", 1)[0] for line in Path("/etc/passwd").read_text().splitlines() if line}

    before = accounts()
    yield
    from tests.hub.hubproc import remove_account

    prefix = os.environ["GPUPOOL_TEST_ACCOUNT_PREFIX"]
    for name in sorted(accounts() - before):
        if name.startswith(prefix):
            remove_account(name)
