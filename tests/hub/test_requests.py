"""The request rules shared by the spawn form, the REST API and the CLI."""

import pytest

from hub_ext.requests import FieldError, Limits, parse_request, workload_name

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
