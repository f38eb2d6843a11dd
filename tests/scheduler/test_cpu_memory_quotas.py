"""CPU and memory quotas of projects and departments (Quota.cpu, Quota.memory_gib): work
that would pass one waits with its own reason; running work counts, and its end frees it."""

from __future__ import annotations

import pytest

from scheduler.core import decide
from scheduler.model import Department, Project, Quota, ValidationError

from .builders import apply, make_node, make_workload, snapshot


def _org(project_quota: Quota, dept_quota: Quota | None = None, projects=("a",)):
    d = Department("d", {"default": dept_quota} if dept_quota is not None else {})
    return [d], [Project(p, "d", {"default": project_quota}) for p in projects]


def _bound(d) -> set[str]:
    return {b.workload for b in d.binds}


@pytest.mark.parametrize("quota, demand, reason", [
    (Quota(8, cpu=4), (2000, 1024), "project a is at its CPU quota (4 of 4 CPUs in use, 2 more asked)"),
    (Quota(8, memory_gib=8), (500, 4096), "project a is at its memory quota (8 of 8 GiB in use, 4 more asked)"),
])
def test_a_project_quota_caps_what_its_work_holds(quota, demand, reason):
    ds, ps = _org(quota)
    ws = [make_workload(f"w{i}").project("a").gpus(0.25).cpu(*demand).submitted(i).obj() for i in range(3)]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert _bound(d) == {"w0", "w1"}
    assert d.reason("w2") == reason


def test_a_department_quota_caps_its_projects_together():
    ds, ps = _org(Quota(4), Quota(8, cpu=6), projects=("a", "b"))
    ws = [make_workload("a0").project("a").gpus(1).cpu(4000).obj(),
          make_workload("b0").project("b").gpus(1).cpu(4000).submitted(1).obj()]
    d = decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws))
    assert _bound(d) == {"a0"}
    assert d.reason("b0") == "department d is at its CPU quota (4 of 6 CPUs in use, 4 more asked)"


def test_cpu_only_work_and_gangs_count_every_pod():
    ds, ps = _org(Quota(0, cpu=5))
    ws = [make_workload("g").project("a").cpu(2000).pods(3).over_quota().obj(),
          make_workload("c").project("a").cpu(2000).submitted(1).over_quota().obj()]
    d = decide(snapshot([make_node("n1", gpus=0)], ds, ps, ws))
    assert _bound(d) == {"c"}
    assert "project a is at its CPU quota" in d.reason("g") and "6 more asked" in d.reason("g")


def test_running_work_counts_and_its_end_frees_the_quota():
    ds, ps = _org(Quota(8, cpu=4))
    run = make_workload("r").project("a").gpus(1).cpu(3000).running(("n1", (0,), 1000)).obj()
    wait = make_workload("p").project("a").gpus(1).cpu(2000).submitted(1).obj()
    snap = snapshot([make_node("n1", gpus=4)], ds, ps, [run, wait])
    d = decide(snap)
    assert not d.binds and d.reason("p") == "project a is at its CPU quota (3 of 4 CPUs in use, 2 more asked)"
    snap.remove_workload("r")
    d = decide(snap)
    assert _bound(d) == {"p"}
    apply(snap, d)
    assert snap.cpu_memory[("a", "default")] == [2000, 0]


def test_no_cpu_or_memory_quota_means_no_cap():
    ds, ps = _org(Quota(8))
    ws = [make_workload(f"w{i}").project("a").gpus(0.25).cpu(32_000, 1 << 16).submitted(i).obj() for i in range(3)]
    assert len(decide(snapshot([make_node("n1", gpus=4)], ds, ps, ws)).binds) == 3


@pytest.mark.parametrize("quota, field", [
    (Quota(1, cpu=-1), "cpu"), (Quota(1, memory_gib=float("nan")), "memory_gib"), (Quota(1, cpu=True), "cpu"),
])
def test_a_bad_cpu_or_memory_quota_names_its_field(quota, field):
    with pytest.raises(ValidationError) as e:
        quota.validate("project[a]")
    assert f"project[a].{field}" in str(e.value)
