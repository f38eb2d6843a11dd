"""Training gangs on the local cluster: the manifests of ``hub_ext.training.pods`` applied
as they are (headless Service, then one pod per worker), placed by gpupool-scheduler.

The test run's cluster has 4 nodes x 8 GPUs; each test makes its own Department/Project and
namespace (fixtures ``ns`` and ``sched`` from conftest) and leaves no pods behind.
"""

from __future__ import annotations

import asyncio

from hub_ext.training.pods import LABEL_JOB, LABEL_RANK, KubernetesOptions, training_objects
from hub_ext.training.spec import TrainingSpec
from scheduler.kubernetes.testcluster import ClusterInfo

from .conftest import GPUS_PER_NODE, NODES
from .helpers import (
    bound,
    create_org,
    delete_org,
    kube,
    list_pods,
    run,
    scheduled_false,
    wait_until,
)


async def _apply(kc, ns: str, objs: list[dict]) -> None:
    """The builder's objects as they are: the Service first, then the worker pods."""
    for obj in objs:
        plural = {"Service": "services", "Pod": "pods"}[obj["kind"]]
        await kc.post(f"/api/v1/namespaces/{ns}/{plural}", obj)


async def _gang_pods(kc, ns: str, job: str) -> list[dict]:
    items, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{LABEL_JOB}={job}")
    return items


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}


async def _place(k8s_cluster: ClusterInfo, ns: str, spec: TrainingSpec, project_quota: float):
    """Apply the job's objects; wait until every worker is bound. Returns
    (Service, pods selected by the Service's selector, ConfigMaps the pods' envFrom name)."""
    dept, project = f"d-{spec.project}", spec.project
    async with kube(k8s_cluster) as kc:
        await create_org(kc, dept, NODES * GPUS_PER_NODE, {project: {"gpus": project_quota}})
        try:
            await _apply(kc, ns, training_objects(spec, KubernetesOptions(namespace=ns)))

            async def all_bound():
                pods = await _gang_pods(kc, ns, spec.name)
                return len(pods) == spec.workers and len(bound(pods)) == spec.workers and pods

            await wait_until(all_bound, f"all {spec.workers} workers of {spec.name} bound")
            svc = await kc.get(f"/api/v1/namespaces/{ns}/services/{spec.name}")
            sel = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
            selected, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=sel)
            cms = {}
            for p in selected:
                for src in p["spec"]["containers"][0].get("envFrom", []):
                    name = src["configMapRef"]["name"]
                    cms[name] = await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
            return svc, selected, cms, await list_pods(kc, ns)
        finally:
            await delete_org(kc, dept, [project])


def _check_gang(spec: TrainingSpec, ns: str, svc: dict, pods: list[dict], everything: list[dict]):
    n = spec.workers
    # the headless Service: no cluster IP, its selector picks exactly the gang's pods
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {LABEL_JOB: spec.name}
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{spec.name}-{r}" for r in range(n)]
    assert sorted(p["metadata"]["name"] for p in everything) == sorted(
        p["metadata"]["name"] for p in pods), "the selector picks the gang's pods and only them"
    # every worker bound, with the gang's placement stamped on each
    assert len(bound(pods)) == n
    for p in pods:
        ann = p["metadata"]["annotations"]
        assert ann["gpupool.io/gang"] == spec.name and ann["gpupool.io/gang-size"] == str(n)
        assert ann["gpupool.io/node"] == p["spec"]["nodeName"]
    # torchrun's environment: one world of n, ranks 0..n-1, rank 0 through the Service's DNS
    by_rank = {}
    for p in pods:
        env = _env(p)
        assert env["WORLD_SIZE"] == str(n)
        assert env["MASTER_PORT"] == str(svc["spec"]["ports"][0]["port"])
        assert env["NODE_RANK"] == env["RANK"] and env["LOCAL_RANK"] == "0"
        assert p["metadata"]["labels"][LABEL_RANK] == env["RANK"]
        by_rank[int(env["RANK"])] = p
    assert sorted(by_rank) == list(range(n)), "ranks are distinct and 0..N-1"
    rank0 = by_rank[0]
    masters = {_env(p)["MASTER_ADDR"] for p in pods}
    assert masters == {f"{rank0['spec']['hostname']}.{svc['metadata']['name']}.{ns}.svc"}
    # the pod DNS name HOSTNAME.SUBDOMAIN exists because subdomain names the headless Service
    assert rank0["spec"]["subdomain"] == svc["metadata"]["name"]
    assert rank0["spec"]["hostname"] == f"{spec.name}-0"


def test_whole_gpu_training_gang_bound_together_with_torchrun_env(k8s_cluster: ClusterInfo, ns,
                                                                   sched):
    # 3 workers x 6 GPUs: no two fit one 8-GPU node, so the gang spans 3 nodes
    spec = TrainingSpec(name="llama", project="p-train-whole", command=["torchrun", "train.py"],
                        gpu=6, workers=3, cpu=0.5, memory_gib=1)
    svc, pods, cms, everything = run(_place(k8s_cluster, ns, spec, project_quota=18))
    _check_gang(spec, ns, svc, pods, everything)
    assert not cms
    assert len({p["spec"]["nodeName"] for p in pods}) == 3
    for p in pods:
        assert len(p["metadata"]["annotations"]["gpupool.io/gpu-indices"].split(",")) == 6


def test_fractional_training_gang_bound_with_its_config_maps(k8s_cluster: ClusterInfo, ns, sched):
    spec = TrainingSpec(name="bert", project="p-train-frac", command=["torchrun", "train.py"],
                        gpu=0.5, workers=2, cpu=0.5, memory_gib=1)
    svc, pods, cms, everything = run(_place(k8s_cluster, ns, spec, project_quota=1))
    _check_gang(spec, ns, svc, pods, everything)
    for p in pods:
        ann = p["metadata"]["annotations"]
        assert ann["gpupool.io/gpu-milli"] == "500"
        cm = cms[f"{p['metadata']['name']}-gpupool"]  # the one the pod's envFrom names
        assert cm["metadata"]["ownerReferences"][0]["uid"] == p["metadata"]["uid"]
        assert cm["data"]["GPUPOOL_GPU_INDEX"] == ann["gpupool.io/gpu-indices"]
        assert cm["data"]["GPUPOOL_GPU_MILLI"] == "500"


def test_training_gang_that_cannot_fit_stays_unbound(k8s_cluster: ClusterInfo, ns, sched):
    # one worker more than there are nodes, each wanting a whole node: never all at once
    workers = NODES + 1
    spec = TrainingSpec(name="huge", project="p-train-huge", command=["torchrun", "train.py"],
                        gpu=GPUS_PER_NODE, workers=workers, cpu=0.5, memory_gib=1)

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-train-huge", NODES * GPUS_PER_NODE * 2,
                             {spec.project: {"gpus": GPUS_PER_NODE * workers}})
            try:
                await _apply(kc, ns, training_objects(spec, KubernetesOptions(namespace=ns)))

                async def all_reported():
                    pods = await _gang_pods(kc, ns, spec.name)
                    return (len(pods) == workers and all(scheduled_false(p) for p in pods)
                            and pods)

                reported = await wait_until(all_reported, "every worker reported unschedulable")
                await asyncio.sleep(3)  # a few more scheduling passes: still nothing bound
                return reported, await _gang_pods(kc, ns, spec.name)
            finally:
                await delete_org(kc, "d-train-huge", [spec.project])

    reported, later = run(go())
    assert not bound(reported) and not bound(later), "part of the gang was bound"
    for p in later:
        assert "gpupool.io/node" not in p["metadata"]["annotations"], "no plan stamped"
    conds = [scheduled_false(p) for p in reported]
    assert {c["reason"] for c in conds} == {"Unschedulable"}
    assert all(c["message"] for c in conds), conds
    assert len({c["message"] for c in conds}) == 1, "one reason for the whole gang"
    assert "gang" in conds[0]["message"], conds[0]["message"]
