"""The request rules shared by the spawn form, the REST API and the CLI."""

import dataclasses

import pytest

from hub_ext.requests.rules import FieldError, Limits, parse_request, workload_name
from hub_ext.training.spec import parse_training
from scheduler.model import DEFAULT_POOL, Project, Quota

LIMITS = Limits(projects=("nlp", "vision"), max_gpus=4, gpu_memory_gib=79.6, vscode=True)


@pytest.mark.parametrize(
    "data, field",
    [
        pytest.param({"project": "nope"}, "project", id="not-a-member"),
        pytest.param({"gpu_fraction": "0.07"}, "gpu_fraction", id="fraction-off-step"),
        pytest.param({"gpu_fraction": 0.0}, "gpu_fraction", id="fraction-zero"),
        pytest.param({"gpu_fraction": 1.05}, "gpu_fraction", id="fraction-above-one"),
        pytest.param({"gpu_fraction": "abc"}, "gpu_fraction", id="fraction-not-a-number"),
        pytest.param({"gpu_fraction": "nan"}, "gpu_fraction", id="fraction-nan"),
        pytest.param({"gpu_mode": "whole", "gpus": 5}, "gpus", id="gpus-above-node"),
        pytest.param({"gpu_mode": "whole", "gpus": 1.5}, "gpus", id="gpus-not-whole"),
        pytest.param({"gpu_mode": "memory", "gpu_memory_gib": 100}, "gpu_memory_gib", id="memory-too-big"),
        pytest.param({"gpu_mode": "bogus"}, "gpu_mode", id="bad-mode"),
        pytest.param({"cpu": 0}, "cpu", id="cpu-zero"),
        pytest.param({"memory_gib": 1e9}, "memory_gib", id="memory-huge"),
        pytest.param({"workspace_kind": "emacs"}, "workspace_kind", id="bad-workspace-kind"),
        pytest.param({"environment": "x"}, "environment", id="bad-environment"),
        pytest.param({"kind": "training"}, "command", id="training-needs-command"),
        pytest.param({"kind": "inference", "command": ["x"], "preemptible": True}, "preemptible", id="inference-preemptible"),
        pytest.param({"preemptible": "maybe"}, "preemptible", id="bad-bool"),
        pytest.param({"colour": "red"}, "colour", id="unknown-field"),
        pytest.param({"kind": "training", "command": ["x"], "name": "Bad_Name"}, "name", id="bad-name"),
    ],
)
def test_bad_input_names_the_field(data, field):
    with pytest.raises(FieldError) as e:
        parse_request(data, LIMITS)
    assert e.value.field == field
    assert field in str(e.value)


def test_form_data_lists_of_strings():
    req = parse_request({"project": ["vision"], "gpu_fraction": ["0.35"], "preemptible": ["true"]}, LIMITS)
    assert (req.project, req.gpu_fraction, req.preemptible) == ("vision", 0.35, True)
    assert req.demand().gpu_fraction == 0.35


def test_whole_gpu_fraction_is_one_gpu_and_memory_mode():
    assert parse_request({"gpu_fraction": 1}, LIMITS).demand().gpus == 1
    d = parse_request({"gpu_mode": "memory", "gpu_memory_gib": 20}, LIMITS).demand()
    assert d.gpu_memory_mib == 20 * 1024


def test_no_project_membership():
    with pytest.raises(FieldError, match="not a member of any project"):
        parse_request({}, Limits(projects=()))


def test_vscode_only_when_installed():
    with pytest.raises(FieldError):
        parse_request({"workspace_kind": "vscode"}, Limits(projects=("a",), vscode=False))


def test_workload_names():
    assert workload_name("Alice.B", "") == "ws-alice-b"
    assert workload_name("bob", "gpu1") == "ws-bob-gpu1"


# -- requests that can never run (requests.check_can_run) -------------------------------------
ORG = Limits(
    projects=("nlp", "ops"), max_gpus=4, gpu_memory_gib=80.0, cluster_gpus=8,
    quotas={"nlp": (Project("nlp", "research", {DEFAULT_POOL: Quota(1, 1.0, 3)}), {DEFAULT_POOL: Quota(3, 1.0, None)}),
            "ops": (Project("ops", "infra", {DEFAULT_POOL: Quota(2, 1.0, None)}), {DEFAULT_POOL: Quota(2, 1.0, 2)})},
)


@pytest.mark.parametrize(
    "data, field, message",
    [
        pytest.param({"project": "nlp", "gpu_mode": "whole", "gpus": 4, "preemptible": True}, "gpus",
                     "project nlp allows at most 3 GPUs (limit), got 4", id="project-limit"),
        pytest.param({"project": "ops", "gpu_mode": "whole", "gpus": 3, "preemptible": True}, "gpus",
                     "department infra allows at most 2 GPUs (limit), got 3", id="department-limit"),
        pytest.param({"project": "nlp", "gpu_mode": "whole", "gpus": 2}, "gpus",
                     "project nlp allows at most 1 GPU (quota) to work that may not go over quota, got 2",
                     id="guaranteed-over-project-quota"),
        pytest.param({"project": "nlp", "kind": "inference", "command": ["x"], "gpu_mode": "whole", "gpus": 2},
                     "gpus", "project nlp allows at most 1 GPU (quota)", id="inference-over-quota"),
        pytest.param({"project": "nlp", "gpu_mode": "whole", "gpus": 5, "preemptible": True}, "gpus",
                     "must be from 1 to 4 (GPUs of the largest node), got 5", id="largest-node"),
    ],
)
def test_a_request_that_can_never_run_is_refused(data, field, message):
    with pytest.raises(FieldError) as e:
        parse_request(data, ORG)
    assert e.value.field == field and message in str(e.value), str(e.value)


def test_what_can_run_passes_the_ceilings():
    assert parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 3, "preemptible": True}, ORG).gpus == 3
    assert parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 1}, ORG).gpus == 1
    # GPU memory counts as the least share it can be: 40 GiB of the largest 80 GiB GPU
    assert parse_request({"project": "nlp", "gpu_mode": "memory", "gpu_memory_gib": 40}, ORG).gpu_memory_gib == 40


def test_a_gang_larger_than_the_cluster_names_the_workers():
    spec = {"name": "big", "project": "nlp", "command": ["x"], "gpu": 4, "workers": 3}
    with pytest.raises(FieldError) as e:
        parse_training(spec, ORG)
    assert e.value.field == "workers" and "the cluster has 8 GPUs in all, got 12 (3 workers x 4)" in str(e.value)
    with pytest.raises(FieldError) as e:
        parse_training({**spec, "workers": 2, "gpu": 2}, ORG)
    assert e.value.field == "gpu" and "project nlp allows at most 3 GPUs (limit), got 4 (2 workers x 2)" in str(e.value)


# nlp: 1 GPU in the default pool (limit 3); in pool fast 2 GPUs, limit 2, department 2 (limit 4)
POOLS = Limits(
    projects=("nlp",), max_gpus=4, gpu_memory_gib=80.0, cluster_gpus=12, node_pools=(DEFAULT_POOL, "fast"),
    pool_gpus={DEFAULT_POOL: 8, "fast": 4},
    quotas={"nlp": (Project("nlp", "research", {DEFAULT_POOL: Quota(1, 1.0, 3), "fast": Quota(2, 1.0, 2)}),
                    {DEFAULT_POOL: Quota(3, 1.0, None), "fast": Quota(2, 1.0, 4)})},
)


@pytest.mark.parametrize(
    "data, field, message",
    [
        pytest.param({"gpus": 3, "preemptible": True}, "gpus",
                     "project nlp allows at most 2 GPUs in pool fast (limit), got 3", id="pool-limit"),
        pytest.param({"gpus": 3}, "gpus", "project nlp allows at most 2 GPUs in pool fast (limit), got 3",
                     id="pool-limit-guaranteed"),
        pytest.param({"gpu_mode": "memory", "gpu_memory_gib": 8, "cpu": 4}, "cpu",
                     "project nlp's CPU quota in pool fast is 2 CPUs, got 4", id="pool-cpu-quota"),
    ],
)
def test_a_request_beyond_its_pool_is_refused_naming_the_pool(data, field, message):
    limits = POOLS
    if field == "cpu":
        p, dq = POOLS.quotas["nlp"]
        fast = Project("nlp", "research", {**p.quotas, "fast": Quota(2, 1.0, 2, cpu=2)})
        limits = dataclasses.replace(POOLS, quotas={"nlp": (fast, dq)})
    with pytest.raises(FieldError) as e:
        parse_request({"project": "nlp", "gpu_mode": "whole", "node_pool": "fast", **data}, limits)
    assert e.value.field == field and message in str(e.value), str(e.value)


def test_a_request_in_a_pool_within_its_quota_runs_and_the_default_pool_keeps_its_own():
    assert parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 2, "node_pool": "fast"}, POOLS).gpus == 2
    # the default pool names any pool (store.to_workload): refused only where no pool takes it
    assert parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 3, "preemptible": True}, POOLS).gpus == 3
    with pytest.raises(FieldError, match="gpus: project nlp allows at most 3 GPUs \\(limit\\), got 4"):
        parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 4, "preemptible": True}, POOLS)
    # a training naming no pool: the same
    spec = {"name": "t", "project": "nlp", "command": ["x"], "gpu": 2, "preemptible": False}
    assert parse_training(spec, POOLS).gpu == 2
    with pytest.raises(FieldError, match="gpu: project nlp allows at most 2 GPUs in pool fast"):
        parse_training({**spec, "node_pool": "fast", "gpu": 1, "workers": 3}, POOLS)


def test_a_request_beyond_its_pools_gpus_names_the_pool():
    limits = dataclasses.replace(POOLS, pool_gpus={DEFAULT_POOL: 8, "fast": 2})
    with pytest.raises(FieldError, match="gpus: node pool fast has 2 GPUs in all, got 3"):
        parse_request({"project": "nlp", "gpu_mode": "whole", "gpus": 3, "node_pool": "fast",
                       "preemptible": True}, limits)


def test_no_gpu_in_the_cluster():
    limits = Limits(projects=("a",), max_gpus=0, cluster_gpus=0)
    with pytest.raises(FieldError, match="gpu_fraction: the cluster has 0 GPUs in all, got 1"):
        parse_request({"gpu_fraction": 0.5}, limits)
    assert parse_request({"gpu_mode": "none"}, limits).gpu_mode == "none"
