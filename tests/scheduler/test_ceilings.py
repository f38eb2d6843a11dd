"""``quota.ceilings``: the most GPUs one workload could ever hold, which the hub refuses
above at submit (hub_ext.requests.rules.check_can_run). Over random organisations (quotas within
the limits, project quotas within the department's, as the organisation rules keep them)
the ceilings agree with the scheduler: on an empty cluster large enough, a request below
every ceiling is bound at once, and one above any is never bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import decide
from scheduler.model import DEFAULT_POOL, MILLI, Department, Kind, Project, Quota
from scheduler.quota import ceilings

from .builders import make_node, make_workload, snapshot

NODE_GPUS = 8


@st.composite
def organisations(draw):
    pq = draw(st.integers(0, 6))
    dq = draw(st.integers(pq, 8))
    pl = draw(st.one_of(st.none(), st.integers(max(pq, 0), 8)))
    dl = draw(st.one_of(st.none(), st.integers(dq, 8)))
    project = Project("p", "d", {DEFAULT_POOL: Quota(pq, 1.0, pl)})
    dept = Department("d", {DEFAULT_POOL: Quota(dq, 1.0, dl)})
    return dept, project


@settings(max_examples=200, derandomize=True, deadline=None)
@given(organisations(), st.integers(1, NODE_GPUS), st.sampled_from([
    (Kind.TRAINING, True), (Kind.WORKSPACE, False), (Kind.WORKSPACE, True), (Kind.INFERENCE, False)]))
def test_ceilings_agree_with_the_scheduler_on_an_empty_cluster(org, gpus, kind_preemptible):
    dept, project = org
    kind, preemptible = kind_preemptible
    w = (make_workload("w").project("p").kind(kind).gpus(gpus).preemptible(preemptible)
         .over_quota(preemptible if kind != Kind.INFERENCE else None).obj())
    over_ceiling = [why for most, why in ceilings(project, dept.quotas[DEFAULT_POOL], DEFAULT_POOL,
                                                   w.may_go_over_quota) if gpus * MILLI > most]
    d = decide(snapshot([make_node("n1", gpus=NODE_GPUS)], [dept], [project], [w]))
    assert (len(d.binds) == 1) == (not over_ceiling), (over_ceiling, d.reason("w"))


def test_the_words_name_the_ceiling():
    project = Project("nlp", "research", {DEFAULT_POOL: Quota(1, 1.0, 3)})
    dept = Quota(3, 1.0, 4)
    assert ceilings(project, dept, DEFAULT_POOL, True) == [
        (3000, "project nlp allows at most 3 GPUs (limit)"),
        (4000, "department research allows at most 4 GPUs (limit)"),
    ]
    guaranteed = ceilings(project, dept, DEFAULT_POOL, False)
    assert (1000, "project nlp allows at most 1 GPU (quota) to work that may not go over quota") in guaranteed
