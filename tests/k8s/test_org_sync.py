"""The organisation and the inventory on Kubernetes, through a real hub (backend kubernetes)
that reaches the API server as the chart's hub ServiceAccount, with the chart's RBAC only:
the Department/Project objects are the truth, the hub's database a copy fed by a watch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import sync_playwright

from hub_ext.cluster import org as k8s_org
from hub_ext.validation import FieldError
from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.node_agent import NodeAgent, file_inventory
from scheduler.kubernetes.objects import parse_project
from scheduler.kubernetes.testcluster import ClusterInfo, script_path
from scheduler.model import Quota
from tests import chromium
from tests.chart.chartlib import sa_kubeconfig
from tests.hub.hubclient import HubClient, call
from tests.hub.hubproc import ADMIN_PW, Hub
from tests.waits import wait_for

from .conftest import GPUS_PER_NODE, NODES
from .helpers import GROUP, bound, delete_org, kube, list_pods, make_pod, scheduled_false
from .test_node_agent import _node

RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
ORG = "admins: [admin]\nusers: [alice]\ndepartments: []\n"
DEPT, KUBECTL, REST = "d-orgsync", "p-kubectl", "p-rest"


def run(coro):
    """Off the main thread: the browser's (Playwright's sync API) event loop runs there."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _chart_hub_rbac(ns: str) -> list[dict]:
    helm = subprocess.run([str(script_path()), "helm-path"], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = subprocess.run([helm, "template", "gpupool", "chart", "-n", ns, "--show-only",
                          "templates/hub.yaml"], capture_output=True, text=True, check=True,
                         cwd=script_path().parents[1]).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in RBAC_KINDS]


async def _apply_rbac(info: ClusterInfo, ns: str, objs: list[dict]) -> None:
    paths = {"ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
             "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
             "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
             "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
             "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"}
    async with kube(info) as kc:
        for o in objs:
            try:
                await kc.post(paths[o["kind"]], o)
            except ApiError as e:
                if e.status != 409:
                    raise


@pytest.fixture
def hub(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    """A hub with backend kubernetes in namespace ``ns``, as the chart's hub ServiceAccount;
    the department DEPT exists (applied as kubectl would) before it starts."""
    rbac = _chart_hub_rbac(ns)
    (sa,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]

    async def setup():
        await _apply_rbac(k8s_cluster, ns, rbac)
        async with kube(k8s_cluster) as kc:
            await delete_org(kc, DEPT, [KUBECTL, REST])
            await kc.post(f"{GROUP}/departments", {
                "apiVersion": "gpupool.io/v1alpha1", "kind": "Department", "metadata": {"name": DEPT},
                "spec": {"quotas": {"default": {"gpus": 4}}}})
            return await sa_kubeconfig(kc, k8s_cluster, ns, sa, tmp_path / "hub-kubeconfig")

    kubeconfig = run(setup())
    (tmp_path / "org.yaml").write_text(ORG)
    h = Hub(tmp_path / "hub", config=(
        "c = get_config()  # noqa\n"
        "c.Gpupool.backend = 'kubernetes'\n"
        f"c.Gpupool.namespace = {ns!r}\n"
        f"c.Gpupool.kubeconfig = {str(kubeconfig)!r}\n"
        f"c.Gpupool.org_file = {str(tmp_path / 'org.yaml')!r}\n"
        "c.Gpupool.use_nvml = False\n"))
    h.start()
    try:
        yield h
    finally:
        h.stop()
        lines = [x for x in h.log.read_text().splitlines() if " 200 GET " not in x]
        print("--- hub log ---\n" + "\n".join(lines[-80:]))

        async def teardown():
            async with kube(k8s_cluster) as kc:
                await delete_org(kc, DEPT, [KUBECTL, REST])
                await delete_org(kc, "d-rest", [])
                for o in rbac:
                    if o["kind"].startswith("Cluster"):
                        plural = o["kind"].lower() + "s"
                        try:
                            await kc.delete(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{o['metadata']['name']}")
                        except ApiError:
                            pass

        run(teardown())


def _admin(h: Hub) -> tuple[HubClient, str]:
    c = HubClient(h.url).login("admin", ADMIN_PW)
    return c, c.token("admin")


def _page(c: HubClient, h: Hub, page: str) -> str:
    return c.opener.open(f"{h.url}/services/gpupool/{page}").read().decode()


def test_organisation_and_inventory_come_from_the_cluster(k8s_cluster: ClusterInfo, ns, hub, tmp_path):
    with sync_playwright() as p:
        browser = chromium.launch(p)
        try:
            _organisation_and_inventory(k8s_cluster, ns, hub, tmp_path, browser)
        finally:
            browser.close()


def _organisation_and_inventory(k8s_cluster: ClusterInfo, ns: str, hub: Hub, tmp_path, browser):
    c, tok = _admin(hub)

    # a Project applied in the cluster (as kubectl does) shows in the REST API and the panel
    async def apply_project():
        async with kube(k8s_cluster) as kc:
            await kc.post(f"{GROUP}/projects", {
                "apiVersion": "gpupool.io/v1alpha1", "kind": "Project", "metadata": {"name": KUBECTL},
                "spec": {"department": DEPT, "quotas": {"default": {"gpus": 1, "limit": 2}}}})

    run(apply_project())

    def listed():
        status, body = call(hub.url, tok, "GET", "/projects")
        return status == 200 and {p["name"]: p for p in body["items"]}.get(KUBECTL)

    p = wait_for(listed, "the kubectl-applied project in the REST API", timeout=60)
    assert (p["department"], p["gpus"], p["limit"]) == (DEPT, 1, 2)
    assert KUBECTL in _page(c, hub, "org")
    events = call(hub.url, tok, "GET", f"/events?project={KUBECTL}")[1]["items"]
    assert [e["message"] for e in events] == [f"project {KUBECTL} created in the cluster with 1 GPUs"]
    assert "research" not in _page(c, hub, "org"), "departments without an object are not kept"

    # a project made through the REST API is an object; its quota is 0 GPUs at first
    status, body = call(hub.url, tok, "POST", "/projects",
                        {"name": REST, "department": DEPT, "gpus": 0, "members": ["alice"]})
    assert status == 201, body
    assert body["members"] == ["alice"]
    status, body = call(hub.url, tok, "GET", "/audit?action=project.created")
    assert [(e["actor"], e["target"]) for e in body["items"]] == [("admin", REST)], body

    async def get_project(name):
        async with kube(k8s_cluster) as kc:
            return await kc.get(f"{GROUP}/projects/{name}")

    obj = run(get_project(REST))
    assert obj["spec"]["department"] == DEPT and obj["spec"]["quotas"]["default"]["gpus"] == 0

    # a workspace of that project waits: gpupool-scheduler keeps it inside its quota of 0
    async def create_pod():
        async with kube(k8s_cluster) as kc:
            await kc.post(f"/api/v1/namespaces/{ns}/pods",
                          make_pod("ws-quota").ns(ns).project(REST).kind("workspace").gpus(1).obj())

    async def pods():
        async with kube(k8s_cluster) as kc:
            return await list_pods(kc, ns)

    run(create_pod())
    wait_for(lambda: any(scheduled_false(p) for p in run(pods())), "the workspace refused for its quota",
             timeout=120)
    assert not bound(run(pods()))

    # the quota edited in the admin panel lands on the object, and the scheduler binds
    admin = chromium.login(browser, hub.url, "admin", ADMIN_PW)
    admin.goto(hub.url + "/services/gpupool/org")
    row = admin.locator(f"#projects tr[data-name={REST}]")
    row.locator("input[name=gpus]").fill("1")
    row.locator("button", has_text="Save").click()
    admin.wait_for_function(f"document.getElementById('msg').textContent.includes('Saved {REST}')")
    assert run(get_project(REST))["spec"]["quotas"]["default"]["gpus"] == 1
    (pod,) = wait_for(lambda: bound(run(pods())), "the workspace bound after the quota edit", timeout=120)

    # a bad quota is a 400 naming the field, and the object keeps its quota
    status, body = call(hub.url, tok, "PATCH", f"/projects/{REST}", {"gpus": 2, "limit": 1})
    assert status == 400 and body["error"]["field"] == "limit", body
    assert run(get_project(REST))["spec"]["quotas"]["default"]["gpus"] == 1

    # the CLI writes the object too
    gp = str(Path(sys.executable).parent / "gpupool")
    env = {**os.environ, "GPUPOOL_URL": hub.url, "GPUPOOL_TOKEN": tok}
    out = subprocess.run([gp, "project", "quota", REST, "--gpus", "1", "--limit", "3"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "limit 3" in out.stdout, out
    assert run(get_project(REST))["spec"]["quotas"]["default"] == {"gpus": 1, "limit": 3, "overQuotaWeight": 1}
    out = subprocess.run([gp, "project", "quota", REST, "--gpus", "-1"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "gpus:" in out.stderr and "HTTP 400" in out.stderr, out

    # the nodes are the cluster's, each GPU with the pods gpupool-scheduler put on it
    def nodes_with_the_pod():
        status, body = call(hub.url, tok, "GET", "/nodes")
        items = body["items"] if status == 200 else []
        holders = [w["workload"] for n in items for g in n["gpus"] for w in g["workloads"]]
        return items if f"{ns}/ws-quota" in holders else None

    items = wait_for(nodes_with_the_pod, "the bound pod on its GPU in the nodes API", timeout=60,
                     detail=lambda: str(call(hub.url, tok, "GET", "/nodes"))[:3000])
    kwok = [n for n in items if n["name"].startswith("gpu-node-")]
    assert len(kwok) == NODES and all(len(n["gpus"]) == GPUS_PER_NODE for n in kwok)
    assert {n["source"] for n in items} == {"kubernetes"}, "no declared GPUs on Kubernetes"
    node = {n["name"]: n for n in items}[pod["spec"]["nodeName"]]
    gpu = int(pod["metadata"]["annotations"]["gpupool.io/gpu-indices"])
    assert node["gpus"][gpu]["allocated"] == 1
    admin.goto(hub.url + "/services/gpupool/nodes")
    assert f"{ns}/ws-quota (1)" in admin.inner_text("#gpus")

    # a node the node agent publishes shows with each GPU's own model, memory and UUID
    agent_node = f"agent-{ns[-8:]}"
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"gpus": [
        {"index": i, "uuid": f"GPU-{agent_node}-{i}", "model": "NVIDIA A100-SXM4-40GB",
         "memory_mib": 40960, "nvlink_peers": [1 - i]} for i in range(2)],
        "usage": [{"index": 1, "memory_used_mib": 2048, "utilization": 37}]}))

    async def publish_node():
        async with kube(k8s_cluster) as kc:
            await kc.post("/api/v1/nodes", _node(agent_node, agent_node))
            await NodeAgent(kc, agent_node, file_inventory(inv), advertise_capacity=True).sync()

    async def delete_node():
        async with kube(k8s_cluster) as kc:
            await kc.delete(f"/api/v1/nodes/{agent_node}")

    run(publish_node())
    try:
        def agent_gpus():
            status, body = call(hub.url, tok, "GET", "/nodes")
            return {n["name"]: n for n in body["items"]}.get(agent_node, {}).get("gpus")

        gpus = wait_for(agent_gpus, "the agent's node in the nodes API", timeout=60)
        assert [(g["uuid"], g["model"], g["memory_mib"]) for g in gpus] == [
            (f"GPU-{agent_node}-{i}", "NVIDIA A100-SXM4-40GB", 40960) for i in range(2)]
        assert [(g["utilization_pct"], g["memory_used_mib"]) for g in gpus] == [(None, None), (37, 2048)]
        admin.goto(hub.url + "/services/gpupool/nodes")
        row = admin.locator("#gpus tr", has_text=agent_node).nth(1)
        assert "37%" in row.inner_text() and "NVIDIA A100-SXM4-40GB" in row.inner_text()
    finally:
        run(delete_node())
    wait_for(lambda: agent_gpus() is None, "the deleted node gone from the nodes API", timeout=60)

    # a project deleted in the cluster leaves the REST API
    async def delete_kubectl_project():
        async with kube(k8s_cluster) as kc:
            await kc.delete(f"{GROUP}/projects/{KUBECTL}")

    run(delete_kubectl_project())
    wait_for(lambda: not listed(), "the deleted project gone from the REST API", timeout=60)

    # and one deleted through the REST API leaves the cluster
    status, _ = call(hub.url, tok, "DELETE", f"/projects/{REST}")
    assert status == 204
    with pytest.raises(ApiError) as gone:
        run(get_project(REST))
    assert gone.value.status == 404

    # departments too: created, edited and deleted through the REST API, in the cluster
    async def get_department(name):
        async with kube(k8s_cluster) as kc:
            return await kc.get(f"{GROUP}/departments/{name}")

    status, body = call(hub.url, tok, "POST", "/departments", {"name": "d-rest", "gpus": 2})
    assert status == 201, body
    status, body = call(hub.url, tok, "PATCH", "/departments/d-rest", {"gpus": 3, "over_quota_weight": 2})
    assert status == 200, body
    assert run(get_department("d-rest"))["spec"]["quotas"]["default"] == {"gpus": 3, "overQuotaWeight": 2}
    assert call(hub.url, tok, "DELETE", "/departments/d-rest")[0] == 204
    with pytest.raises(ApiError) as gone:
        run(get_department("d-rest"))
    assert gone.value.status == 404


def test_pool_quotas_are_the_objects(k8s_cluster: ClusterInfo, hub):
    """``pools`` through the REST API land in the objects' spec.quotas.<pool>, which the
    scheduler's adapter reads; a kubectl edit of the object shows in GET; the panel's table
    edits them; a pool set to null leaves the object."""
    c, tok = _admin(hub)

    async def get(kind, name):
        async with kube(k8s_cluster) as kc:
            return await kc.get(f"{GROUP}/{kind}/{name}")

    status, d = call(hub.url, tok, "PATCH", f"/departments/{DEPT}", {"pools": {"fast": {"gpus": 2}}})
    assert status == 200 and d["pools"]["fast"]["gpus"] == 2, d
    assert run(get("departments", DEPT))["spec"]["quotas"]["fast"] == {"gpus": 2, "overQuotaWeight": 1}
    status, p = call(hub.url, tok, "POST", "/projects", {"name": REST, "department": DEPT, "gpus": 1,
                                                         "pools": {"fast": {"gpus": 1, "limit": 2}}})
    assert status == 201, p
    obj = run(get("projects", REST))
    assert obj["spec"]["quotas"] == {"default": {"gpus": 1, "overQuotaWeight": 1},
                                     "fast": {"gpus": 1, "overQuotaWeight": 1, "limit": 2}}
    assert parse_project(obj).quotas["fast"] == Quota(1, 1.0, 2)  # what gpupool-scheduler reads
    refused = call(hub.url, tok, "PATCH", f"/projects/{REST}", {"pools": {"fast": {"gpus": 3, "limit": None}}})
    assert refused[0] == 400 and refused[1]["error"]["field"] == "pools.fast.gpus", refused

    # kubectl edit of the object: GET shows it
    async def edit():
        async with kube(k8s_cluster) as kc:
            await kc.patch(f"{GROUP}/projects/{REST}", {"spec": {"quotas": {"fast": {"gpus": 0.5}}}})

    run(edit())
    wait_for(lambda: call(hub.url, tok, "GET", f"/projects/{REST}")[1]["pools"].get("fast", {}).get("gpus") == 0.5,
             "the kubectl edit in GET /projects", timeout=60)
    assert call(hub.url, tok, "GET", f"/projects/{REST}")[1]["pools"]["fast"]["limit"] == 2

    # the panel's table of quotas per node pool writes the object
    with sync_playwright() as pw:
        browser = chromium.launch(pw)
        try:
            page = chromium.login(browser, hub.url, "admin", ADMIN_PW)
            page.goto(hub.url + "/services/gpupool/org")
            row = page.locator(f"#pool-quotas tr[data-kind=projects][data-name={REST}][data-pool=fast]")
            assert float(row.locator("input[name=gpus]").input_value()) == 0.5
            row.locator("input[name=gpus]").fill("1.5")
            row.locator("button").click()
            page.wait_for_function(f"document.getElementById('msg').textContent.includes('Saved {REST} in pool fast')")
        finally:
            browser.close()
    assert run(get("projects", REST))["spec"]["quotas"]["fast"] == {"gpus": 1.5, "overQuotaWeight": 1, "limit": 2}

    status, p = call(hub.url, tok, "PATCH", f"/projects/{REST}", {"pools": {"fast": None}})
    assert status == 200 and p["pools"] == {}, p
    assert "fast" not in run(get("projects", REST))["spec"]["quotas"]


def test_api_server_refusal_names_the_field(k8s_cluster: ClusterInfo):
    """What the CRDs' validation refuses (422) comes back as the REST API's field names."""
    item = {"name": "p-refused", "department": DEPT, "gpus": 2, "over_quota_weight": 1, "limit": 1}

    async def publish(it):
        async with kube(k8s_cluster) as kc:
            await k8s_org.publish(kc, "project", "p-refused", it)

    with pytest.raises(FieldError) as e:
        run(publish(item))
    assert e.value.field == "limit" and "greater than or equal" in e.value.message
    with pytest.raises(FieldError) as e:
        run(publish({**item, "limit": None, "gpus": -1}))
    assert e.value.field == "gpus"
    with pytest.raises(FieldError) as e:  # another pool's: named as the REST API's pools
        run(publish({**item, "limit": None, "pools": {"fast": {"gpus": 2, "over_quota_weight": 1, "limit": 1}}}))
    assert e.value.field == "pools.fast.limit" and "greater than or equal" in e.value.message, (e.value.field, e.value.message)

    async def absent():
        async with kube(k8s_cluster) as kc:
            try:
                await kc.get(f"{GROUP}/projects/p-refused")
            except ApiError as err:
                return err.status == 404
        return False

    assert asyncio.run(absent())


def test_cluster_refusing_the_hub_is_a_403(k8s_cluster: ClusterInfo, ns, tmp_path):
    """A ServiceAccount without the chart's ClusterRole (an organisation kept in Git) gets
    the REST API's 403, not a failure."""
    from hub_ext.org.roles import Forbidden
    from scheduler.kubernetes.client import KubeClient

    async def go():
        async with kube(k8s_cluster) as kc:
            await kc.post(f"/api/v1/namespaces/{ns}/serviceaccounts",
                          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}})
            path = await sa_kubeconfig(kc, k8s_cluster, ns, "reader", tmp_path / "kubeconfig")
        async with await KubeClient.from_kubeconfig(str(path)) as sa:
            await k8s_org.publish(sa, "department", "d-refused",
                                  {"name": "d-refused", "gpus": 1, "over_quota_weight": 1, "limit": None})

    with pytest.raises(Forbidden) as e:
        run(go())
    assert "d-refused" in e.value.reason


# -- the copy, without a cluster -----------------------------------------------------------
def _obj(name: str, gpus: float, department: str | None = None, **quota) -> dict:
    spec: dict = {"quotas": {"default": {"gpus": gpus, **quota}, "other-pool": {"gpus": 99}}}
    if department is not None:
        spec["department"] = department
    return {"metadata": {"name": name}, "spec": spec}


def test_copy_follows_the_objects(tmp_path):
    from hub_ext.db.tables import MemberRow
    from hub_ext.org import projects as org
    from hub_ext.schema import make_sessionmaker

    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")
    depts = {"d": _obj("d", 4)}
    projects = {"p": _obj("p", 1, "d", limit=2, overQuotaWeight=3), "orphan": _obj("orphan", 1, "nowhere")}
    with Session() as s:
        assert k8s_org.reconcile(s, depts, projects)
        s.add(MemberRow(project="p", user="alice"))
        s.commit()
        (p,) = org.list_projects(s)
        assert (p["name"], p["gpus"], p["limit"], p["over_quota_weight"], p["members"]) == ("p", 1, 2, 3, ["alice"])
        assert p["pools"] == {"other-pool": {"gpus": 99, "over_quota_weight": 1, "limit": None,
                                             "cpu_quota": None, "memory_quota_gib": None}}
        assert not k8s_org.reconcile(s, depts, projects), "nothing changed, nothing written"
        # CPU and memory quotas are the object's too, in every pool
        projects["p"]["spec"]["quotas"]["other-pool"] = {"gpus": 98, "limit": 99, "cpu": 4, "memoryGib": 16}
        projects["p"]["spec"]["quotas"]["default"]["cpu"] = 8
        assert k8s_org.reconcile(s, depts, projects)
        assert org.get_project(s, "p")["pools"]["other-pool"] == {
            "gpus": 98, "over_quota_weight": 1, "limit": 99, "cpu_quota": 4, "memory_quota_gib": 16}
        assert (org.get_project(s, "p")["cpu_quota"], org.get_project(s, "p")["memory_quota_gib"]) == (8, None)
        assert k8s_org.spec_of("project", org.get_project(s, "p"))["quotas"]["other-pool"] == {
            "gpus": 98, "overQuotaWeight": 1, "limit": 99, "cpu": 4, "memoryGib": 16}
        projects["p"] = _obj("p", 2, "d")  # limit removed, quota raised
        assert k8s_org.reconcile(s, depts, projects)
        (p,) = org.list_projects(s)
        assert (p["gpus"], p["limit"], p["members"]) == (2, None, ["alice"])
        assert k8s_org.reconcile(s, {}, projects)  # the department gone: its projects too
        s.commit()
        assert org.list_projects(s) == [] and org.list_departments(s) == []
        assert s.query(MemberRow).count() == 0


def test_inventory_rows_from_nodes_and_bound_pods():
    from hub_ext.cluster import inventory as k8s_inventory

    node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.memory": "80000"},
                         "annotations": {"gpupool.io/gpus": '[{"index": 1, "uuid": "GPU-1", "model": "NVIDIA H100", '
                                                            '"memory_mib": 81559}]'}},
            "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "16Gi"}}}

    def pod(name, phase="Running", **ann):
        return {"metadata": {"name": name, "namespace": "ns", "annotations": {"gpupool.io/project": "nlp", **ann}},
                "spec": {"nodeName": "n1"}, "status": {"phase": phase}}

    pods = {"a": pod("a", **{"gpupool.io/gpu-indices": "1", "gpupool.io/gpu-milli": "500"}),
            "b": pod("b", **{"gpupool.io/gpu-indices": "0,1", "gpupool.io/over-quota": "true"}),
            "done": pod("done", "Succeeded", **{"gpupool.io/gpu-indices": "0"}),
            "unbound": {**pod("u"), "spec": {}}}
    (row,) = k8s_inventory.rows({"/n1": node}, pods)
    assert (row.name, row.source, row.cpu_milli) == ("n1", "kubernetes", 8000)
    g0, g1 = row.gpus
    assert (g0["model"], g0["memory_mib"], g0["uuid"]) == ("H100", 80000, "")
    assert (g1["model"], g1["memory_mib"], g1["uuid"]) == ("NVIDIA H100", 81559, "GPU-1")
    assert [(p["pod"], p["gpu"], p["over_quota"]) for p in g0["pods"]] == [("b", 1.0, True)]
    assert [(p["pod"], p["gpu"]) for p in g1["pods"]] == [("a", 0.5), ("b", 1.0)]


def test_unreachable_api_server_is_unavailable_not_a_crash():
    from scheduler.kubernetes.client import KubeClient

    async def go():
        async with KubeClient("https://127.0.0.1:9", None, None) as kc:  # nothing listens there
            await k8s_org.publish(kc, "project", "p", {"name": "p", "department": "d", "gpus": 1,
                                                       "over_quota_weight": 1, "limit": None})

    with pytest.raises(k8s_org.Unavailable) as e:
        run(go())
    assert "cannot be reached" in str(e.value)
