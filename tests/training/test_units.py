"""Units of the training feature: the checkpoint library, the gang environment, the
Kubernetes manifests, and the runner's restart policy and backoff limit."""

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

from gpupool.checkpoint import Checkpointer, CheckpointError, latest_step
from hub_ext.training.gang import gang_env, ranks
from hub_ext.training.pods import KubernetesOptions, training_objects
from hub_ext.training.spec import TrainingSpec
from scheduler.kubernetes.objects import parse_pod
from scheduler.model import PodPlacement

from .harness import Cluster

# -- gpupool.checkpoint ----------------------------------------------------------------


class Model:
    """Stands in for a torch module: state_dict()/load_state_dict()."""

    def __init__(self):
        self.w = [0.0, 0.0]

    def state_dict(self):
        return {"w": list(self.w)}

    def load_state_dict(self, d):
        self.w = list(d["w"])


def test_checkpoint_roundtrip_in_place_and_keep(tmp_path):
    state, hist, model = {"step": 0, "lr": 0.1}, [1, 2], Model()
    ck = Checkpointer(tmp_path, every=5, keep=2, handle_sigterm=False)
    ck.register("state", state)
    ck.register("hist", hist)
    ck.register("model", model)
    counter = {"n": 0}
    ck.register("counter", get=lambda: counter["n"], set=lambda v: counter.update(n=v))
    assert ck.restore() == 0
    for step in range(1, 16):
        state["step"], model.w, counter["n"] = step, [step, -step], step * 10
        hist.append(step)
        ck.step(step)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000010.pkl", "ckpt-000000015.pkl", "latest.json"]
    assert latest_step(tmp_path) == 15
    state2, hist2, model2, c2 = {}, [], Model(), {"n": 0}
    ck2 = Checkpointer(tmp_path, handle_sigterm=False)
    ck2.register("state", state2)
    ck2.register("hist", hist2)
    ck2.register("model", model2)
    ck2.register("counter", get=lambda: c2["n"], set=lambda v: c2.update(n=v))
    assert ck2.restore() == 15
    assert state2 == {"step": 15, "lr": 0.1} and hist2 == hist and model2.w == [15, -15] and c2["n"] == 150


def test_checkpoint_numpy_and_rng(tmp_path):
    np = pytest.importorskip("numpy")
    w, rng = np.zeros(3), np.random.default_rng(1)
    ck = Checkpointer(tmp_path, every=1, handle_sigterm=False)
    ck.register("w", w)
    ck.register("rng", rng)
    ck.register_rng()
    w += 1.5
    ck.step(1)
    expected = (rng.random(), np.random.rand())
    w[:] = 0
    rng.random()
    np.random.rand()
    assert ck.restore() == 1 and list(w) == [1.5, 1.5, 1.5]
    assert (rng.random(), np.random.rand()) == expected


def test_a_torn_or_damaged_file_is_skipped(tmp_path):
    ck = Checkpointer(tmp_path, every=1, keep=3, handle_sigterm=False)
    state = {"v": 0}
    ck.register("s", state)
    for step in (1, 2):
        state["v"] = step
        ck.step(step)
    (tmp_path / "ckpt-000000002.pkl").write_bytes(pickle.dumps({"step": 2})[:5])  # torn
    (tmp_path / ".ckpt-000000003.pkl.abc.tmp").write_bytes(b"partial")  # never renamed
    state.clear()
    assert ck.restore() == 1 and state == {"v": 1}


def test_checkpoint_bad_input():
    with pytest.raises(CheckpointError, match="every"):
        Checkpointer("x", every=0, handle_sigterm=False)
    ck = Checkpointer("x", handle_sigterm=False)
    with pytest.raises(CheckpointError, match="cannot checkpoint a int"):
        ck.register("n", 3)
    ck.register("d", {})
    with pytest.raises(CheckpointError, match="registered twice"):
        ck.register("d", {})


def test_sigterm_saves_at_the_next_step_and_exits_143(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from gpupool.checkpoint import Checkpointer
        state = {"step": 0}
        ck = Checkpointer(sys.argv[1], every=1000)
        ck.register("state", state)
        for step in range(ck.restore(), 10**6):
            state["step"] = step + 1
            if step == 3:
                print("ready", flush=True)
            time.sleep(0.01)
            ck.step(step + 1)
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143
    step = latest_step(tmp_path)
    assert step is not None and step >= 4
    with open(tmp_path / f"ckpt-{step:09d}.pkl", "rb") as f:
        assert pickle.load(f)["state"]["state"]["step"] == step


def test_checkpoint_imports_with_the_standard_library_only(tmp_path):
    code = ("import sys; import gpupool.checkpoint; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'torch', 'hub_ext', 'scheduler', 'sqlalchemy', 'jupyterhub', 'ipywidgets')]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": os.getcwd()}, check=True)
    assert out.stdout.strip() == "[]"


# -- the gang's environment --------------------------------------------------------------


def test_gang_env_ranks_across_nodes():
    pods = [PodPlacement("a", (0,), 1000), PodPlacement("a", (1,), 1000), PodPlacement("b", (0,), 1000)]
    assert ranks(pods) == [(0, 0, 2), (0, 1, 2), (1, 0, 1)]
    envs = gang_env(pods, "127.0.0.1", 29500, restart_count=2, run_id="j-3")
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [(e["NODE_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"), ("0", "1", "2"), ("1", "0", "1")]
    assert all(e["WORLD_SIZE"] == "3" and e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "29500"
               and e["TORCHELASTIC_RESTART_COUNT"] == "2" for e in envs)


# -- Kubernetes manifests ------------------------------------------------------------------


def test_kubernetes_objects_for_a_fractional_gang():
    spec = TrainingSpec(name="bert", project="nlp", command=["python", "train.py"], gpu=0.5, workers=2,
                        grace_period_s=90, image="pytorch/pytorch:2.4", env={"SEED": "1"})
    svc, pod0, pod1 = training_objects(spec, KubernetesOptions(namespace="team", checkpoint_claim="ckpt"))
    assert svc == {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bert", "namespace": "team",
                     "labels": {"gpupool.io/training": "bert", "gpupool.io/project": "nlp"}},
        "spec": {"clusterIP": "None", "selector": {"gpupool.io/training": "bert"},
                 "publishNotReadyAddresses": True,
                 "ports": [{"name": "dist", "port": 29500, "targetPort": 29500}]},
    }
    assert pod1["metadata"]["annotations"] == {
        "gpupool.io/project": "nlp", "gpupool.io/kind": "training", "gpupool.io/priority": "50",
        "gpupool.io/preemptible": "true", "gpupool.io/gang": "bert", "gpupool.io/gang-size": "2",
        "gpupool.io/gpu-fraction": "0.5", "gpupool.io/config-map": "bert-1-gpupool",
        "gpupool.io/workload": "bert",
    }
    s = pod1["spec"]
    assert (s["hostname"], s["subdomain"], s["schedulerName"], s["restartPolicy"],
            s["terminationGracePeriodSeconds"]) == ("bert-1", "bert", "gpupool", "Never", 90)
    c = s["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MASTER_ADDR"] == "bert-0.bert.team.svc" and env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["NODE_RANK"] == "1" and env["LOCAL_RANK"] == "0" and env["SEED"] == "1"
    assert env["GPUPOOL_CHECKPOINT_DIR"] == "/checkpoints"
    assert c["envFrom"] == [{"configMapRef": {"name": "bert-1-gpupool", "optional": False}}]
    assert env["LD_PRELOAD"] == "/usr/local/lib/gpupool/libgpupool.so"
    assert env["GPUPOOL_SHARED_REGION"] == "/var/run/gpupool/region/account"
    assert c["volumeMounts"] == [
        {"name": "gpupool-preload", "mountPath": "/usr/local/lib/gpupool", "readOnly": True},
        {"name": "gpupool-region", "mountPath": "/var/run/gpupool/region"},
        {"name": "checkpoints", "mountPath": "/checkpoints"}]
    assert s["volumes"] == [
        {"name": "gpupool-preload", "hostPath": {"path": "/var/lib/gpupool/lib", "type": "DirectoryOrCreate"}},
        {"name": "gpupool-region", "emptyDir": {}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    # the scheduler's adapter reads them as one gang of two half-GPU pods
    for pod in (pod0, pod1):
        req = parse_pod(pod)
        assert (req.workload, req.gang_size, req.demand.gpu_fraction, req.priority) == ("team/gang/bert", 2, 0.5, 50)


def test_kubernetes_whole_gpus_and_raised_priority():
    spec = TrainingSpec(name="big", project="cv", command=["torchrun", "x.py"], gpu=4, preemptible=False)
    pod = training_objects(spec, KubernetesOptions(priority=51))[1]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "envFrom" not in pod["spec"]["containers"][0]
    req = parse_pod(pod)
    assert (req.demand.gpus, req.priority, req.preemptible) == (4, 51, False)


def test_kubernetes_pods_of_a_requeued_job_are_marked_resumed():
    spec = TrainingSpec(name="big", project="cv", command=["torchrun", "x.py"], gpu=1, workers=2)
    fresh = training_objects(spec)[1:]
    again = training_objects(spec, KubernetesOptions(priority=51, resumed=True))[1:]
    assert [parse_pod(p).resumed for p in fresh] == [False, False]
    assert "gpupool.io/resumed" not in fresh[0]["metadata"]["annotations"]
    assert [p["metadata"]["annotations"]["gpupool.io/resumed"] for p in again] == ["true", "true"]
    assert [parse_pod(p).resumed for p in again] == [True, True]


# -- restart policy and backoff limit ------------------------------------------------------

FLAKY = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["RANK"])
    with open(f"starts-{rank}", "a") as f:
        f.write(os.environ["GPUPOOL_ATTEMPT"] + "\\n")
    if rank == 1:
        # fail only once worker 0 is up in this attempt, so the test sees both start
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists("starts-0") and os.environ["GPUPOOL_ATTEMPT"] in open("starts-0").read().split():
                break
            time.sleep(0.01)
        sys.exit(3)   # one worker fails; the other would run on
    time.sleep(60)
""")


@pytest.mark.parametrize("policy, limit, starts, failures", [("OnFailure", 2, 3, 3), ("Never", 2, 1, 1)])
def test_a_failed_worker_restarts_the_whole_gang_up_to_the_backoff_limit(tmp_path, policy, limit, starts,
                                                                         failures):
    async def run():
        async with Cluster(tmp_path, gpus=2) as c:
            c.submit("flaky", "research", [sys.executable, "-c", FLAKY], gpu=1, workers=2,
                     restart_policy=policy, backoff_limit=limit, backoff_s=0.05, grace_period_s=5)
            t = await c.wait_for("flaky", "Failed", timeout=120)
            workdir = c.runner.workdir("flaky", c.account())  # the account's: read before it goes
            return t, c.events("flaky"), [(workdir / f"starts-{rank}").read_text() for rank in (0, 1)]

    t, events, starts_of = asyncio.run(run())
    assert t.failures == failures and t.attempt == starts
    assert "worker 1 ended: exit code 3" in t.reason
    assert ("exited", "flaky worker 1 ended: exit code 3") in events
    assert ("backoff limit 2 reached" if policy == "OnFailure" else "restart policy Never") in t.reason
    # both workers started every attempt: the whole gang restarts
    for rank in (0, 1):
        assert starts_of[rank].split() == [str(i) for i in range(1, starts + 1)]
    assert sum(1 for k, _ in events if k == "restarting") == starts - 1


def test_a_gang_larger_than_the_cluster_fails_with_a_reason(tmp_path):
    async def run():
        async with Cluster(tmp_path, gpus=1) as c:
            c.submit("huge", "research", ["true"], gpu=1, workers=2)
            return await c.wait_for("huge", "Failed")

    t = asyncio.run(run())
    assert "the gang needs 2 GPUs and the whole cluster has 1" in t.reason


def test_training_spec_json_roundtrip():
    spec = TrainingSpec(name="a", project="p", command=["x"], gpu=0.25)
    assert TrainingSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
