"""Node selector, required node affinity, taints and tolerations as kube-scheduler reads them,
and the core placing only where they allow (pure: no cluster)."""

from __future__ import annotations

import pytest

from scheduler.constraints import NodeConstraints, Requirement, Taint, Term, Toleration, unavailable
from scheduler.core import decide
from scheduler.model import GPU, Department, Node, PodDemand, Project, Quota, Workload
from scheduler.snapshot import SchedulerConfig, Snapshot

LABELS = {"zone": "z1", "gen": "3", "ssd": ""}


@pytest.mark.parametrize("op,values,expect", [
    ("In", ("z1", "z2"), True), ("In", ("z2",), False),
    ("NotIn", ("z2",), True), ("NotIn", ("z1",), False),
    ("Exists", (), True), ("DoesNotExist", (), False),
])  # fmt: skip
def test_label_operators(op, values, expect):
    assert Requirement("zone", op, values).matches(LABELS) is expect


@pytest.mark.parametrize("op,bound,expect", [("Gt", "2", True), ("Gt", "3", False),
                                             ("Lt", "4", True), ("Lt", "3", False)])
def test_gt_lt_read_integers(op, bound, expect):
    assert Requirement("gen", op, (bound,)).matches(LABELS) is expect
    assert Requirement("zone", op, (bound,)).matches(LABELS) is False  # "z1" is no integer
    assert Requirement("absent", op, (bound,)).matches(LABELS) is False


def test_a_missing_label_is_not_in_any_set_and_does_not_exist():
    assert Requirement("absent", "NotIn", ("x",)).matches(LABELS)
    assert Requirement("absent", "DoesNotExist").matches(LABELS)


def test_terms_are_ored_and_requirements_anded():
    z2 = Term((Requirement("zone", "In", ("z2",)),))
    z1_gen3 = Term((Requirement("zone", "In", ("z1",)), Requirement("gen", "In", ("3",))))
    z1_gen4 = Term((Requirement("zone", "In", ("z1",)), Requirement("gen", "In", ("4",))))
    assert NodeConstraints(terms=(z2, z1_gen3)).allows("n", LABELS, ())
    assert not NodeConstraints(terms=(z2, z1_gen4)).allows("n", LABELS, ())
    assert not NodeConstraints(terms=(Term(),)).allows("n", LABELS, ())  # an empty term: no node
    assert not NodeConstraints(terms=()).allows("n", LABELS, ())


def test_match_fields_name_the_node():
    by_name = NodeConstraints(terms=(Term(fields=(Requirement("metadata.name", "In", ("n1",)),)),))
    assert by_name.allows("n1", {}, ()) and not by_name.allows("n2", {}, ())


def test_node_selector_needs_every_label_equal():
    assert NodeConstraints(selector=(("zone", "z1"), ("gen", "3"))).allows("n", LABELS, ())
    assert not NodeConstraints(selector=(("zone", "z1"), ("gen", "4"))).allows("n", LABELS, ())


@pytest.mark.parametrize("tol,expect", [
    (Toleration("gpu", "Equal", "yes", "NoSchedule"), True),
    (Toleration("gpu", "Equal", "no", "NoSchedule"), False),
    (Toleration("gpu", "Equal", "yes", "NoExecute"), False),
    (Toleration("gpu", "Equal", "yes"), True),  # no effect: every effect
    (Toleration("gpu", "Exists"), True),
    (Toleration("", "Exists"), True),  # empty key with Exists: every taint
    (Toleration("", "Equal", "yes"), False),  # empty key needs Exists
    (Toleration("other", "Exists"), False),
])  # fmt: skip
def test_tolerations(tol, expect):
    taint = Taint("gpu", "yes", "NoSchedule")
    assert NodeConstraints(tolerations=(tol,)).allows("n", {}, (taint,)) is expect


def test_no_schedule_and_no_execute_keep_pods_off_prefer_does_not():
    c = NodeConstraints()
    assert not c.allows("n", {}, (Taint("a", "", "NoSchedule"),))
    assert not c.allows("n", {}, (Taint("a", "", "NoExecute"),))
    assert c.allows("n", {}, (Taint("a", "", "PreferNoSchedule"),))


def test_the_reason_counts_nodes_by_the_filter_they_fail():
    nodes = [("a", {"zone": "z1"}, ()), ("b", {"zone": "z2"}, ()),
             ("c", {"zone": "z2"}, (Taint("gpu", "yes", "NoSchedule"),))]
    c = NodeConstraints(selector=(("zone", "z2"),))
    assert unavailable(c, [n for n in nodes if n[0] != "b"]) == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {gpu: yes}.")


def _snapshot() -> Snapshot:
    s = Snapshot(SchedulerConfig())
    for name, labels, taints in (("a", {"zone": "z1"}, ()), ("b", {"zone": "z2"}, ()),
                                 ("c", {"zone": "z2"}, (Taint("gpu", "yes", "NoSchedule"),))):
        s.add_node(Node(name, [GPU(i, "A100", 81920) for i in range(2)], labels=labels, taints=taints))
    s.set_department(Department("d", {"default": Quota(6)}))
    s.set_project(Project("p", "d", {"default": Quota(6)}))
    return s


def test_core_places_only_where_constraints_allow_and_says_why_not():
    s = _snapshot()
    tolerant = NodeConstraints(selector=(("zone", "z2"),), tolerations=(Toleration("gpu", "Exists"),))
    s.upsert_workload(Workload("nowhere", "p", demand=PodDemand(gpus=1),
                               constraints=NodeConstraints(selector=(("zone", "z9"),))))
    s.upsert_workload(Workload("z1", "p", demand=PodDemand(gpus=2), submit_time=1,
                               constraints=NodeConstraints(selector=(("zone", "z1"),))))
    s.upsert_workload(Workload("tolerant", "p", demand=PodDemand(gpus=2), constraints=tolerant, submit_time=3))
    s.upsert_workload(Workload("plain-1", "p", demand=PodDemand(gpus=2), submit_time=2))
    s.upsert_workload(Workload("plain-2", "p", demand=PodDemand(gpus=1), submit_time=4))
    d = decide(s)
    nodes = {b.workload: {p.node for p in b.pods} for b in d.binds}
    assert nodes == {"z1": {"a"}, "tolerant": {"c"}, "plain-1": {"b"}}
    assert d.reason("nowhere") == "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    # No room left on the untainted nodes: the tainted one's free GPUs are not for it.
    assert "plain-2" in {p.workload for p in d.pending}


def test_preference_is_the_summed_weight_of_the_preferred_terms_a_node_matches():
    z1 = Term((Requirement("zone", "In", ("z1",)),))
    gen3 = Term((Requirement("gen", "Gt", ("2",)),))
    z2 = Term((Requirement("zone", "In", ("z2",)),))
    c = NodeConstraints(preferred=((5, z1), (7, gen3), (11, z2), (13, Term())))
    assert c.preference("n", LABELS) == 12  # z1 and gen > 2; an empty term matches no node
    assert c.preference("n", {"zone": "z2"}) == 11
    assert c.preference("n", {}) == 0
    assert c.allows("n", {}, ())  # a preference keeps no node out


def _where(s: Snapshot) -> dict[str, set[str]]:
    return {b.workload: {p.node for p in b.pods} for b in decide(s).binds}


def test_core_places_on_the_best_preferred_node_with_room_first():
    """kube-scheduler's NodeAffinity score: the sum of the matching terms' weights. The
    preferred node wins over the one the policy alone would take (the lowest index, a), a
    higher sum wins over a higher single weight, and a full preferred node falls back to the
    next best; the tainted node stays out whatever is preferred."""
    z1, z2 = Term((Requirement("zone", "In", ("z1",)),)), Term((Requirement("zone", "In", ("z2",)),))
    s = _snapshot()
    s.upsert_workload(Workload("plain", "p", demand=PodDemand(gpus=1)))
    assert _where(s) == {"plain": {"a"}}  # no preference: the policy's choice

    s = _snapshot()
    summed = NodeConstraints(preferred=((40, z1), (30, z2), (20, z2)))
    s.upsert_workload(Workload("first", "p", demand=PodDemand(gpus=2), constraints=summed, submit_time=1))
    s.upsert_workload(Workload("second", "p", demand=PodDemand(gpus=2), constraints=summed, submit_time=2))
    s.upsert_workload(Workload("third", "p", demand=PodDemand(gpus=1), constraints=summed, submit_time=3))
    assert _where(s) == {"first": {"b"}, "second": {"a"}}  # c is tainted: third waits
