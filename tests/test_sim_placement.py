"""The placement simulator on a small synthetic openb-format trace (no shared data needed),
plus a short slice of the real trace from ``data/openb-2023``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler.model import MILLI
from scheduler.placement import POLICIES
from scheduler.sim import cli
from scheduler.sim.placement import run, run_seed
from scheduler.sim.trace import by_creation, load_nodes, load_pods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


@pytest.fixture()
def small_trace(tmp_path):
    rng = np.random.default_rng(0)
    nodes = tmp_path / "nodes.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(30):
        model, gpus, cpu = [("G2", 8, 96000), ("T4", 2, 104000), ("P100", 2, 16000)][i % 3]
        rows.append(f"node-{i:03d},{cpu},262144,{gpus},{model}")
    rows.append("node-cpu,32000,262144,0,")
    nodes.write_text("\n".join(rows) + "\n")
    pods = tmp_path / "pods.csv"
    lines = [POD_HEADER]
    shapes = [(12000, 1, 1000, ""), (4000, 1, 500, ""), (6000, 1, 250, "T4"), (8000, 0, 0, ""), (48000, 4, 1000, ""), (6000, 1, 1000, "P100|T4")]
    for i in range(300):
        cpu, n, milli, spec = shapes[int(rng.integers(len(shapes)))]
        lines.append(f"pod-{i:04d},{cpu},8192,{n},{milli},{spec},LS,Running,{int(rng.integers(0, 10**6))},,\n")
    pods.write_text("".join(lines))
    return nodes, pods


def test_loader(small_trace):
    nodes_csv, pods_csv = small_trace
    nodes = load_nodes(nodes_csv)
    assert len(nodes) == 31 and len(nodes[0].gpus) == 8 and nodes[-1].gpus == []
    pods = load_pods(pods_csv)
    assert len(pods) == 300
    p = next(p for p in pods if p.gpu_models == ("P100", "T4"))
    assert p.demand.gpus == 1
    frac = next(p for p in pods if p.gpu_milli == 250)
    assert frac.demand.gpu_fraction == 0.25 and frac.gpu_request_milli == 250
    times = [p.creation_time for p in by_creation(pods)]
    assert times == sorted(times)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_replay_invariants_and_determinism(small_trace, policy):
    nodes_csv, pods_csv = small_trace
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    model_of = {n.name: (n.gpus[0].model if n.gpus else "") for n in nodes}

    def check(arrays, pod, choice):
        assert (arrays.gpu_free[arrays.gpu_free >= 0] >= 0).all()
        assert (arrays.gpu_free <= MILLI).all() and (arrays.cpu_free >= 0).all() and (arrays.mem_free >= 0).all()
        if pod.gpu_models and pod.num_gpu:
            assert model_of[arrays.names[choice.node]] in pod.gpu_models
        assert len(choice.gpus) == (pod.num_gpu if pod.gpu_milli else 0)

    a = run_seed(nodes, pods, policy, 5, on_place=check)
    b = run_seed(nodes, pods, policy, 5)
    assert (a.placed_milli, a.failed_pods, a.arrived_pods) == (b.placed_milli, b.failed_pods, b.arrived_pods)
    assert a.arrived_milli <= a.capacity_milli and 0 < a.allocation_pct <= 100.0 * a.arrived_milli / a.capacity_milli


def test_inflation_stops_at_capacity(small_trace):
    nodes_csv, pods_csv = small_trace
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)[:20]
    r = run(nodes, pods, "bestfit", [1, 2])
    for s in r.per_seed:
        assert s.inflation_pods > 0  # 20 pods are far below capacity: inflation filled it
        assert s.capacity_milli - s.arrived_milli < 4 * MILLI + 1  # stopped at the first pod that would not fit
    assert r.seeds == 2


def test_cli_json(small_trace, capsys):
    nodes_csv, pods_csv = small_trace
    rc = cli.main(["placement", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "gpupool", "--seeds", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("policy", "seeds", "allocation_pct", "unallocated_gpus"):
        assert key in out
    assert out["policy"] == "gpupool" and out["seeds"] == 1


TRACES = cli.default_trace_dir()


@pytest.mark.skipif(not (TRACES / "openb_pod_list_gpuspec20.csv").exists(), reason="no openb trace in data/openb-2023")
def test_real_trace_slice_honours_gpu_spec():
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")[:150]
    pods = [p for p in load_pods(TRACES / "openb_pod_list_gpuspec20.csv")][:400]
    model_of = {n.name: (n.gpus[0].model if n.gpus else "") for n in nodes}
    bad = []

    def check(arrays, pod, choice):
        if pod.gpu_models and pod.num_gpu and model_of[arrays.names[choice.node]] not in pod.gpu_models:
            bad.append(pod.name)

    r = run_seed(nodes, pods, "gpupool", 42, on_place=check)
    assert not bad and r.placed_milli > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["placement", "--seeds", "-1"], "argument --seeds: must be an integer >= 1, got '-1'"),
        (["placement", "--seeds", "ten"], "argument --seeds: must be an integer >= 1, got 'ten'"),
        (["placement", "--max-pods", "-3"], "argument --max-pods: must be an integer >= 0"),
        (["replay", "--placement", "nope"], "argument --placement: invalid choice: 'nope'"),
    ],
)
def test_cli_bad_numbers_and_names_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
