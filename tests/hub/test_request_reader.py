"""One spelling of the GPU ask for workspaces, trainings and inference services, read by one
reader (hub_ext/requests/reader.py): the same fields, the same range errors, the same order
of defaults, template and policy; the older spellings still read, with a note."""

import pytest

from hub_ext.org.policy import Effective
from hub_ext.requests.rules import FieldError, Limits, WorkloadRequest, parse_request
from hub_ext.requests.store import to_workload
from hub_ext.serving.spec import parse_spec
from hub_ext.training.spec import parse_training

KINDS = ("workspace", "training", "inference")
POLICY = "project p's policy"


def limits(policy: dict | None = None, templates: dict | None = None) -> Limits:
    return Limits(projects=("p",), max_gpus=4, policies={"p": Effective(
        {k: (v, POLICY) for k, v in (policy or {}).items()})}, templates=templates or {})


def ask(kind: str, body: dict, lim: Limits | None = None, notes: list | None = None) -> float:
    """The GPU a request of ``kind`` gets, as one number (below 1 a fraction, whole GPUs
    from 1, 0 none)."""
    lim = lim or limits()
    if kind == "workspace":
        req = parse_request({"project": "p", **body}, lim, notes)
        return {"fraction": req.gpu_fraction, "whole": float(req.gpus), "memory": -req.gpu_memory_gib,
                "none": 0.0}[req.gpu_mode]
    if kind == "training":
        spec = parse_training({"name": "t", "command": ["x"], "project": "p", **body}, lim, notes)
        return -spec.gpu_memory_gib if spec.gpu_memory_gib else spec.gpu
    return parse_spec({"name": "s", "project": "p", "command": ["x"], **body}, lim.projects, lim, notes).gpu


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("body, gpu", [
    ({"gpu_fraction": 0.5}, 0.5),
    ({"gpu_mode": "fraction", "gpu_fraction": "0.75"}, 0.75),
    ({"gpus": 2}, 2.0),
    ({"gpu_mode": "whole", "gpus": 3}, 3.0),
])
def test_the_one_spelling_works_for_every_kind(kind, body, gpu):
    notes: list[str] = []
    assert ask(kind, body, notes=notes) == gpu
    assert notes == []


@pytest.mark.parametrize("kind", ("workspace", "training"))
def test_gpu_memory_and_no_gpu_for_the_kinds_that_take_them(kind):
    assert ask(kind, {"gpu_memory_gib": 20}) == -20
    assert ask(kind, {"gpu_mode": "none"}) == 0


def test_a_service_takes_a_fraction_or_whole_gpus():
    with pytest.raises(FieldError, match="gpu_mode: must be one of fraction, whole, got 'memory'"):
        ask("inference", {"gpu_mode": "memory"})
    with pytest.raises(FieldError, match="gpu_memory_gib: unknown field"):
        ask("inference", {"gpu_memory_gib": 20})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("old, new", [
    ({"gpu": 0.5}, {"gpu_fraction": 0.5}),
    ({"gpu": 2}, {"gpus": 2}),
    ({"gpu_memory": "20GiB"}, {"gpu_memory_gib": 20}),
    ({"gpu": 0}, {"gpu_mode": "none"}),
])
def test_each_older_spelling_still_works_and_warns(kind, old, new):
    if kind == "inference" and ("gpu_memory" in old or old.get("gpu") == 0):
        return  # a service takes neither (below)
    notes: list[str] = []
    assert ask(kind, old, notes=notes) == ask(kind, new)
    field = next(iter(old))
    assert len(notes) == 1 and notes[0].startswith(f"{field} is deprecated: write gpu_mode with "), notes


def test_a_service_s_older_gpu_keeps_any_fraction():
    """Services stored their fraction as ``gpu`` without steps; they are read back as they were."""
    assert ask("inference", {"gpu": 0.33}) == 0.33


def test_the_older_spelling_is_refused_in_its_own_name():
    with pytest.raises(FieldError, match=r"^gpu: must be from 0.05 to 8 GPUs"):
        ask("inference", {"gpu": 0})
    with pytest.raises(FieldError, match="^gpu: from 1 up must be a whole number of GPUs, got 1.5"):
        ask("training", {"gpu": 1.5})
    with pytest.raises(FieldError, match="^gpu: must be a multiple of 0.05 from 0.05 to 1, got 0.33"):
        ask("training", {"gpu": 0.33})
    with pytest.raises(FieldError, match="^gpu: give gpu or gpu_fraction, not both"):
        ask("workspace", {"gpu": 0.5, "gpu_fraction": 0.5})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("body, words", [
    ({"gpu_fraction": 0}, "gpu_fraction: must be from 0.05 to 1, got 0"),
    ({"gpu_fraction": "0"}, "gpu_fraction: must be from 0.05 to 1, got '0'"),
    ({"gpu_fraction": 1.5}, "gpu_fraction: must be from 0.05 to 1, got 1.5"),
    ({"gpu_fraction": 0.33}, "gpu_fraction: must be a multiple of 0.05 from 0.05 to 1, got 0.33"),
    ({"gpus": 0}, "gpus: must be from 1 to "),
    ({"gpus": 2.5}, "gpus: must be a whole number"),
    ({"gpu_mode": "most"}, "gpu_mode: must be one of fraction, "),
])
def test_range_errors_name_the_same_field_for_every_kind(kind, body, words):
    with pytest.raises(FieldError) as e:
        ask(kind, body)
    assert str(e.value).startswith(words), str(e.value)


@pytest.mark.parametrize("kind", KINDS)
def test_default_then_policy_default_then_template_then_request_then_policy_then_range(kind):
    """A value left out: the kind's default, replaced by the policy's default, by the
    template's; the request's own replaces them all. Then the policy's max, then the range:
    a value beyond both is told the policy's max, the narrower bound."""
    frac = {"gpu_mode": "fraction"}
    small = {"small": {"gpu_mode": "fraction", "gpu_fraction": 0.75}}
    assert ask(kind, frac) == 0.25
    assert ask(kind, frac, limits({"gpu_fraction_default": 0.5})) == 0.5
    assert ask(kind, {**frac, "template": "small"}, limits({"gpu_fraction_default": 0.5}, small)) == 0.75
    assert ask(kind, {**frac, "template": "small", "gpu_fraction": 0.1},
               limits({"gpu_fraction_default": 0.5}, small)) == 0.1
    with pytest.raises(FieldError, match=f"^gpu_fraction: {POLICY} allows at most 0.5, got 0.75"):
        ask(kind, {"template": "small"}, limits({"gpu_fraction_max": 0.5}, small))
    with pytest.raises(FieldError, match=f"^gpu_fraction: {POLICY} allows at most 0.5, got 1.5"):
        ask(kind, {"gpu_fraction": 1.5}, limits({"gpu_fraction_max": 0.5}))
    with pytest.raises(FieldError, match=f"^gpu_fraction: {POLICY} allows at most 0.5, got 0.77"):
        ask(kind, {"gpu_fraction": 0.77}, limits({"gpu_fraction_max": 0.5}))
    with pytest.raises(FieldError, match="^gpu_fraction: must be from 0.05 to 1, got 1.5"):
        ask(kind, {"gpu_fraction": 1.5}, limits())
    with pytest.raises(FieldError, match="^gpu_fraction: must be from 0.05 to 1, got 0.01"):
        ask(kind, {"gpu_fraction": 0.01}, limits({"gpu_fraction_max": 0.5}))
    with pytest.raises(FieldError, match="^gpu_fraction: must be a number from 0.05 to 1, got 'x'"):
        ask(kind, {"gpu_fraction": "x"}, limits({"gpu_fraction_max": 0.5}))
    with pytest.raises(FieldError, match="^template: must be one of small, got 'big'"):
        ask(kind, {"template": "big"}, limits(templates=small))


@pytest.mark.parametrize("kind", ("workspace", "training"))
def test_cpu_and_memory_come_in_the_same_order(kind):
    def cpu(body, lim):
        if kind == "workspace":
            return parse_request({"project": "p", **body}, lim).cpu
        return parse_training({"name": "t", "command": ["x"], "project": "p", **body}, lim).cpu

    tpl = {"big": {"cpu": 3}}
    assert cpu({}, limits()) == 1
    assert cpu({}, limits({"cpu_default": 2})) == 2
    assert cpu({"template": "big"}, limits({"cpu_default": 2}, tpl)) == 3
    assert cpu({"template": "big", "cpu": 5}, limits({"cpu_default": 2}, tpl)) == 5
    with pytest.raises(FieldError, match=f"^cpu: {POLICY} allows at most 4, got 5"):
        cpu({"cpu": 5}, limits({"cpu_max": 4}))


def test_the_spawner_s_workload_is_the_stored_rows():
    """The spawner submits the workload its typed request makes; a stored row makes the
    same one again (adoption, the scheduler loop)."""
    from hub_ext.db.tables import WorkloadRow

    req = parse_request({"project": "p", "gpus": 2, "preemptible": "on"}, limits())
    row = WorkloadRow(name="ws-a", owner="a", project="p", kind="workspace", spec=req.to_dict(),
                      state="pending", submit_time=12.5, placement=[])
    w, again = req.workload("ws-a", 12.5), to_workload(row)
    keys = ("name", "project", "kind", "demand", "preemptible", "allow_over_quota", "submit_time",
            "grace_period_s", "node_pool", "gpu_models")
    assert [getattr(w, k) for k in keys] == [getattr(again, k) for k in keys]
    assert w.demand.gpus == 2 and isinstance(req, WorkloadRequest)
