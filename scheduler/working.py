"""A cycle's private copy of the cluster, where every change can be undone.

Each change is logged with what it did; ``rollback(cp)`` undoes back to a checkpoint, so
a gang that half fits, or an eviction plan that does not make room, leaves no trace.
``with work.trial() as t:`` does the same for a block: its changes are undone when it ends
unless ``t.keep()`` was called.
"""

from __future__ import annotations

from collections import defaultdict

from .cluster import ClusterArrays
from .model import Workload
from .placement import Choice
from .snapshot import Snapshot


class Working:
    def __init__(self, snap: Snapshot):
        self.arrays: ClusterArrays = snap.arrays.copy()
        self.usage: dict[tuple[str, str], int] = defaultdict(int, snap.usage)
        self.fixed_usage: dict[tuple[str, str], int] = defaultdict(int, snap.fixed_usage)
        self.dept_of = {p.name: p.department for p in snap.projects.values()}
        self.quota = {(p.name, pool): q.quota_milli for p in snap.projects.values() for pool, q in p.quotas.items()}
        self.dept_usage: dict[tuple[str, str], int] = defaultdict(int)
        # A department's guarantee is spent only by its projects' in-quota GPUs.
        self.dept_in_quota: dict[tuple[str, str], int] = defaultdict(int)
        for (project, pool), milli in snap.usage.items():
            if project in self.dept_of:
                dept = (self.dept_of[project], pool)
                self.dept_usage[dept] += milli
                self.dept_in_quota[dept] += min(milli, self.quota.get((project, pool), 0))
        # (project or department, pool) -> [CPU milli, memory MiB] held (CPU/memory quotas)
        self.cpu_memory: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.dept_cpu_memory: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for (project, pool), (cpu, mem) in snap.cpu_memory.items():
            self.cpu_memory[(project, pool)] = [cpu, mem]
            d = self.dept_cpu_memory[(self.dept_of.get(project, ""), pool)]
            d[0] += cpu
            d[1] += mem
        self.nodes = snap.nodes
        self._pool_of = [self.arrays.pools[i] for i in self.arrays.pool_id.tolist()]
        self._log: list[tuple[bool, Workload, list[Choice]]] = []
        self._choices: dict[str, list[Choice]] = {}
        self._milli: dict[str, int] = {}
        # Bumped whenever capacity grows, so "did not fit" answers can be cached until then.
        self.epoch = 0

    def pool_of(self, node: int) -> str:
        return self._pool_of[node]

    def choices_of(self, w: Workload) -> list[Choice]:
        """A holding workload's placement in this cycle's node numbering (a holding
        workload's placement does not change within a cycle, so it is worked out once)."""
        choices = self._choices.get(w.name)
        if choices is None:
            ix = self.arrays.index
            choices = [Choice(ix[p.node], p.gpu_indices, p.gpu_milli) for p in w.placement if p.node in ix]
            self._choices[w.name] = choices
        return choices

    def milli_of(self, w: Workload) -> int:
        """The milli-GPUs a holding workload's placement takes."""
        milli = self._milli.get(w.name)
        if milli is None:  # from the placement itself: most victims summed are never placed back
            ix = self.arrays.index
            milli = self._milli[w.name] = sum(p.gpu_milli * len(p.gpu_indices) for p in w.placement if p.node in ix)
        return milli

    def checkpoint(self) -> int:
        return len(self._log)

    def trial(self) -> Trial:
        return Trial(self)

    def rollback(self, cp: int) -> None:
        while len(self._log) > cp:
            took, w, choices = self._log.pop()
            self._apply(w, choices, not took)

    def take(self, w: Workload, choices: list[Choice]) -> None:
        self._apply(w, choices, True)
        self._log.append((True, w, choices))

    def give(self, w: Workload, choices: list[Choice]) -> None:
        self._apply(w, choices, False)
        self._log.append((False, w, choices))

    def usage_after(self, project: str, pool: str, delta: int = 0) -> tuple[int, int, int]:
        """(the project's usage, its department's in-quota usage, the department's usage)
        in ``pool`` as they would be with ``delta`` more milli-GPU (negative: freed)."""
        key, dept = (project, pool), (self.dept_of.get(project, ""), pool)
        before = self.usage[key]
        after = before + delta
        q = self.quota.get(key, 0)
        return (
            after,
            self.dept_in_quota[dept] + min(after, q) - min(before, q),
            self.dept_usage[dept] + delta,
        )

    def _apply(self, w: Workload, choices: list[Choice], take: bool) -> None:
        sign = 1 if take else -1
        project, demand = w.project, w.demand
        dept = self.dept_of.get(project, "")
        op = self.arrays.take if take else self.arrays.give
        usage, dept_in_quota, dept_usage = self.usage, self.dept_in_quota, self.dept_usage
        fixed = None if w.gives_way else self.fixed_usage
        for c in choices:
            op(c.node, c.gpus, c.milli, demand.cpu_milli, demand.memory_mib)
            pool = self._pool_of[c.node]
            key, dkey = (project, pool), (dept, pool)
            # usage_after, written out: this runs for every pod placed or undone
            before = usage[key]
            after = before + sign * c.milli * len(c.gpus)
            q = self.quota.get(key, 0)
            usage[key] = after
            dept_in_quota[dkey] += min(after, q) - min(before, q)
            dept_usage[dkey] += after - before
            if fixed is not None:
                fixed[key] += after - before
            for held in (self.cpu_memory[key], self.dept_cpu_memory[dkey]):
                held[0] += sign * demand.cpu_milli
                held[1] += sign * demand.memory_mib
        if not take:
            self.epoch += 1


class Trial:
    """Changes to a ``Working`` made inside ``with work.trial() as t:``: undone when the
    block ends (by an exception too) unless ``t.keep()`` was called; ``t.undo()`` undoes
    them at once and the trial goes on from its start."""

    __slots__ = ("work", "cp", "kept")

    def __init__(self, work: Working):
        self.work, self.cp, self.kept = work, -1, False

    def __enter__(self) -> Trial:
        self.cp = self.work.checkpoint()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            self.work.rollback(self.cp)

    def keep(self) -> None:
        self.kept = True

    def undo(self) -> None:
        self.work.rollback(self.cp)
