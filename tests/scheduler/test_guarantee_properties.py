"""The scheduler's promises as properties over random small clusters (hypothesis).

A loop that mirrors the embedded adapter (``scheduler/embedded/adapter.py``) drives ``decide``:
binds start work at once, evicted work keeps its GPUs for its grace period, then goes back
to the queue as resumed work. Over random clusters (1-4 nodes of 1-8 GPUs, 2-4 projects in
1-2 departments, quotas summing to at most the capacity) and random work (trainings,
workspaces and inference; gangs, fractions, GPU memory, multi-GPU and whole-node pods; in
and over quota) it checks:

(a) guarantee: an in-quota request that would fit if every other project's over-quota work
    were gone is bound within the grace period + 2 periods;
(b) no thrash: with no new submissions nothing is evicted twice and the state settles;
(c) in-quota safety: work inside its project's quota is never evicted for another project,
    and what reclaim takes from a project that it leaves below its quota would not fit back
    inside that quota; with ``consolidate_in_quota`` on, but for a move (consolidate's
    eviction), and a moved workload runs again within the grace period + 2 periods (it
    keeps its GPUs, on another node), while (a), (b), (d), (e) hold all the same;
(d) no GPU, fraction, CPU or memory is over-committed at any cycle;
(e) ``decide`` is deterministic, and the bounds make-room puts on a plan before it builds
    it (``OverQuotaRoom`` for reclaim, ``OwnRoom`` for preemption, ``Victims.room_for_gang``
    for a gang) change no decision: the twin decides without them.

CI runs the ``ci`` profile (fixed, derandomized); ``make fuzz`` runs the ``fuzz`` profile
(``HYPOTHESIS_PROFILE=fuzz``). Counterexamples found on the way stay below as named tests.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import defaultdict
from unittest import mock

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from scheduler.actions.victims import OverQuotaRoom, OwnRoom, Victims
from scheduler.core import decide
from scheduler.model import (
    GPU,
    MILLI,
    Department,
    EvictionCause,
    Kind,
    Node,
    PodDemand,
    Project,
    Quota,
    State,
    Workload,
)
from scheduler.snapshot import SchedulerConfig, Snapshot

settings.register_profile("ci", max_examples=150, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PERIOD_S = 2.0
GRACE_S = 4.0
SETTLE_CYCLES = 60
GPU_MEM_MIB = 81920

# -- the cluster and the work ----------------------------------------------------------


def _node(name: str, gpus: int) -> Node:
    return Node(name, [GPU(j, "H100", GPU_MEM_MIB, f"GPU-{name}-{j}") for j in range(gpus)],
                cpu_milli=64_000, memory_mib=512 * 1024)


@st.composite
def clusters(draw):
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=4))
    nodes = [_node(f"n{i}", g) for i, g in enumerate(sizes)]
    capacity = sum(sizes)
    n_projects = draw(st.integers(2, 4))
    n_depts = draw(st.integers(1, 2))
    # Quotas in quarter GPUs, summing to at most the capacity; often well below it, so that
    # work borrows idle GPUs over quota and the owners come back for them.
    quarters = draw(st.lists(st.integers(0, 4 * capacity // n_projects + 1), min_size=n_projects, max_size=n_projects))
    scale = min(1.0, 4 * capacity / max(1, sum(quarters)))
    quotas = [int(q * scale) / 4 for q in quarters]
    projects = [Project(f"p{i}", f"d{i % n_depts}", {"default": Quota(quotas[i])}) for i in range(n_projects)]
    departments = [Department(f"d{i}") for i in range(n_depts)]
    return nodes, departments, projects


@st.composite
def demands(draw, largest_node: int):
    shape = draw(st.sampled_from(["whole", "fraction", "memory", "node"]))
    if shape == "whole":
        d = PodDemand(gpus=draw(st.integers(1, min(2, largest_node))))
    elif shape == "node":
        d = PodDemand(gpus=largest_node)
    elif shape == "fraction":
        d = PodDemand(gpu_fraction=draw(st.sampled_from([0.25, 0.5, 0.75])))
    else:
        d = PodDemand(gpu_memory_mib=draw(st.sampled_from([10240, 20480, 40960])))
    return dataclasses.replace(d, cpu_milli=draw(st.sampled_from([0, 1000, 4000])),
                               memory_mib=draw(st.sampled_from([0, 4096, 65536])))


@st.composite
def workloads(draw, name: str, projects: list[str], largest_node: int, submit: float, kinds=tuple(Kind)):
    kind = draw(st.sampled_from(kinds))
    demand = draw(demands(largest_node))
    pods = draw(st.integers(1, 3)) if kind == Kind.TRAINING and demand.gpus and demand.gpus < largest_node else 1
    return Workload(
        name=name, project=draw(st.sampled_from(projects)), kind=kind, demand=demand, pods=pods,
        # Workspaces may opt in to run over quota (preemptible then, as the spawn form makes them).
        allow_over_quota=True if kind == Kind.WORKSPACE and draw(st.booleans()) else None,
        preemptible=True if kind == Kind.WORKSPACE and draw(st.booleans()) else None,
        submit_time=submit, grace_period_s=GRACE_S,
    )


@st.composite
def scenarios(draw):
    nodes, departments, projects = draw(clusters())
    names = [p.name for p in projects]
    largest = max(len(n.gpus) for n in nodes)
    capacity = sum(len(n.gpus) for n in nodes)
    # Mostly trainings first (they borrow idle GPUs over quota), enough to fill the cluster.
    first = (Kind.TRAINING, Kind.TRAINING, Kind.TRAINING, Kind.WORKSPACE, Kind.INFERENCE)
    work = [draw(workloads(f"w{i}", names, largest, float(i), first)) for i in range(draw(st.integers(1, 16)))]
    work = [w for w in work if w.pods * w.demand.gpu_count <= capacity]
    arrivals = [draw(workloads(f"x{i}", names, largest, 10_000.0 + i)) for i in range(draw(st.integers(1, 3)))]
    arrivals = [w for w in arrivals if w.pods * w.demand.gpu_count <= capacity]
    return nodes, departments, projects, work, arrivals


@st.composite
def fragmented_scenarios(draw):
    """Where consolidation acts: nodes of 2-8 GPUs filled with 1-GPU trainings of every
    project, some of which then finish, leaving free GPUs spread over the nodes; then pods
    that each need several GPUs on one node. Finished: the work's names (``run``)."""
    nodes, departments, projects = draw(clusters())
    nodes = [n for n in nodes if len(n.gpus) >= 2] or [_node("n9", 4)]
    names = [p.name for p in projects]
    capacity = sum(len(n.gpus) for n in nodes)
    largest = max(len(n.gpus) for n in nodes)
    work = [Workload(name=f"w{i}", project=draw(st.sampled_from(names)), kind=Kind.TRAINING,
                     demand=PodDemand(gpus=1, cpu_milli=1000), submit_time=float(i), grace_period_s=GRACE_S)
            for i in range(capacity)]
    finished = [w.name for w in work if draw(st.booleans())]
    arrivals = [Workload(name=f"x{i}", project=draw(st.sampled_from(names)),
                         kind=draw(st.sampled_from([Kind.TRAINING, Kind.WORKSPACE])),
                         demand=PodDemand(gpus=draw(st.integers(2, largest)), cpu_milli=1000),
                         submit_time=10_000.0 + i, grace_period_s=GRACE_S)
                for i in range(draw(st.integers(1, 3)))]
    return nodes, departments, projects, work, arrivals, finished


# -- the loop ------------------------------------------------------------------------------


class Loop:
    """What the embedded adapter does with decisions, on a simulated clock."""

    def __init__(self, nodes, departments, projects, config: SchedulerConfig | None = None):
        self.snap = Snapshot.build(nodes, departments, projects, (), config or SchedulerConfig())
        self.snap.now = 0.0
        self.release_at: dict[str, float] = {}
        self.evictions: list[tuple[float, str, str, str]] = []  # (time, victim, reason, for whom)
        self.bound_at: dict[str, float] = {}
        self.moved: dict[str, float] = {}  # consolidate's evictions: when, by name

    def submit(self, w: Workload) -> None:
        self.snap.upsert_workload(copy.copy(w))

    def quota(self, project: str) -> int:
        return self.snap.projects[project].quotas["default"].quota_milli

    def cycle(self) -> None:
        snap = self.snap
        before = dict(snap.usage)
        twin = copy.deepcopy(snap)
        d = decide(snap)
        with (mock.patch.object(OverQuotaRoom, "may_fit", return_value=True),
              mock.patch.object(OwnRoom, "may_fit", return_value=True),
              mock.patch.object(Victims, "room_for_gang", return_value=True)):
            again = decide(twin)
        # (e) determinism, with and without the bound
        assert (d.binds, d.evictions, d.pending) == (again.binds, again.evictions, again.pending)
        self._check_reclaim(d, before)
        for b in d.binds:
            w = snap.workloads[b.workload]
            snap.upsert_workload(dataclasses.replace(w, state=State.RUNNING, placement=b.pods,
                                                     over_quota=b.over_quota, started_at=snap.now))
            self.bound_at[w.name] = snap.now
        for e in d.evictions:
            w = snap.workloads[e.workload]
            snap.upsert_workload(dataclasses.replace(w, state=State.RELEASING))
            self.release_at[w.name] = snap.now + e.grace_period_s
            self.evictions.append((snap.now, e.workload, e.reason, ""))
            if e.cause == EvictionCause.CONSOLIDATE:
                self.moved[e.workload] = snap.now
        self._check_moves()
        self._check_capacity()
        snap.now += PERIOD_S
        for name, at in list(self.release_at.items()):
            if at <= snap.now:
                del self.release_at[name]
                w = snap.workloads[name]
                snap.upsert_workload(dataclasses.replace(w, state=State.PENDING, placement=(), over_quota=False,
                                                         resumed=True, started_at=None))

    def _check_reclaim(self, d, before) -> None:
        """(c): another project's eviction leaves the victim's project at or above its quota,
        or takes only work that would be over that quota if it came back. What the project
        holds counts the work bound in the same cycle: a guaranteed workload that takes its
        project's quota puts the project's borrowed training over it."""
        before = dict(before)
        for b in d.binds:
            key = (self.snap.workloads[b.workload].project, "default")
            before[key] = before.get(key, 0) + sum(p.gpu_milli * len(p.gpu_indices) for p in b.pods)
        taken: dict[str, list[int]] = defaultdict(list)
        for e in d.evictions:
            if e.reason.startswith("preempted"):
                continue  # inside its own project
            if e.cause == EvictionCause.CONSOLIDATE and self.snap.config.consolidate_in_quota:
                continue  # a move: the work keeps its GPUs on another node
            v = self.snap.workloads[e.workload]
            taken[v.project].append(v.allocated_milli())
        for project, pieces in taken.items():
            used, quota = before.get((project, "default"), 0), self.quota(project)
            assert used > quota, f"{project} at {used} of its quota {quota} lost work to another project"
            left = used - sum(pieces)
            assert left >= quota or left + min(pieces) > quota, (
                f"{project} left at {left} of its quota {quota}; a piece of {min(pieces)} could reclaim its way back")

    def _check_moves(self) -> None:
        """(c): a moved workload runs again within the grace period + 2 periods."""
        for name, at in list(self.moved.items()):
            if self.bound_at.get(name, -1.0) > at:
                del self.moved[name]
            else:
                assert self.snap.now <= at + GRACE_S + 2 * PERIOD_S, f"{name}, moved at {at}, waits"

    def _check_capacity(self) -> None:
        """(d): nothing over-committed."""
        gpu: dict[tuple[str, int], int] = defaultdict(int)
        cpu: dict[str, int] = defaultdict(int)
        mem: dict[str, int] = defaultdict(int)
        for w in self.snap.workloads.values():
            if w.state == State.PENDING:
                continue
            for p in w.placement:
                for g in p.gpu_indices:
                    gpu[(p.node, g)] += p.gpu_milli
                cpu[p.node] += w.demand.cpu_milli
                mem[p.node] += w.demand.memory_mib
        assert all(m <= MILLI for m in gpu.values()), dict(gpu)
        for name, node in self.snap.nodes.items():
            assert cpu[name] <= node.cpu_milli and mem[name] <= node.memory_mib

    def settle(self, cycles: int = SETTLE_CYCLES) -> None:
        """(b): with no new submissions nothing is evicted twice and the state settles."""
        start = len(self.evictions)
        quiet = 0
        for _ in range(cycles):
            n_evictions, n_bound = len(self.evictions), len(self.bound_at)
            bound_before = dict(self.bound_at)
            self.cycle()
            changed = len(self.evictions) != n_evictions or self.bound_at != bound_before or self.release_at
            quiet = 0 if changed or len(self.bound_at) != n_bound else quiet + 1
            if quiet >= 3:
                break
        victims = [v for _, v, _, _ in self.evictions[start:]]
        assert len(victims) == len(set(victims)), f"evicted twice without new submissions: {victims}"
        assert quiet >= 3, "the state did not settle"


# -- (a): would the request fit without other projects' over-quota work? -----------------


def counted_usage(snap: Snapshot, project: str, w: Workload) -> int:
    """The usage the in-quota test counts for ``w``: all of it for work that may go over
    quota, only the work that cannot give way otherwise (quota.counted_usage)."""
    total = 0
    for v in snap.holding[project].values():
        if w.may_go_over_quota or not v.gives_way:
            total += v.allocated_milli()
    return total


def protected(snap: Snapshot, v: Workload) -> bool:
    """Restarted after a preemption within ``resume_protection_s``: no strategy takes it
    (a minimum runtime, as KAI-Scheduler's reclaim and preempt min-runtime)."""
    window = snap.config.resume_protection_s
    return v.resumed and v.started_at is not None and snap.now - v.started_at < window


def fits_without_over_quota_work(snap: Snapshot, w: Workload) -> bool:
    """Free room per GPU and node once every other project's over-quota work is gone (but
    for work inside its minimum runtime)."""
    free = {n: [MILLI] * len(node.gpus) for n, node in snap.nodes.items()}
    cpu = {n: node.cpu_milli for n, node in snap.nodes.items()}
    mem = {n: node.memory_mib for n, node in snap.nodes.items()}
    for v in snap.workloads.values():
        if v.state == State.PENDING:
            continue
        if (v.project != w.project and v.over_quota and v.is_preemptible and v.state == State.RUNNING
                and not protected(snap, v)):
            continue
        for p in v.placement:
            for g in p.gpu_indices:
                free[p.node][g] -= p.gpu_milli
            cpu[p.node] -= v.demand.cpu_milli
            mem[p.node] -= v.demand.memory_mib
    d = w.demand
    need = d.milli_on(GPU_MEM_MIB) if d.is_fractional else MILLI
    slots = 0
    for n in free:
        # Pods of the gang that fit on this node with its CPU and memory.
        by_res = min(cpu[n] // d.cpu_milli if d.cpu_milli else w.pods, mem[n] // d.memory_mib if d.memory_mib else w.pods)
        by_gpu = (sum(1 for x in free[n] if x == MILLI) // d.gpus if d.gpus
                  else sum(1 for x in free[n] if x >= need))
        slots += min(by_res, by_gpu)
    return slots >= w.pods


def in_quota(snap: Snapshot, w: Workload) -> bool:
    milli = w.pods * w.demand.gpu_count * w.demand.milli_on(GPU_MEM_MIB)
    return counted_usage(snap, w.project, w) + milli <= snap.projects[w.project].quotas["default"].quota_milli


# -- the properties ----------------------------------------------------------------------


def run(nodes, departments, projects, work, arrivals, finished=(), config: SchedulerConfig | None = None) -> Loop:
    loop = Loop(nodes, departments, projects, config)
    for w in work:
        loop.submit(w)
    loop.settle()
    # Past the resume protection: work that restarted after a preemption may be taken again.
    loop.snap.now += loop.snap.config.resume_protection_s + PERIOD_S
    loop.settle()
    for name in finished:  # work that ends: its GPUs are free
        if name in loop.snap.workloads and loop.snap.workloads[name].state == State.RUNNING:
            loop.snap.remove_workload(name)
    loop.settle()
    for w in arrivals:
        promised = in_quota(loop.snap, w) and fits_without_over_quota_work(loop.snap, w)
        loop.submit(w)
        loop.cycle()
        if promised:
            # (a): bound now, or once the reclaimed work has released (grace + 2 periods).
            deadline = loop.snap.now + GRACE_S + 2 * PERIOD_S
            while w.name not in loop.bound_at and loop.snap.now <= deadline:
                loop.cycle()
            assert w.name in loop.bound_at, (
                f"{w.name} of {w.project} was in quota and fits without others' over-quota work, "
                f"but waits: {loop.snap.workloads[w.name]}")
        loop.settle()
    assert not loop.moved, f"moved and never placed again: {loop.moved}"
    return loop


def describe(nodes, departments, projects, work, arrivals, finished=()) -> str:
    """A counterexample, readable enough to copy into a named test."""
    lines = [f"nodes: {[len(n.gpus) for n in nodes]}",
             "projects: " + ", ".join(f"{p.name}({p.department}) quota {p.quotas['default'].gpus:g}" for p in projects)]
    for w in work + arrivals:
        d = w.demand
        what = (f"{d.gpus} GPU" if d.gpus else f"{d.gpu_fraction:g} GPU" if d.gpu_fraction else f"{d.gpu_memory_mib} MiB")
        lines.append(f"{w.name}: {w.project} {w.kind.value} {w.pods} x {what} cpu {d.cpu_milli} mem {d.memory_mib}"
                     f"{' over-quota opt-in' if w.allow_over_quota else ''}{' preemptible' if w.preemptible else ''}")
    if finished:
        lines.append(f"finished after they start: {', '.join(finished)}")
    return "\n".join(lines)


@given(scenarios())
def test_guarantee_no_thrash_safety_capacity_and_determinism(scenario):
    note(describe(*scenario))
    run(*scenario)


@given(st.one_of(scenarios(), fragmented_scenarios()))
def test_the_properties_hold_with_consolidate_in_quota(scenario):
    note(describe(*scenario))
    run(*scenario, config=SchedulerConfig(consolidate_in_quota=True))


# -- counterexamples found on the way ----------------------------------------------------


def test_a_borrowed_gang_gives_way_to_an_in_quota_workspace():
    """The defect found on a live hub, through the loop: vision's in-quota workspace waited
    behind nlp's over-quota 2-GPU gang forever."""
    projects = [Project("nlp", "d", {"default": Quota(1)}), Project("vision", "d", {"default": Quota(2)})]
    work = [
        Workload("nlp-ws", "nlp", Kind.WORKSPACE, PodDemand(gpu_fraction=0.25), submit_time=0),
        Workload("vision-ws", "vision", Kind.WORKSPACE, PodDemand(gpu_fraction=0.75), submit_time=1),
        Workload("big", "nlp", Kind.TRAINING, PodDemand(gpus=1), pods=2, submit_time=2, grace_period_s=GRACE_S),
    ]
    carol = Workload("carol", "vision", Kind.WORKSPACE, PodDemand(gpus=1), submit_time=10_000)
    loop = run([_node("n1", 3)], [Department("d")], projects, work, [carol])
    assert "carol" in loop.bound_at
    assert [v for _, v, _, _ in loop.evictions] == ["big"]


def _work(*specs) -> list[Workload]:
    """(name, project, kind, demand, pods, extra fields) -> workloads submitted in order."""
    return [Workload(name, project, kind, demand, pods=pods, submit_time=float(i if name[0] == "w" else 10_000 + i),
                     grace_period_s=GRACE_S, **extra)
            for i, (name, project, kind, demand, pods, extra) in enumerate(specs)]


def _org(*quotas: float) -> tuple[list[Department], list[Project]]:
    return [Department("d0")], [Project(f"p{i}", "d0", {"default": Quota(q)}) for i, q in enumerate(quotas)]


def test_guaranteed_inference_reclaims_once_its_own_training_gave_way():
    """p3's inference is in quota (its own training gives way), but preempting that training
    frees too little: p0's over-quota work holds the rest and gives way next."""
    T, INF = Kind.TRAINING, Kind.INFERENCE
    work = _work(
        ("w0", "p0", T, PodDemand(gpus=3), 1, {}),
        ("w1", "p0", T, PodDemand(gpu_fraction=0.25, memory_mib=4096), 1, {}),
        ("w2", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}),
        ("w3", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}),
        ("w4", "p0", T, PodDemand(gpus=4), 1, {}),
        ("w5", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}),
        ("w6", "p3", T, PodDemand(gpu_fraction=0.25), 1, {}),
    )
    arrivals = _work(("x0", "p3", INF, PodDemand(gpu_fraction=0.75), 1, {}))
    loop = run([_node("n0", 4)], *_org(0, 0, 0, 0.75), work, arrivals)
    assert "x0" in loop.bound_at


def test_guaranteed_work_is_not_overtaken_by_its_own_project_s_requeued_training():
    """p3's inference preempted p3's training; once it had released, the training (in quota
    on its own, requeued) took the GPU back ahead of the inference, every time."""
    T, WS, INF = Kind.TRAINING, Kind.WORKSPACE, Kind.INFERENCE
    work = _work(
        ("w0", "p0", T, PodDemand(gpus=4), 1, {}),
        ("w1", "p3", T, PodDemand(gpu_fraction=0.25), 1, {}),
        ("w2", "p0", T, PodDemand(gpus=1), 1, {}),
        ("w3", "p0", WS, PodDemand(gpu_fraction=0.5), 1, {}),
        ("w4", "p1", T, PodDemand(gpus=4), 1, {}),
        ("w5", "p3", T, PodDemand(gpu_memory_mib=40960), 1, {}),
        ("w6", "p0", T, PodDemand(gpus=1), 1, {}),
    )
    arrivals = _work(("x0", "p0", WS, PodDemand(gpus=2), 1, {"allow_over_quota": True, "preemptible": True}),
                     ("x1", "p3", INF, PodDemand(gpu_fraction=0.75), 1, {}))
    loop = run([_node("n0", 4)], *_org(0.5, 0, 0, 0.75), work, arrivals)
    assert "x1" in loop.bound_at


def test_a_gang_is_reclaimed_whole_when_its_project_s_small_pieces_cannot_free_a_gpu():
    """p3's workspace (in quota: its own training gives way) needs a whole GPU. p0, far over
    its quota, holds pieces of GPUs 0 and 1 that other teams' work keeps from coming free,
    and a 2-GPU gang on GPUs 2-3. Taking the pieces first, in eviction order, used up p0's
    room above its quota before the gang was reached, so nothing was reclaimed."""
    T, WS = Kind.TRAINING, Kind.WORKSPACE
    q = PodDemand(gpu_fraction=0.25)
    work = _work(
        ("w0", "p0", T, PodDemand(gpus=1), 2, {}),
        ("w1", "p0", T, q, 1, {}), ("w2", "p0", T, q, 1, {}), ("w3", "p1", T, q, 1, {}),
        ("w4", "p0", T, q, 1, {}), ("w5", "p0", T, q, 1, {}), ("w6", "p3", T, q, 1, {}),
        ("w7", "p0", T, PodDemand(gpus=1), 1, {}), ("w8", "p0", T, PodDemand(gpus=1), 1, {}),
        ("w9", "p0", T, PodDemand(gpu_fraction=0.25, memory_mib=4096), 1, {}),
    )
    arrivals = _work(("x0", "p3", WS, PodDemand(gpus=1), 1, {}))
    loop = run([_node("n0", 4)], *_org(0.75, 0.75, 0, 1), work, arrivals)
    assert "x0" in loop.bound_at
    assert [v for _, v, _, _ in loop.evictions[-1:]] == ["w0"]


def test_a_training_its_own_guaranteed_work_put_over_quota_may_be_taken_in_the_same_cycle():
    """p0's inference bound inside p0's quota only because p0's trainings give way; in the
    same cycle one of those trainings, now over the quota, went to p2 for its fair share.
    What the project holds counts the inference bound in that cycle (the check had read
    the usage from before it and called the training in quota)."""
    T, WS, INF = Kind.TRAINING, Kind.WORKSPACE, Kind.INFERENCE
    mem = lambda mib: PodDemand(gpu_memory_mib=mib)  # noqa: E731
    projects = [Project("p0", "d0", {"default": Quota(1.25)}), Project("p1", "d1", {"default": Quota(0.75)}),
                Project("p2", "d0", {"default": Quota(0.75)}), Project("p3", "d1", {"default": Quota(1.25)})]
    specs = [("w0", "p2", T, mem(40960), 1, {}), ("w1", "p0", T, PodDemand(gpu_fraction=0.5), 1, {}),
             ("w3", "p2", T, mem(10240), 1, {}), ("w4", "p2", T, PodDemand(gpu_fraction=0.25), 1, {}),
             ("w5", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}), ("w6", "p1", T, PodDemand(gpu_fraction=0.5), 1, {}),
             ("w7", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}), ("w8", "p3", INF, PodDemand(gpu_fraction=0.75), 1, {}),
             ("w9", "p0", T, PodDemand(gpu_fraction=0.5), 1, {}),
             ("w10", "p2", WS, mem(10240), 1, {"allow_over_quota": True}),
             ("w11", "p0", T, PodDemand(gpus=1), 2, {}), ("w12", "p0", T, PodDemand(gpus=4), 1, {}),
             ("w13", "p0", T, PodDemand(gpu_fraction=0.25), 1, {}), ("w14", "p2", T, mem(10240), 1, {})]
    work = [Workload(n, p, k, d, pods=pods, submit_time=float(n[1:]), grace_period_s=GRACE_S, **extra)
            for n, p, k, d, pods, extra in specs]
    x0 = Workload("x0", "p0", INF, PodDemand(gpu_fraction=0.75, cpu_milli=1000, memory_mib=65536),
                  submit_time=10_000.0, grace_period_s=GRACE_S)
    loop = run([_node("n0", 4)], [Department("d0"), Department("d1")], projects, work, [x0])
    assert "x0" in loop.bound_at


def test_a_fraction_is_reclaimed_from_the_gpu_that_can_hold_it():
    """p3's 0.75 training is in quota. p0, over its quota, holds 0.25 pieces on GPUs other
    teams share and a whole GPU on GPU 3; the pieces came first in eviction order and used
    up p0's room above its quota, so neither of its whole GPUs was ever taken."""
    T = Kind.TRAINING
    q = PodDemand(gpu_fraction=0.25)
    work = _work(
        ("w0", "p0", T, PodDemand(gpus=1), 1, {}), ("w1", "p1", T, q, 1, {}),
        ("w2", "p1", T, PodDemand(gpu_fraction=0.5), 1, {}), ("w3", "p0", T, PodDemand(gpus=1), 1, {}),
        ("w4", "p0", T, q, 1, {}), ("w5", "p0", T, q, 1, {}), ("w6", "p2", T, q, 1, {}), ("w7", "p3", T, q, 1, {}),
    )
    arrivals = _work(("x0", "p3", T, PodDemand(gpu_fraction=0.75), 1, {}))
    loop = run([_node("n0", 4)], *_org(1.25, 0.75, 0.25, 1), work, arrivals)
    assert "x0" in loop.bound_at
    assert [v for _, v, _, _ in loop.evictions[-1:]] in (["w0"], ["w3"])  # one whole GPU of p0's
