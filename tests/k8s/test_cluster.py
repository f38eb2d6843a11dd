"""The local test cluster itself: it comes up, kwok nodes carry GPUs, CRDs validate."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.testcluster import ClusterInfo, client_for

from .conftest import GPUS_PER_NODE, NODES

PROJECTS = "/apis/gpupool.io/v1alpha1/projects"
DEPARTMENTS = "/apis/gpupool.io/v1alpha1/departments"


def run(coro):
    return asyncio.run(coro)


def test_api_server_is_ready_and_versioned(k8s_cluster: ClusterInfo):
    async def go():
        async with client_for(k8s_cluster) as kc:
            return await kc.get("/version")

    version = run(go())
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.")


def test_kwok_nodes_are_ready_with_gpus(k8s_cluster: ClusterInfo):
    async def go():
        async with client_for(k8s_cluster) as kc:
            return await kc.get("/api/v1/nodes", labelSelector="type=kwok")

    nodes = run(go())["items"]
    assert len(nodes) == NODES
    for n in nodes:
        assert n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert n["status"]["capacity"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        labels = n["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"]
        assert int(labels["nvidia.com/gpu.memory"]) > 0
        assert labels["topology.kubernetes.io/zone"] and labels["gpupool.io/rack"]
        ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def _project(name: str, **quota) -> dict:
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Project",
        "metadata": {"name": name},
        "spec": {"department": "research", "quotas": {"default": quota}},
    }


def test_good_department_and_project_are_accepted_with_status(k8s_cluster: ClusterInfo):
    async def go():
        async with client_for(k8s_cluster) as kc:
            await kc.post(DEPARTMENTS, {
                "apiVersion": "gpupool.io/v1alpha1", "kind": "Department",
                "metadata": {"name": "research"},
                "spec": {"quotas": {"default": {"gpus": 16, "limit": 24}}},
            })  # fmt: skip
            p = await kc.post(PROJECTS, _project("nlp", gpus=2.5, overQuotaWeight=2, limit=4))
            p["status"] = {"allocated": {"default": 1.5}, "fairShare": {"default": 3}}
            await kc.put(f"{PROJECTS}/nlp/status", p)
            got = await kc.get(f"{PROJECTS}/nlp")
            await kc.delete(f"{PROJECTS}/nlp")
            await kc.delete(f"{DEPARTMENTS}/research")
            return got

    got = run(go())
    assert got["spec"]["quotas"]["default"] == {"gpus": 2.5, "overQuotaWeight": 2, "limit": 4}
    assert got["status"]["fairShare"]["default"] == 3


@pytest.mark.parametrize(
    "case,quota,expect",
    [
        ("negative-gpus", {"gpus": -1}, "spec.quotas.default.gpus"),
        ("limit-below-quota", {"gpus": 4, "limit": 2}, "limit must be greater than or equal"),
        ("negative-weight", {"gpus": 1, "overQuotaWeight": -0.5}, "overQuotaWeight"),
        ("gpus-not-a-number", {"gpus": "four"}, "spec.quotas.default.gpus"),
        ("gpus-missing", {"limit": 3}, "gpus: Required value"),
        # The hub's and the scheduler's bound (scheduler.model.MAX_GPUS): a limit of 1e307
        # once stopped every scheduling cycle.
        ("limit-huge", {"gpus": 1, "limit": 1e307}, "spec.quotas.default.limit"),
        ("gpus-huge", {"gpus": 2e6}, "spec.quotas.default.gpus"),
        ("weight-huge", {"gpus": 1, "overQuotaWeight": 1e300}, "overQuotaWeight"),
    ],
)
def test_api_server_rejects_bad_project(k8s_cluster: ClusterInfo, case, quota, expect):
    async def go():
        async with client_for(k8s_cluster) as kc:
            with pytest.raises(ApiError) as err:
                await kc.post(PROJECTS, _project(f"bad-{case}", **quota))
            return err.value

    err = run(go())
    assert err.status == 422, err
    assert expect in err.message, err.message


def test_project_without_department_is_rejected(k8s_cluster: ClusterInfo):
    async def go():
        async with client_for(k8s_cluster) as kc:
            body = _project("orphan", gpus=1)
            del body["spec"]["department"]
            with pytest.raises(ApiError) as err:
                await kc.post(PROJECTS, body)
            return err.value

    err = run(go())
    assert err.status == 422 and "department" in err.message


def test_client_reads_the_kubeconfig_both_ways(k8s_cluster: ClusterInfo, tmp_path):
    """A plain kubeconfig (server, CA data, token) is read without kubernetes_asyncio; one
    with fields the short reader does not know goes through kubernetes_asyncio; both reach
    the same API server, and a wrong token is refused."""
    import yaml

    from scheduler.kubernetes.client import KubeClient, _simple_kubeconfig

    doc = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
    simple = _simple_kubeconfig(str(k8s_cluster.kubeconfig))
    assert simple is not None and simple["token"] == k8s_cluster.token and simple["ca_data"]
    other = dict(doc)
    other["preferences"] = {}
    other["users"] = [{"name": u["name"], "user": {**u["user"], "username": "ignored"}}
                      for u in doc["users"]]
    full = tmp_path / "full-kubeconfig"
    full.write_text(yaml.safe_dump(other))
    assert _simple_kubeconfig(str(full)) is None
    bad = dict(doc)
    bad["users"] = [{"name": u["name"], "user": {"token": "wrong"}} for u in doc["users"]]
    wrong = tmp_path / "wrong-kubeconfig"
    wrong.write_text(yaml.safe_dump(bad))

    async def go():
        versions = []
        for path in (k8s_cluster.kubeconfig, full):
            async with await KubeClient.from_kubeconfig(str(path)) as kc:
                versions.append((await kc.get("/version"))["gitVersion"])
        async with await KubeClient.from_kubeconfig(str(wrong)) as kc:
            with pytest.raises(ApiError) as err:
                await kc.get("/api/v1/nodes")
        return versions, err.value.status

    versions, status = run(go())
    assert versions[0] == versions[1] and versions[0].startswith("v1.")
    assert status == 401


@pytest.mark.parametrize("content", [
    None,  # no such file
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
     "users: [{name: u, user: {tokenFile: missing-token}}]\n"),  # its token file is missing
    "clusters: [not, a, kubeconfig\n",  # not YAML
])
def test_scheduler_names_an_unusable_kubeconfig(tmp_path, capsys, content):
    from scheduler.kubernetes.cli import main

    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    assert main(["--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"cannot use --kubeconfig {path}:" in err and "Traceback" not in err


def test_the_scheduler_command_line_sets_the_core_s_switches():
    from scheduler.kubernetes.cli import core_config, parser

    assert core_config(parser().parse_args([])).consolidate_in_quota is True
    cfg = core_config(parser().parse_args(["--consolidate-in-quota", "off", "--topology-key", "gpupool.io/rack"]))
    assert (cfg.consolidate_in_quota, cfg.default_topology_key) == (False, "gpupool.io/rack")
