"""The SSH gateway on Kubernetes reaches a workspace pod through the API server's
``pods/exec`` and ``pods/portforward`` with exactly the chart's hub Role (rendered by helm,
bound to a ServiceAccount the requests impersonate). kwok pods run no process, so a
request the Role allows gets past authorization and fails later (no kubelet answers);
the same request under the Role rendered without the gateway is refused with 403."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import yaml
from kubernetes_asyncio import client

from hub_ext.ssh.kubernetes import KubernetesBackend, Refused
from scheduler.kubernetes.testcluster import ClusterInfo, script_path
from tests.k8s.helpers import kube, wait_until

pytestmark = pytest.mark.slow
PASSWORDS = ["--set", "hub.auth.sharedPassword.userPassword=u",
             "--set", "hub.auth.sharedPassword.adminPassword=" + "a" * 40]


def hub_role(namespace: str, ssh_port: int) -> dict:
    helm = subprocess.run([str(script_path()), "helm-path"], capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run([helm, "template", "gpupool", "chart", "-n", namespace, "--set", f"hub.ssh.port={ssh_port}",
                          *PASSWORDS], capture_output=True, text=True, check=True, timeout=120).stdout
    roles = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Role" and d["metadata"]["name"].endswith("hub")]
    assert len(roles) == 1, [r["metadata"]["name"] for r in roles]
    return roles[0]


async def bind(kc, ns: str, role: dict, sa: str) -> None:
    role = {**role, "metadata": {"name": sa, "namespace": ns}}
    await kc.post(f"/api/v1/namespaces/{ns}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                               "metadata": {"name": sa}})
    await kc.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", role)
    await kc.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": sa},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})


def backend(info: ClusterInfo, ns: str, sa: str) -> KubernetesBackend:
    cfg = client.Configuration(host=info.host, api_key={"BearerToken": info.token},
                               api_key_prefix={"BearerToken": "Bearer"})
    cfg.ssl_ca_cert = str(info.ca_file)
    return KubernetesBackend(ns, cfg, {"Impersonate-User": f"system:serviceaccount:{ns}:{sa}"})


async def workspace_pod(kc, ns: str) -> str:
    node = (await kc.get("/api/v1/nodes"))["items"][0]["metadata"]["name"]
    await kc.post(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "jupyter-alice", "labels": {"component": "singleuser-server"},
                     "annotations": {"hub.jupyter.org/username": "alice", "hub.jupyter.org/servername": ""}},
        "spec": {"nodeName": node, "containers": [{"name": "notebook", "image": "gpupool-workspace"}],
                 "tolerations": [{"operator": "Exists"}]}})

    async def running():
        return (await kc.get(f"/api/v1/namespaces/{ns}/pods/jupyter-alice"))["status"].get("phase") == "Running"
    await wait_until(running, "the workspace pod to run")
    return "jupyter-alice"


async def attempt(b: KubernetesBackend, pod: str, what: str) -> int:
    """The status the API server answers an exec or port-forward request with."""
    try:
        if what == "exec":
            async with b._exec(pod, ["true"], tty=False):
                return 101
        async with b._portforward(pod, 8888):
            return 101
    except Refused as e:
        return e.status


def test_exec_and_port_forward_pass_the_charts_rbac_and_nothing_less(k8s_cluster, ns):
    async def go():
        async with kube(k8s_cluster) as kc:
            await bind(kc, ns, hub_role(ns, 2222), "hub")
            await bind(kc, ns, hub_role(ns, 0), "hub-without-ssh")
            pod = await workspace_pod(kc, ns)
        allowed, without = backend(k8s_cluster, ns, "hub"), backend(k8s_cluster, ns, "hub-without-ssh")
        assert await allowed.workload("alice", "") == pod
        assert await allowed.workload("alice", "other") is None
        assert await allowed.workload("bob", "") is None
        results = {}
        for what in ("exec", "portforward"):
            results[what] = (await attempt(allowed, pod, what), await attempt(without, pod, what))
        return results

    results = asyncio.run(go())
    for what, (allowed, without) in results.items():
        assert without == 403, (what, without)
        assert allowed == 500, (what, allowed)  # authorized, then no kubelet behind a kwok node answers
