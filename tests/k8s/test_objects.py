"""Pod/node/CR parsing and the objects the adapter writes (pure functions, no cluster)."""

from __future__ import annotations

import pytest

from scheduler.kubernetes.objects import (
    binding,
    fraction_config_map,
    parse_node,
    parse_pod,
    parse_project,
    parse_quantity,
    request_signature,
    update_pod,
)
from scheduler.model import Kind, PodPlacement, ValidationError

from .helpers import make_pod


def _with_ts(p: dict) -> dict:
    p["metadata"].update(uid="uid-1", creationTimestamp="2025-01-01T00:00:00Z")
    return p


@pytest.mark.parametrize(
    "value,expect",
    [("500m", 0.5), ("2", 2), ("16Gi", 16 * 2**30), ("1e3", 1000), ("128Mi", 128 * 2**20)],
)
def test_quantities(value, expect):
    assert float(parse_quantity(value)) == expect


def test_pod_with_a_fraction():
    p = parse_pod(_with_ts(make_pod("a").ns("t").project("nlp").fraction("0.25").kind("workspace").obj()))
    assert (p.workload, p.project, p.kind) == ("t/a", "nlp", Kind.WORKSPACE)
    assert p.demand.gpu_fraction == 0.25 and p.demand.cpu_milli == 100 and p.demand.memory_mib == 128
    assert p.config_map == "a-gpupool"


def test_gang_pods_share_a_workload_and_project_defaults_to_namespace():
    a = parse_pod(_with_ts(make_pod("w-0").ns("team").gpus(2).gang("g", 2).obj()))
    b = parse_pod(_with_ts(make_pod("w-1").ns("team").gpus(2).gang("g", 2).obj()))
    assert a.workload == b.workload == "team/gang/g"
    assert a.gang_size == 2 and a.demand.gpus == 2 and a.project == "team"


@pytest.mark.parametrize(
    "case,build,field",
    [
        ("fraction-1.5", lambda b: b.fraction("1.5"), "gpupool.io/gpu-fraction"),
        ("fraction-word", lambda b: b.fraction("half"), "gpupool.io/gpu-fraction"),
        ("fraction-and-gpus", lambda b: b.fraction("0.5").gpus(1), "gpupool.io/gpu-fraction"),
        ("gang-without-size", lambda b: b.annotate("gpupool.io/gang", "g"), "gpupool.io/gang-size"),
        ("gang-size-zero", lambda b: b.gang("g", 0), "gpupool.io/gang-size"),
        ("priority-word", lambda b: b.annotate("gpupool.io/priority", "high"), "gpupool.io/priority"),
        ("preemptible-maybe", lambda b: b.annotate("gpupool.io/preemptible", "maybe"),
         "gpupool.io/preemptible"),
        ("memory-garbage", lambda b: b.annotate("gpupool.io/gpu-memory", "lots"), "gpupool.io/gpu-memory"),
        ("resumed-maybe", lambda b: b.annotate("gpupool.io/resumed", "maybe"), "gpupool.io/resumed"),
    ],
)
def test_bad_annotations_name_the_annotation(case, build, field):
    with pytest.raises(ValidationError) as err:
        parse_pod(_with_ts(build(make_pod("x")).obj()))
    assert err.value.field == field or field in str(err.value), str(err.value)


def test_bound_pod_reads_its_placement_back():
    pl = PodPlacement("n1", (3,), 500)
    raw = _with_ts(make_pod("a").fraction("0.5").obj())
    req = parse_pod(raw)
    b = binding(req, pl, over_quota=True)
    raw["spec"]["nodeName"] = "n1"
    raw["metadata"]["annotations"].update(b["metadata"]["annotations"])
    back = parse_pod(raw)
    assert back.placement == pl and back.over_quota


def test_node_and_config_map():
    node = parse_node({
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "H100",
                                              "nvidia.com/gpu.memory": "81559",
                                              "gpupool.io/node-pool": "a100"},
                     "annotations": {"gpupool.io/gpu-uuids": "GPU-a,GPU-b"}},
        "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}},
    })  # fmt: skip
    assert [g.uuid for g in node.gpus] == ["GPU-a", "GPU-b"] and node.pool == "a100"
    assert node.cpu_milli == 8000 and node.memory_mib == 32 * 1024
    req = parse_pod(_with_ts(make_pod("a").fraction("0.5").obj()))
    cm = fraction_config_map(req, PodPlacement("n1", (1,), 500), node)
    assert cm["metadata"]["name"] == "a-gpupool"
    assert cm["data"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert int(cm["data"]["GPUPOOL_MEMORY_LIMIT"]) == 81559 * 2**20 // 2


def test_project_cr():
    p = parse_project({"metadata": {"name": "nlp"},
                       "spec": {"department": "r", "quotas": {"default": {"gpus": 2, "limit": 3}}}})
    assert p.department == "r" and p.quotas["default"].gpus == 2 and p.quotas["default"].limit == 3
    assert (p.quotas["default"].cpu, p.quotas["default"].memory_gib) == (None, None)
    p = parse_project({"metadata": {"name": "nlp"}, "spec": {"department": "r", "quotas": {
        "default": {"gpus": 2, "cpu": 8, "memoryGib": 32.5}}}})
    assert (p.quotas["default"].cpu_milli, p.quotas["default"].memory_mib) == (8000, 33280)


@pytest.mark.parametrize("value,expect", [(None, False), ("true", True), ("True", True),
                                          ("false", False), ("1", True)])
def test_resumed_annotation(value, expect):
    b = make_pod("a").gpus(1)
    if value is not None:
        b.annotate("gpupool.io/resumed", value)
    assert parse_pod(_with_ts(b.obj())).resumed is expect


def test_start_time_is_read_on_parse_and_on_a_status_update():
    raw = _with_ts(make_pod("a").gpus(1).obj())
    req = parse_pod(raw)
    assert req.start_time is None
    raw["spec"]["nodeName"] = "n1"
    raw["status"] = {"phase": "Running", "startTime": "2025-01-01T00:10:00Z"}
    assert request_signature(raw) == req.signature  # a status update, not a new request
    assert update_pod(req, raw).start_time == parse_pod(raw).start_time == 1735690200.0


@pytest.mark.parametrize("value", ["yesterday", "2025-13-01T00:00:00Z", 12])
def test_bad_start_time_names_the_field(value):
    raw = _with_ts(make_pod("a").gpus(1).obj())
    req = parse_pod(raw)
    raw["status"] = {"startTime": value}
    for parse in (lambda: parse_pod(raw), lambda: update_pod(req, raw)):
        with pytest.raises(ValidationError) as err:
            parse()
        assert err.value.field == "status.startTime" and repr(value) in str(err.value)


def test_pod_constraints_read_as_kube_scheduler_reads_them():
    from scheduler.constraints import Requirement, Term, Toleration

    pod = _with_ts(make_pod("c").ns("t").project("nlp").gpus(1).obj())
    pod["spec"].update(
        nodeSelector={"zone": "z1"},
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}},
        tolerations=[{"operator": "Exists"}, {"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
    )
    c = parse_pod(pod).constraints
    assert c.selector == (("zone", "z1"),)
    assert c.terms == (Term((Requirement("gen", "Gt", ("2",)),), (Requirement("metadata.name", "In", ("n1",)),)),)
    assert c.tolerations == (Toleration("", "Exists"), Toleration("gpu", "Equal", "yes", "NoSchedule"))
    assert parse_pod(_with_ts(make_pod("d").ns("t").obj())).constraints is None
    changed = dict(pod, spec=dict(pod["spec"], nodeSelector={"zone": "z2"}))
    assert request_signature(changed) != request_signature(pod)


@pytest.mark.parametrize("term,field", [
    ({"matchExpressions": [{"key": "a", "operator": "Near"}]}, "operator"),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["x"]}]}, "values"),
    ({"matchFields": [{"key": "spec.x", "operator": "In", "values": ["n"]}]}, "matchFields"),
])  # fmt: skip
def test_bad_node_affinity_names_the_field(term, field):
    pod = _with_ts(make_pod("c").ns("t").obj())
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}
    with pytest.raises(ValidationError, match=field):
        parse_pod(pod)


def test_preferred_node_affinity_is_read_with_its_weights():
    from scheduler.constraints import Requirement, Term

    pod = _with_ts(make_pod("c").ns("t").obj())
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 80, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}},
        {"weight": 1, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}},
    ]}}
    c = parse_pod(pod).constraints
    assert c.preferred == ((80, Term((Requirement("zone", "In", ("z1",)),))),
                           (1, Term((), (Requirement("metadata.name", "In", ("n1",)),))))
    assert c.terms is None and c.selector == ()


@pytest.mark.parametrize("weight", [0, 101, "5", None, True])
def test_a_bad_preferred_weight_names_the_field(weight):
    pod = _with_ts(make_pod("c").ns("t").obj())
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": weight, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]}}
    with pytest.raises(ValidationError, match=r"preferredDuringSchedulingIgnoredDuringExecution\[0\]\.weight"):
        parse_pod(pod)


def test_node_taints_are_read():
    from scheduler.constraints import Taint

    node = {"metadata": {"name": "n"}, "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                                         {"key": "x", "effect": "NoExecute"}]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}
    assert parse_node(node).taints == (Taint("gpu", "yes", "NoSchedule"), Taint("x", "", "NoExecute"))


def test_other_pods_hold_their_requests_until_they_finish():
    from scheduler.kubernetes.other_pods import Held, OtherPods, held_by
    from scheduler.model import GPU, Node

    pod = {"metadata": {"name": "ds", "namespace": "kube-system"},
           "spec": {"nodeName": "n", "overhead": {"cpu": "100m"},
                    "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                                   {"resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}],
                    "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]},
           "status": {"phase": "Running"}}
    held = held_by(pod)
    assert held == Held("n", 2100, 1024, 1)  # init container larger; overhead added
    assert held_by(dict(pod, status={"phase": "Succeeded"})) is None
    assert held_by(dict(pod, spec=dict(pod["spec"], nodeName=None))) is None
    others = OtherPods()
    assert others.set("kube-system/ds", held) == {"n"}
    node = Node("n", [GPU(i, "A100", 81920) for i in range(4)], cpu_milli=8000, memory_mib=16384)
    usable = others.usable(node)
    assert (usable.cpu_milli, usable.memory_mib, len(usable.gpus)) == (5900, 15360, 3)
    assert len(others.usable(node, in_use=4).gpus) == 4  # gpupool's GPUs are never taken away
    assert others.set("kube-system/ds", None) == {"n"} and others.usable(node) is node
