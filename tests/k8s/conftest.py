"""Fixtures of the tests against the local Kubernetes cluster. ``k8s_cluster`` (the one
cluster of the test run) and ``ns`` (a fresh namespace) live in tests/conftest.py; they are not
imported here, so that ``from tests.k8s.conftest import ...`` never makes a second one."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.kubernetes.testcluster import ClusterInfo, apply_crds
from tests.conftest import GPUS_PER_NODE, NODES

__all__ = ["GPUS_PER_NODE", "NODES"]

# The real node's controllers: service accounts, their tokens and the CA ConfigMap that
# the kubelet mounts beside each token, claims bound to volumes (and let go of once no pod
# uses them: the protection finalizers' controllers), and the EndpointSlices of Services that
# kube-proxy and CoreDNS read.
REAL_NODE_CONTROLLERS = ("serviceaccount,serviceaccount-token,namespace,garbagecollector,"
                         "root-ca-certificate-publisher-controller,persistentvolume-binder,"
                         "pvc-protection,pv-protection,endpointslice")


@pytest.fixture
def sched(k8s_cluster: ClusterInfo, tmp_path):
    """A running ``gpupool-scheduler`` process; stopped (Lease released) afterwards."""
    from .helpers import SchedulerProcess

    s = SchedulerProcess(k8s_cluster, tmp_path)
    s.start()
    yield s
    rc = s.stop()
    print(f"--- gpupool-scheduler logs (shown when the test fails) ---\n{s.logs()}")
    if rc not in (0, -9, None):
        pytest.fail(f"gpupool-scheduler exited with {rc}:\n{s.logs()}")


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory) -> ClusterInfo:
    """A cluster of its own with one real node (containerd + kubelet; scripts/test-cluster
    up --real-node), its Services and cluster DNS (kube-proxy and CoreDNS, --cluster-dns),
    the busybox test image loaded, kube-controller-manager for service accounts, volume
    binding and EndpointSlices, and gpupool's CRDs; no kwok nodes."""
    from scheduler.kubernetes.testcluster import TestCluster
    from tests.conftest import _build_first

    from .realnode import build_test_image

    _build_first(cluster_dns=True)
    image = build_test_image(tmp_path_factory.mktemp("images") / "busybox.tar")
    with TestCluster(nodes=0, real_node=True, cluster_dns=True, controller_manager=True,
                     controllers=REAL_NODE_CONTROLLERS, image_archives=(image,)) as info:
        asyncio.run(apply_crds(info))
        yield info
