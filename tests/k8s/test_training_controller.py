"""The hub's training controller on the local cluster: a submitted 2-worker job becomes a
gang of pods with a headless Service and a checkpoint claim, gpupool-scheduler binds it,
the job shows Pending with the scheduler's reason and then Running; an in-quota workspace of
another project preempts it (Preempted, requeued with raised priority and the same claim,
bound again); Succeeded and Failed come from the containers' status. The controller follows
the pods by a watch: it lists them once."""

from __future__ import annotations

import asyncio

from hub_ext.db.tables import EventRow, WorkloadRow
from hub_ext.schema import make_sessionmaker
from hub_ext.training.db import TrainingRow, add_training
from hub_ext.training.kubernetes import KubernetesTrainings, checkpoint_claim, gang_state
from hub_ext.training.spec import TrainingSpec
from scheduler.contract import A, L
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import bound, count_reads, create_org, delete_org, kube, make_pod, run, wait_until


def _pod(name: str, node: str = "", phase: str = "Pending", deleting: bool = False, exit_code=None,
         scheduled: str = "") -> dict:
    meta: dict = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict = {"phase": phase}
    if scheduled:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "message": scheduled}]
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "worker", "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def test_gang_state_from_pods():
    assert gang_state([_pod("a", scheduled="project p is over quota"), _pod("b")], 2).reason == \
        "project p is over quota"
    assert gang_state([_pod("a", "n1"), _pod("b", "n2")], 2).status == "Pending"
    assert gang_state([_pod("a", "n1", "Running"), _pod("b", "n2", "Running")], 2).status == "Running"
    assert gang_state([_pod("a", "n1", "Running", deleting=True), _pod("b", "n2", "Running")], 2).status == \
        "Preempted"
    assert gang_state([_pod("a", "n1", "Running")], 2).status == "Preempted"
    # a worker that saved on SIGTERM exits 143 while its pod is deleted: still a preemption
    assert gang_state([_pod("a", "n1", "Failed", deleting=True, exit_code=143), _pod("b", "n2", "Running")],
                      2).status == "Preempted"
    assert gang_state([_pod("a", "n1", "Succeeded", exit_code=0),
                       _pod("b", "n1", "Succeeded", exit_code=0)], 2).status == "Succeeded"
    failed = gang_state([_pod("a", "n1", "Failed", exit_code=3), _pod("b", "n1", "Running")], 2)
    assert (failed.status, failed.reason) == ("Failed", "worker a exited with code 3")


def test_training_gang_preempted_requeued_and_bound_again_with_its_claim(k8s_cluster: ClusterInfo, ns,
                                                                         sched, tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    spec = TrainingSpec(name="gang", project="p-ctl-train", command=["torchrun", "train.py"], gpu=8,
                        workers=2, cpu=0.5, memory_gib=1, grace_period_s=0)
    projects = {"p-ctl-train": {"gpus": 0}, "p-ctl-ws": {"gpus": 32}}

    def row() -> TrainingRow:
        with Session() as s:
            return s.get(TrainingRow, "gang")

    async def go():
        async with kube(k8s_cluster) as kc, kube(k8s_cluster) as ctl_kc:
            await create_org(kc, "d-ctl", 32, projects)
            lists = count_reads(ctl_kc, f"/api/v1/namespaces/{ns}/pods".__eq__)
            ctl = KubernetesTrainings(ctl_kc, Session, ns, poll_s=0.2)
            try:
                # the other project holds 16 GPUs, so the gang (16 more, over quota) fills the cluster
                for i in range(2):
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", make_pod(f"fill-{i}").ns(ns)
                                  .project("p-ctl-ws").kind("training").gpus(8).annotate(A.PREEMPTIBLE, "false")
                                  .obj())
                with Session() as s:
                    add_training(s, "alice", spec)
                    s.commit()
                ctl.start()
                await wait_until(lambda: _status("Running"), "the gang runs")
                pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}=gang")
                assert len(bound(pods)) == 2 and {p["spec"]["schedulerName"] for p in pods} == {"gpupool"}
                claims = {v["persistentVolumeClaim"]["claimName"] for p in pods for v in p["spec"]["volumes"]
                          if "persistentVolumeClaim" in v}
                assert claims == {checkpoint_claim("gang")}
                await kc.get(f"/api/v1/namespaces/{ns}/services/gang")
                first_uids = {p["metadata"]["uid"] for p in pods}
                # an in-quota workspace of the other project needs the gang's GPUs
                await kc.post(f"/api/v1/namespaces/{ns}/pods", make_pod("ws").ns(ns).project("p-ctl-ws")
                              .kind("workspace").gpus(8).obj())
                await wait_until(lambda: _preempted(), "the gang is preempted")
                await wait_until(lambda: _requeued(kc), "the gang is requeued")
                pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}=gang")
                assert not {p["metadata"]["uid"] for p in pods} & first_uids
                for p in pods:
                    ann = p["metadata"]["annotations"]
                    assert ann[A.PRIORITY] == str(spec.priority + 1) and ann[A.RESUMED] == "true"
                    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "gang-checkpoints"}} \
                        in p["spec"]["volumes"]
                await kc.delete(f"/api/v1/namespaces/{ns}/pods/ws")
                await wait_until(lambda: _status("Running"), "the gang runs again")
                t = row()
                assert t.preemptions == 1
                assert [x["status"] for x in t.transitions].count("Preempted") == 1
                with Session() as s:
                    kinds = {e.kind for e in s.query(EventRow).filter(EventRow.workload == "gang")}
                    assert {"submitted", "started", "preempted"} <= kinds
                    assert s.get(WorkloadRow, "gang").state == "running"
                # Succeeded from the containers' status
                pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}=gang")
                for p in pods:
                    await kc.patch(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}/status", {
                        "status": {"phase": "Succeeded", "containerStatuses": [{
                            "name": "worker", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})
                await wait_until(lambda: _status("Succeeded"), "the gang succeeded")
                # through a preemption, a requeue and the end: one list, then the watch
                assert len(lists) == ctl.pods.lists == 1
            finally:
                await ctl.stop()
                await delete_org(kc, "d-ctl", projects)

    async def _status(want: str) -> bool:
        return row().status == want

    async def _preempted() -> bool:
        return row().preemptions == 1

    async def _requeued(kc) -> bool:
        pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}=gang")
        return len(pods) == 2 and row().status == "Pending"

    run(asyncio.wait_for(go(), 240))


CRED_KEY, CRED_TOKEN = "AKIATRAINK8S0001", "train-k8s-token-5d1e"


def test_training_pods_carry_its_credentials_and_data_sources(k8s_cluster: ClusterInfo, ns, tmp_path):
    """A job with an env credential, a files credential and a PVC data source: the Secret
    ``NAME-credentials`` holds the values (read from the vault at launch), every worker
    references its keys and mounts the claim, no value is in a pod, the delivery is audited,
    and delete removes the Secret."""
    import base64

    from sqlalchemy import select

    from hub_ext.attachments import credentials, datasources
    from hub_ext.db.audit import AuditRow
    from hub_ext.db.tables import DepartmentRow, ProjectRow
    from scheduler.kubernetes.client import ApiError

    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    vault = credentials.Vault(tmp_path / "key")
    with Session() as s:
        s.add(DepartmentRow(name="d-tcred", gpus=8))
        s.add(ProjectRow(name="p-tcred", department="d-tcred", gpus=8))
        s.flush()
        credentials.create(s, vault, "p-tcred", {"name": "s3", "data": {"AWS_ACCESS_KEY_ID": CRED_KEY}}, "admin")
        credentials.create(s, vault, "p-tcred", {"name": "hf", "delivery": "files",
                                                 "data": {"token": CRED_TOKEN}}, "admin")
        datasources.create(s, "p-tcred", {"name": "corpus", "kind": "pvc", "claim": "corpus-ro"}, "admin")
        add_training(s, "alice", TrainingSpec(name="att", project="p-tcred", command=["python", "t.py"], gpu=1,
                                              workers=2, credentials=["s3", "hf"], datasources=["corpus"]))
        s.commit()
    secret_path = f"/api/v1/namespaces/{ns}/secrets/att-credentials"

    async def go():
        async with kube(k8s_cluster) as kc:
            ctl = KubernetesTrainings(kc, Session, ns, poll_s=0.2, vault=vault)
            ctl.start()
            try:
                async def both():
                    pods, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{L.TRAINING}=att")
                    return pods if len(pods) == 2 else None
                pods = await wait_until(both, "the gang's pods")
                secret = await kc.get(secret_path)
                await ctl.control("att", "delete")
                try:
                    await kc.get(secret_path)
                    after = "still there"
                except ApiError as e:
                    after = e.status
                return pods, secret, after
            finally:
                await ctl.stop()

    pods, secret, after = run(asyncio.wait_for(go(), 120))
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "s3.AWS_ACCESS_KEY_ID": CRED_KEY, "hf.token": CRED_TOKEN}
    for pod in pods:
        (ctr,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in ctr["env"]}
        assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "att-credentials",
                                                                        "key": "s3.AWS_ACCESS_KEY_ID"}
        assert env["GPUPOOL_CREDENTIALS_HF"]["value"] == "/var/run/gpupool/credentials/hf"
        assert env["GPUPOOL_DATA_CORPUS"]["value"] == "/data/corpus"
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vols["cred-hf"]["secret"]["secretName"] == "att-credentials"
        assert vols["cred-hf"]["secret"]["defaultMode"] == 0o400
        assert vols["data-corpus"]["persistentVolumeClaim"] == {"claimName": "corpus-ro", "readOnly": True}
        assert "checkpoints" in vols  # the job's own volumes stay
        mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
        assert mounts["data-corpus"] == "/data/corpus" and mounts["cred-hf"] == "/var/run/gpupool/credentials/hf"
        assert CRED_KEY not in str(pod) and CRED_TOKEN not in str(pod)
    assert after == 404, "the Secret outlived the job"
    with Session() as s:
        stages = sorted((r.target, r.details["stage"]) for r in s.scalars(
            select(AuditRow).where(AuditRow.action.like("%.used"))))
    assert stages == sorted((t, st) for st in ("attach", "deliver")
                            for t in ("p-tcred/s3", "p-tcred/hf", "p-tcred/corpus"))
