"""``KubeClient.apply`` (create, else replace) and ``KubeClient.ensure`` (create, else leave
as it is) against the local cluster's API server."""

from __future__ import annotations

import pytest

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import GROUP, kube, run


def _config_map(name: str, ns: str, value: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns}, "data": {"k": value}}


def test_apply_creates_then_replaces(k8s_cluster: ClusterInfo, ns):
    path = f"/api/v1/namespaces/{ns}/configmaps"

    async def go():
        async with kube(k8s_cluster) as kc:
            made = await kc.apply(path, _config_map("cm-apply", ns, "one"))
            assert made["data"] == {"k": "one"}
            again = await kc.apply(path, _config_map("cm-apply", ns, "two"))  # 409, then PUT
            assert again["metadata"]["uid"] == made["metadata"]["uid"]
            assert (await kc.get(f"{path}/cm-apply"))["data"] == {"k": "two"}

    run(go())


def test_apply_versioned_names_the_version_it_replaces(k8s_cluster: ClusterInfo):
    """A custom resource's update must carry its resourceVersion: read from the object there."""
    path = f"{GROUP}/departments"
    obj = {"apiVersion": "gpupool.io/v1alpha1", "kind": "Department",
           "metadata": {"name": "d-client-apply"}, "spec": {"quotas": {"default": {"gpus": 1}}}}

    def quota(gpus: int) -> dict:
        return {**obj, "spec": {"quotas": {"default": {"gpus": gpus}}}}

    async def go():
        async with kube(k8s_cluster) as kc:
            try:
                await kc.apply(path, obj, versioned=True)
                with pytest.raises(ApiError) as unversioned:
                    await kc.apply(path, quota(2))
                assert unversioned.value.status in (409, 422)
                await kc.apply(path, quota(3), versioned=True)
                assert (await kc.get(f"{path}/d-client-apply"))["spec"]["quotas"]["default"]["gpus"] == 3
                assert "resourceVersion" not in obj["metadata"]  # the caller's object is its own
            finally:
                await kc.delete(f"{path}/d-client-apply")

    run(go())


def test_ensure_leaves_an_existing_object_as_it_is(k8s_cluster: ClusterInfo, ns):
    path = f"/api/v1/namespaces/{ns}/configmaps"

    async def go():
        async with kube(k8s_cluster) as kc:
            made = await kc.ensure(path, _config_map("cm-ensure", ns, "first"))
            assert made is not None and made["data"] == {"k": "first"}
            assert await kc.ensure(path, _config_map("cm-ensure", ns, "second")) is None  # 409
            got = await kc.get(f"{path}/cm-ensure")
            assert got["data"] == {"k": "first"}
            assert got["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]

    run(go())


def test_errors_other_than_409_are_raised(k8s_cluster: ClusterInfo, ns):
    gone = "/api/v1/namespaces/no-such-namespace/configmaps"
    bad = _config_map("Not_A_Name", ns, "x")

    async def go():
        async with kube(k8s_cluster) as kc:
            for call in (kc.apply, kc.ensure):
                with pytest.raises(ApiError) as e:
                    await call(gone, _config_map("cm", "no-such-namespace", "x"))
                assert e.value.status == 404
                with pytest.raises(ApiError) as e:
                    await call(f"/api/v1/namespaces/{ns}/configmaps", bad)
                assert e.value.status == 422

    run(go())
