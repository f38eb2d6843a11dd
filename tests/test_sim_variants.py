"""Trace variants for the placement experiment (``scheduler/sim/variants.py``): the same
seed draws the same pods, the shares asked for are the shares drawn, a bad setting is an
error naming its key, and a CI-sized slice of the openb trace drawn with a third of the GPU
pods naming a model places at least as much with gpupool as with FGD."""

from __future__ import annotations

import json

import pytest

from scheduler.model import ValidationError
from scheduler.placement.gpupool import GpupoolPolicy
from scheduler.sim import cli
from scheduler.sim.placement import run, run_seed
from scheduler.sim.trace import default_trace_dir, load_nodes, load_pods
from scheduler.sim.variants import TraceVariant, kind_of, reshape, shares_of

TRACES = default_trace_dir()
HAVE_TRACE = (TRACES / "openb_pod_list_default.csv").exists()
needs_trace = pytest.mark.skipif(not HAVE_TRACE, reason="no openb trace in data/openb-2023")


@pytest.fixture(scope="module")
def trace():
    return load_nodes(TRACES / "openb_node_list_gpu_node.csv"), load_pods(TRACES / "openb_pod_list_default.csv")


@needs_trace
def test_the_same_seed_draws_the_same_pods_and_another_seed_others(trace):
    nodes, pods = trace
    v = TraceVariant(model_share=0.3, multi_gpu_share=0.08, fraction_share=0.5)
    a, b = reshape(pods, nodes, v, 7), reshape(pods, nodes, v, 7)
    assert a == b
    c = reshape(pods, nodes, v, 8)
    assert c != a
    # The variant's own seed wins over the run's.
    seeded = TraceVariant(model_share=0.3, seed=3)
    assert reshape(pods, nodes, seeded, 1) == reshape(pods, nodes, seeded, 2)


@needs_trace
@pytest.mark.parametrize("weight", ["uniform", "gpus"])
def test_the_shares_asked_for_are_the_shares_drawn(trace, weight):
    nodes, pods = trace
    v = TraceVariant(model_share=2 / 3, multi_gpu_share=0.1, fraction_share=0.6, model_weight=weight)
    out = reshape(pods, nodes, v, 42)
    n_gpu = sum(1 for p in pods if kind_of(p) != "cpu")
    assert len(out) == len(pods)
    assert sum(1 for p in out if kind_of(p) == "cpu") == len(pods) - n_gpu  # CPU-only pods kept
    assert sorted(p.name for p in out if kind_of(p) == "cpu") == sorted(p.name for p in pods if kind_of(p) == "cpu")
    kinds = [kind_of(p) for p in out]
    assert kinds.count("multi") == round(0.1 * n_gpu)
    assert kinds.count("fraction") == round(0.6 * n_gpu)
    assert sum(1 for p in out if p.gpu_models) == round(2 / 3 * n_gpu)
    assert len({p.name for p in out}) == len(out)  # drawn twice: a name of its own
    # Every model named is one the cluster has, on a node that could hold the pod.
    hosts: dict[str, list] = {}
    for n in nodes:
        hosts.setdefault(n.gpus[0].model, []).append(n)
    for p in out:
        if p.gpu_models:
            (m,) = p.gpu_models
            assert any(len(n.gpus) >= p.num_gpu and n.cpu_milli >= p.cpu_milli and n.memory_mib >= p.memory_mib
                       for n in hosts[m])
    # Drawn from the trace's own pods of each kind.
    source = {(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) for p in pods}
    assert all((p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) in source for p in out)
    if weight == "uniform":  # the scarce models are named about as often as the common ones
        named = [p.gpu_models[0] for p in out if p.gpu_models and p.num_gpu == 1]
        assert min(named.count(m) for m in ("V100M32", "G2", "T4")) > 0.5 * max(named.count(m) for m in ("V100M32", "G2", "T4"))


@needs_trace
def test_a_share_left_out_keeps_the_traces(trace):
    nodes, pods = trace
    out = reshape(pods, nodes, TraceVariant(model_share=0.5), 1)
    before, after = shares_of(pods), shares_of(out)
    assert after["multi_gpu_share"] == before["multi_gpu_share"]
    assert after["fraction_share"] == before["fraction_share"]
    assert sorted(p.name for p in out) == sorted(p.name for p in pods)  # the same pods, some naming a model
    assert abs(after["model_share"] - 0.5) < 1e-3


@pytest.mark.parametrize(
    "data, key",
    [
        ({"model_share": 1.5}, "variant.model_share"),
        ({"multi_gpu_share": -0.1}, "variant.multi_gpu_share"),
        ({"fraction_share": "half"}, "variant.fraction_share"),
        ({"fraction_share": True}, "variant.fraction_share"),
        ({"fraction_share": 0.7, "multi_gpu_share": 0.4}, "variant.fraction_share"),
        ({"seed": -1}, "variant.seed"),
        ({"model_weight": "size"}, "variant.model_weight"),
        ({"model_shares": 0.3}, "variant.model_shares"),
    ],
)
def test_a_bad_setting_is_an_error_naming_its_key(data, key):
    with pytest.raises(ValidationError) as e:
        TraceVariant.from_dict(data)
    assert e.value.field == key and str(e.value).startswith(key)


@pytest.mark.parametrize(
    "text, key",
    [("model_share", "variant.model_share"), ("model_share=x", "variant.model_share"), ("seed=1.5", "variant.seed")],
)
def test_the_command_line_spelling_names_a_bad_key(text, key):
    with pytest.raises(ValidationError) as e:
        TraceVariant.parse(text)
    assert e.value.field == key


def test_a_kind_the_trace_lacks_is_an_error_naming_its_share(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,4000,8192,1,1000,\np2,4000,8192,1,500,\n")
    with pytest.raises(ValidationError) as e:
        reshape(load_pods(pods), load_nodes(nodes), TraceVariant(multi_gpu_share=0.5), 1)
    assert e.value.field == "variant.multi_gpu_share"
    with pytest.raises(SystemExit) as cli_error:
        cli.main(["placement", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--variant", "multi_gpu_share=2"])
    assert "variant.multi_gpu_share" in str(cli_error.value.code)


@needs_trace
def test_cli_places_a_variant_and_says_which(capsys):
    rc = cli.main(["placement", "--policy", "gpupool", "--seeds", "1", "--max-nodes", "120", "--max-pods", "800",
                   "--variant", "model_share=0.5,fraction_share=0.4", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["variant"]["model_share"] == 0.5 and out["variant"]["seed"] is None
    assert 0 < out["allocation_pct"] <= 100


@needs_trace
def test_models_are_honoured_in_a_variant(trace):
    nodes, pods = trace
    nodes = nodes[:200]
    model_of = {n.name: n.gpus[0].model for n in nodes}
    bad = []

    def check(arrays, pod, choice):
        if pod.gpu_models and model_of[arrays.names[choice.node]] not in pod.gpu_models:
            bad.append(pod.name)

    r = run_seed(nodes, reshape(pods[:1500], nodes, TraceVariant(model_share=0.5), 3), "gpupool", 3, on_place=check)
    assert not bad and r.placed_milli > 0


@needs_trace
def test_gpupool_keeps_up_with_fgd_where_a_third_of_the_pods_name_a_model(trace, monkeypatch):
    """A CI-sized variant check: the first 300 nodes and 2,500 pods of openb, a third of the
    GPU pods naming a model, 2 seeds. gpupool places at least FGD's, and the scarce-model
    rule is what gets it there (without it, it places less)."""
    nodes, pods = trace
    nodes, pods = nodes[:300], pods[:2500]
    v = TraceVariant(model_share=1 / 3)
    fgd = run(nodes, pods, "fgd", [1, 2], variant=v).allocation_pct
    gpupool = run(nodes, pods, "gpupool", [1, 2], variant=v).allocation_pct
    monkeypatch.setattr(GpupoolPolicy, "KEEP_OFF_MAX", 0.0)
    without = run(nodes, pods, "gpupool", [1, 2], variant=v).allocation_pct
    assert gpupool >= fgd, (gpupool, fgd)
    assert gpupool > without, (gpupool, without)
