"""The maximum runtime of a project's policy on the local cluster: a training gang and a
command workload bound by gpupool-scheduler, past their kind's limit, are ended by the
culler's pass as in embedded mode: the gang suspended by its controller (its pods deleted,
the reason naming the policy), the command stopped and its pod deleted; a workspace whose
pod is bound past its limit is handed to the hub to stop (JupyterHub's stop is the
spawner's, tested with KubeSpawner elsewhere)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from hub_ext.backends.kubernetes_commands import LABEL, KubernetesCommands
from hub_ext.cluster.events import PodEvents
from hub_ext.db.tables import DepartmentRow, EventRow, PolicyRow, ProjectRow, WorkloadRow
from hub_ext.requests.rules import WorkloadRequest
from hub_ext.schema import make_sessionmaker
from hub_ext.service import culler
from hub_ext.training.db import TrainingRow, add_training
from hub_ext.training.kubernetes import KubernetesTrainings
from hub_ext.training.spec import TrainingSpec
from scheduler.contract import A, L
from scheduler.kubernetes.testcluster import ClusterInfo

from .helpers import create_org, delete_org, kube, make_pod, run, wait_until


class _NoWorkspaceStops:
    """The hub's API as the culler's pass reaches it: no call expected for these kinds."""

    async def stop_server(self, user: str, server: str):
        raise AssertionError(f"the culler asked the hub to stop {user}/{server}")


def test_workloads_past_their_maximum_runtime_are_ended(k8s_cluster: ClusterInfo, ns, sched, tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    with Session() as s:
        s.add(DepartmentRow(name="d-rt", gpus=32))
        s.add(ProjectRow(name="p-rt", department="d-rt", gpus=32))
        s.add(PolicyRow(scope="project", name="p-rt", spec={
            "max_runtime_training_s": 60, "max_runtime_inference_s": 60, "max_runtime_workspace_s": 60}))
        add_training(s, "alice", TrainingSpec(name="rt-gang", project="p-rt", command=["python", "t.py"], gpu=1,
                                              workers=2, grace_period_s=0))
        req = WorkloadRequest(project="p-rt", kind="inference", gpu_mode="whole", gpus=1, cpu=0.5, memory_gib=1,
                              command=["python", "serve.py"])
        s.add(WorkloadRow(name="rt-cmd", owner="alice", project="p-rt", kind="inference", spec=req.to_dict(),
                          state="pending", submit_time=time.time()))
        s.add(WorkloadRow(name="alice-rt", owner="alice", project="p-rt", kind="workspace", server="rt",
                          spec={}, state="pending", submit_time=time.time()))
        s.commit()
    api = f"/api/v1/namespaces/{ns}/pods"

    def rows() -> dict[str, WorkloadRow]:
        with Session() as s:
            return {w.name: w for w in s.query(WorkloadRow)}

    async def all_running():
        r = rows()
        return all(r[n].state == "running" and r[n].start_time for n in ("rt-gang", "rt-cmd", "alice-rt"))

    async def go():
        async with kube(k8s_cluster) as kc, kube(k8s_cluster) as hub_kc:
            await create_org(kc, "d-rt", 32, {"p-rt": {"gpus": 32}})
            trainings = KubernetesTrainings(hub_kc, Session, ns, poll_s=0.2)
            commands = KubernetesCommands(hub_kc, Session, ns, poll_s=0.2)
            events = asyncio.ensure_future(PodEvents(hub_kc, Session, ns).run())
            trainings.start()
            commands.start()
            try:
                await kc.post(api, make_pod("alice-rt-ws").ns(ns).project("p-rt").kind("workspace").gpus(1)
                              .annotate(A.WORKLOAD, "alice-rt").obj())
                await wait_until(all_running, "a gang, a command and a workspace running", timeout=120)
                ctx = SimpleNamespace(Session=Session, hub=_NoWorkspaceStops())
                ended: set[str] = set()
                # before the limit: nothing is ended
                await culler.end_over_runtime(ctx, time.time(), ended)
                assert not ended and rows()["rt-cmd"].state == "running"
                # past it (the pass's clock 61 s on): the gang and the command end
                with Session() as s:
                    to_stop = [culler.end(s, w, m, r, ended) for w, m, r in culler.over_runtime(s, time.time() + 61)]
                    s.commit()
                assert ("alice", "rt") in to_stop  # the workspace goes to the hub's stop

                async def ended_both():
                    with Session() as s:
                        t = s.get(TrainingRow, "rt-gang")
                        c = s.get(WorkloadRow, "rt-cmd")
                        seen.append((t.status, t.request, c.state))
                        return t.status == "Suspended" and c.state == "stopped"
                seen: list = []
                try:
                    await wait_until(ended_both, "the gang suspended and the command stopped", timeout=120)
                except AssertionError:
                    raise AssertionError(f"{seen[-1]}") from None
                gang, _ = await kc.list_all(api, labelSelector=f"{L.TRAINING}=rt-gang")
                cmd, _ = await kc.list_all(api, labelSelector=f"{LABEL}=rt-cmd")
                assert gang == [] and cmd == []
                with Session() as s:
                    t = s.get(TrainingRow, "rt-gang")
                    assert t.reason.startswith("reached the maximum runtime of a training (60 s")
                    stopped = {e.workload for e in s.query(EventRow).filter(EventRow.kind == "stopped")}
                    assert {"rt-gang", "rt-cmd", "alice-rt"} <= stopped
            finally:
                events.cancel()
                await trainings.stop()
                await commands.stop()
                await delete_org(kc, "d-rt", ["p-rt"])

    run(asyncio.wait_for(go(), 300))


def test_a_requeued_gang_runs_again_with_a_new_start(tmp_path):
    """The maximum runtime counts from the run's start: a gang that leaves ``running`` and
    comes back gets a new ``start_time`` (``KubernetesTrainings._set``)."""
    Session = make_sessionmaker(f"sqlite:///{tmp_path}/hub.db")
    with Session() as s:
        add_training(s, "alice", TrainingSpec(name="again", project="p", command=["x"], gpu=1))
        s.commit()
    ctl = KubernetesTrainings(None, Session, "ns")
    ctl._set("again", "Running", "1 worker(s) running", workload_state="running")
    with Session() as s:
        first = s.get(WorkloadRow, "again").start_time
    assert first
    ctl._set("again", "Running", "still", workload_state="running")
    with Session() as s:
        assert s.get(WorkloadRow, "again").start_time == first
    ctl._set("again", "Pending", "requeued", workload_state="pending")
    time.sleep(0.01)
    ctl._set("again", "Running", "again", workload_state="running")
    with Session() as s:
        assert s.get(WorkloadRow, "again").start_time > first
