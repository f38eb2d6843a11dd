"""Per-node score caches, kept in step with the arrays through their node stamps.

The delta for one pod shape on one node depends only on that node's state, so each policy
keeps, per pod shape, the best delta and GPU slot of every node, in a cache on the arrays'
``Lineage`` keyed by the node ``stamp``; a call recomputes only the rows whose stamp moved
since (usually none or a handful) and then takes one masked argmax over the nodes.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterArrays
from ..model import PodDemand
from .choice import NEG
from .views import FgdView

SMALL = 32  # changed rows up to which a refresh is done row by row in Python


def demand_key(demand: PodDemand) -> tuple:
    return (demand.gpus, demand.gpu_fraction, demand.gpu_memory_mib, demand.cpu_milli)


class BaseCache:
    """``bound.base`` of every node, kept in step with the arrays through their stamps and
    shared by all pod shapes (a node changed by one placement is recomputed once)."""

    def __init__(self, n: int):
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.data: dict[str, np.ndarray] = {}
        self.lookups = self.hits = 0  # of the per-state memos (``RowCache.memo``)

    def memo_pays(self) -> bool:
        """Whether looking node states up in the memos is worth its cost in incremental
        refreshes: it is where many nodes share states (big, evenly used clusters;
        rolled-back trials), not where every node's free CPU differs (the FGD simulator's
        small heterogeneous cluster). Either way the scores are the same."""
        return self.lookups < 2000 or self.hits * 4 >= self.lookups

    def memo_seen(self, lookups: int, hits: int) -> None:
        self.lookups += lookups
        self.hits += hits

    def rows(self, bound: FgdView, arrays: ClusterArrays, rows: np.ndarray) -> dict[str, np.ndarray]:
        stale = rows[self.stamp[rows] != arrays.stamp[rows]]
        if len(stale):
            fresh = bound.base(arrays, stale)
            if not self.data:
                n = len(self.stamp)
                self.data = {k: np.zeros((n,) + v.shape[1:], dtype=v.dtype) for k, v in fresh.items()}
            for k, v in fresh.items():
                self.data[k][stale] = v
            self.stamp[stale] = arrays.stamp[stale]
        return {k: v[rows] for k, v in self.data.items()}


class RowCache:
    """Per node: the policy's best score and GPU slot for one pod shape, kept in step with
    the arrays through their stamps; and, per node *state*, the same answer (``memo``).

    A node's score depends only on its state: its GPU rooms, its GPU model (and memory, for
    memory requests) and its free CPU up to ``cpu_cap``, past which more CPU changes no
    term of the measure. Many nodes share a state, and a trial placement that is rolled
    back returns a node to a state already scored, so a moved stamp is mostly a memo hit.
    """

    __slots__ = ("stamp", "score", "slot", "memo", "cpu_cap", "log", "seen", "out", "n_out", "kept", "kept_log", "kept_seen", "masked")

    MEMO_MAX = 200_000  # states remembered per pod shape before the memo starts afresh

    def __init__(self, n: int, cpu_cap: int):
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.score = np.full(n, NEG)
        self.slot = np.zeros(n, dtype=np.int64)
        self.memo: dict[tuple, tuple[float, int]] = {}
        self.cpu_cap = cpu_cap
        self.log: list[int] | None = None  # the ``changed`` log of the arrays last refreshed
        self.seen = 0  # how much of it the rows here are up to date with
        self.out = np.zeros(n, dtype=bool)  # stale rows a call's mask left out
        self.n_out = 0  # how many: when none, a call skips looking for them (an N-wide step)
        # For ``in_step``: the kept mask last placed on, the change log and how far into it
        # ``masked`` (the score where that mask and the GPU count allow the pod, else a
        # fill value) is up to date.
        self.kept: np.ndarray | None = None
        self.kept_log: list[int] | None = None
        self.kept_seen = 0
        self.masked: np.ndarray | None = None

    def dirty(self, arrays: ClusterArrays, mask: np.ndarray | None):
        """Rows in ``mask`` whose stamp moved since they were scored (a list when few, else
        an array). Rows outside the mask are left stale and marked in ``out`` until a call
        needs them. Found from the arrays' change log when this cache has followed it,
        else by comparing every stamp."""
        log, mine, theirs = arrays.changed, self.stamp, arrays.stamp
        if self.log is not log:
            self.log, self.seen = log, len(log)
            stale = mine != theirs
            if mask is None:
                self.out[:] = False
                self.n_out = 0
                return np.flatnonzero(stale)
            self.out = stale & ~mask
            self.n_out = int(np.count_nonzero(self.out))
            return np.flatnonzero(stale & mask)
        new = log[self.seen :]
        self.seen = len(log)
        if not self.n_out:
            waiting = []
        else:
            waiting = np.flatnonzero(self.out if mask is None else self.out & mask).tolist()
        if len(new) + len(waiting) <= SMALL:  # the usual case: a handful of rows, in Python
            rows = sorted(set(new).union(waiting))
            return self._take_stale(rows, [True] * len(rows) if mask is None else [bool(mask[r]) for r in rows], theirs)
        # Sorted, without repeats; not np.union1d, which imports numpy.ma on first use
        # (~10 ms inside the first cycle).
        flag = np.zeros(len(mine), dtype=bool)
        flag[new] = True
        flag[waiting] = True
        cand = np.flatnonzero(flag)
        cand = cand[mine[cand] != theirs[cand]]
        if mask is not None:
            self.out[cand[~mask[cand]]] = True
            cand = cand[mask[cand]]
        self.out[cand] = False
        self.n_out = int(np.count_nonzero(self.out))
        return cand

    def _take_stale(self, rows: list[int], inside, stamps: np.ndarray) -> list[int]:
        """Of ``rows``, those whose stamp moved since they were scored: the ones ``inside``
        (truthy per row) are returned to be rescored, the others marked in ``out``."""
        stale, out, mine = [], self.out, self.stamp
        for r, f in zip(rows, inside):
            if mine[r] != stamps[r]:
                if f:
                    stale.append(r)
                    if out[r]:
                        out[r] = False
                        self.n_out -= 1
                elif not out[r]:
                    out[r] = True
                    self.n_out += 1
        return stale

    def in_step(self, arrays: ClusterArrays, mask: np.ndarray, gpus: int, fill: float, refresh) -> np.ndarray:
        """``np.where(fit, score, fill)`` with every ``fit`` row fresh, where ``fit`` is
        ``mask`` and, for whole GPUs, at least ``gpus`` free; ``mask`` is kept in step by the
        arrays (``ClusterArrays.kept_in_step``). Such a mask, the GPU count test and the
        scores move only at nodes in the change log, so the result of the last call on this
        mask is kept and only nodes logged since are looked at, instead of a few N-wide
        steps per pod. ``refresh(rows)`` rescores rows (a list when few, else an array)."""
        log = arrays.changed
        if self.kept is not mask or self.kept_log is not log:  # start from a full pass
            fit = mask & (arrays.full_free >= gpus) if gpus else mask
            refresh(self.dirty(arrays, fit))
            self.masked = np.where(fit, self.score, fill)
            self.kept, self.kept_log = mask, log
        elif self.kept_seen < len(log):
            rows = sorted(set(log[self.kept_seen :]))
            full_free, now = arrays.full_free, arrays.stamp
            fits = [bool(mask[r]) and (not gpus or full_free[r] >= gpus) for r in rows]
            stale = self._take_stale(rows, fits, now)
            if stale:
                refresh(stale)
            masked, score = self.masked, self.score
            assert masked is not None  # kept: made by the first call
            for r, f in zip(rows, fits):
                masked[r] = score[r] if f else fill
        self.kept_seen = len(log)
        assert self.masked is not None
        return self.masked

    def states(self, arrays: ClusterArrays, rows, demand: PodDemand) -> list[tuple]:
        """One hashable key per row that names everything its score depends on."""
        if isinstance(rows, list):
            free, cpu, model, cap = arrays.gpu_free, arrays.cpu_free, arrays.model_id, self.cpu_cap
            if demand.gpu_memory_mib:
                mem = arrays.gpu_mem
                return [(free[r].tobytes(), min(int(cpu[r]), cap), int(model[r]), mem[r].tobytes()) for r in rows]
            return [(free[r].tobytes(), min(int(cpu[r]), cap), int(model[r])) for r in rows]
        free = np.ascontiguousarray(arrays.gpu_free[rows])
        rooms = free.view(np.dtype((np.void, free.shape[1] * free.itemsize))).ravel().tolist()
        cpu = np.minimum(arrays.cpu_free[rows], self.cpu_cap).tolist()
        model = arrays.model_id[rows].tolist()
        if demand.gpu_memory_mib:
            mem = np.ascontiguousarray(arrays.gpu_mem[rows])
            sizes = mem.view(np.dtype((np.void, mem.shape[1] * mem.itemsize))).ravel().tolist()
            return list(zip(rooms, cpu, model, sizes))
        return list(zip(rooms, cpu, model))
