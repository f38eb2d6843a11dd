"""Fixtures of the tests against the local Kubernetes cluster. ``k8s_cluster`` (the one
cluster of the test run) and ``ns`` (a fresh namespace) live in tests/conftest.py; they are not
imported here, so that ``from tests.k8s.conftest import ...`` never makes a second one."""

from __future__ import annotations

import pytest

from scheduler.kubernetes.testcluster import ClusterInfo
from tests.conftest import GPUS_PER_NODE, NODES

__all__ = ["GPUS_PER_NODE", "NODES"]


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
