"""Placement policies that score nodes, and the fragmentation measure they share.

Fragmentation (the FGD paper, ATC'23, "Beware of Fragmentation"): against a *workload mix*
(the pod shapes the cluster expects, each with its probability), a node's idle GPU
milli-units count as fragment for a shape when the node cannot run a pod of that shape (too
few GPUs with that much room, too little CPU, a GPU model the shape does not accept); when it
can, only the GPUs with less room than one of the shape's GPUs count. A node's fragmentation
is the probability-weighted sum over shapes:

    frag(node) = sum_t p_t * F_t(node),  F_t = idle            if the node cannot host t
                                         F_t = idle - big_t    otherwise

where ``big_t`` is the idle milli on GPUs with at least ``milli_t`` free. FGD puts a pod where
it grows fragmentation least (``frag(before) - frag(after)`` largest).

Speed: the delta for one pod shape on one node depends only on that node's state, so each
policy keeps, per pod shape, the best delta and GPU slot of every node, in a cache on the
arrays' ``Lineage`` keyed by the node ``stamp``; a call recomputes only the rows whose stamp
moved since (usually none or a handful) and then takes one masked argmax over the nodes.

Shapes are grouped by their per-GPU milli (``M`` distinct values) so the work per row is
``G x M`` instead of ``G x T`` shapes: for fixed CPU left, the weight of the shapes a node can
host is a table ``W[m, c]`` over "c GPUs have room for m", built with one small matmul.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .cluster import ClusterArrays
from .model import MILLI, PodDemand

NEG = -1e18
MIX_DRIFT = 0.02  # how far a shape's probability may move before the mix is re-learnt
# BestFit's normalisers (the FGD simulator's "max spec" of one node): 128 CPUs, 8 GPUs.
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8 * MILLI


@dataclass(frozen=True)
class Choice:
    """Where one pod goes (re-exported by ``scheduler.placement``)."""

    node: int
    gpus: tuple[int, ...]
    milli: int  # per GPU


# -- the workload mix --------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One pod shape of a workload mix: CPU, milli per GPU (0: CPU-only), GPU count, models."""

    cpu: int
    milli: int
    count: int
    models: tuple[str, ...] = ()


class Mix:
    """The pod shapes a cluster expects, each with its probability (they sum to 1)."""

    def __init__(self, shapes: Sequence[Shape], probs: Sequence[float]):
        total = float(sum(probs))
        if not shapes or total <= 0:
            raise ValueError("mix: needs at least one shape with a positive weight")
        self.shapes = tuple(shapes)
        self.probs = np.asarray(probs, dtype=np.float64) / total
        self.key = tuple(zip(self.shapes, np.round(self.probs, 6).tolist()))
        self.token = hash(self.key)  # hashed once: part of every call's cache key

    @classmethod
    def from_counts(cls, counts: dict[Shape, float], coverage: float = 0.95) -> Mix:
        """The most frequent shapes that together make ``coverage`` of the count (the FGD
        simulator's "typical pods": popularity threshold 95%), renormalised."""
        items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].cpu, kv[0].milli, kv[0].count, kv[0].models))
        total = sum(v for _, v in items)
        keep, acc = [], 0.0
        for shape, v in items:
            if acc >= coverage * total:
                break
            keep.append((shape, v))
            acc += v
        return cls([s for s, _ in keep], [v for _, v in keep])

    @classmethod
    def from_demands(
        cls,
        demands: Iterable[PodDemand],
        models: Iterable[tuple[str, ...]] | None = None,
        coverage: float = 0.95,
        gpu_weight: float = 0.0,
    ) -> Mix:
        """Shape counts from demands; ``gpu_weight`` counts a pod as ``1 + gpu_weight x its
        GPU milli / 1000`` instead of 1 (the FGD simulator's ``gpuResWeight``, generalised to
        fractions)."""
        counts: dict[Shape, float] = {}
        models_it = iter(models) if models is not None else None
        for d in demands:
            m = next(models_it) if models_it is not None else ()
            s = shape_of(d, m)
            counts[s] = counts.get(s, 0.0) + 1.0 + gpu_weight * s.milli * s.count / MILLI
        if not counts:
            return default_mix()
        return cls.from_counts(counts, coverage)


def shape_of(d: PodDemand, models: tuple[str, ...] = ()) -> Shape:
    if d.gpus:
        return Shape(d.cpu_milli, MILLI, d.gpus, tuple(models))
    if d.gpu_fraction:
        return Shape(d.cpu_milli, round(d.gpu_fraction * MILLI), 1, tuple(models))
    if d.gpu_memory_mib:
        # Memory requests become milli on the GPU they land on; 16 GiB GPUs as the yardstick.
        return Shape(d.cpu_milli, min(MILLI, math.ceil(d.gpu_memory_mib * MILLI / 16384)), 1, tuple(models))
    return Shape(d.cpu_milli, 0, 0, tuple(models))


def default_mix() -> Mix:
    """Used when no one told the policy what to expect: the shape mix of the Alibaba openb
    2023 trace, rounded (whole GPUs dominate; fractions near 1/4, 1/2 and 4/5)."""
    shapes = [
        Shape(8000, MILLI, 1),
        Shape(4000, 500, 1),
        Shape(4000, 800, 1),
        Shape(2000, 250, 1),
        Shape(16000, MILLI, 2),
        Shape(32000, MILLI, 4),
        Shape(64000, MILLI, 8),
        Shape(4000, 0, 0),
    ]
    return Mix(shapes, [48, 12, 13, 9, 1, 1, 1, 13])


# -- the fragmentation engine -------------------------------------------------------------


class _Bound:
    """A mix bound to one arrays lineage's model numbering: dense tables for the math."""

    def __init__(self, mix: Mix, models: list[str], g: int):
        gpu = [i for i, s in enumerate(mix.shapes) if s.milli > 0]
        shapes = [mix.shapes[i] for i in gpu]
        self.g = g
        self.cpu = np.array([s.cpu for s in shapes], dtype=np.int64)  # (T,)
        self.prob = mix.probs[gpu]  # (T,)
        self.mvals = np.array(sorted({s.milli for s in shapes}), dtype=np.int64)  # (M,)
        midx = np.searchsorted(self.mvals, [s.milli for s in shapes])
        count = np.array([s.count for s in shapes], dtype=np.int64)
        m = len(self.mvals)
        # access[model_id + 1, t]: a node of that model may run shape t (row 0: no GPU).
        self.access = np.zeros((len(models) + 1, len(shapes)), dtype=bool)
        for t, s in enumerate(shapes):
            if s.models:
                for k, name in enumerate(models):
                    self.access[k + 1, t] = name in s.models
            else:
                self.access[1:, t] = True
        # B[t, m*(g+1) + c] = 1 when shape t has milli mvals[m] and needs at most c GPUs.
        b = np.zeros((len(shapes), m, g + 1), dtype=np.float64)
        for t in range(len(shapes)):
            b[t, midx[t], count[t] :] = 1.0
        self.b = b.reshape(len(shapes), m * (g + 1))
        self.pb = self.prob[:, None] * self.b  # (T, M*(G+1)): B weighted by probability
        self.offsets = (np.arange(m, dtype=np.int64) * (g + 1))[None, :]  # (1, M)

    def cpu_cap(self, demand: PodDemand) -> int:
        """Free CPU past which a node's score for ``demand`` no longer changes: every shape
        fits by CPU before and after the pod."""
        return int(demand.cpu_milli + (self.cpu.max() if len(self.cpu) else 0))

    def weights(self, cpu_left: np.ndarray, model_id: np.ndarray) -> np.ndarray:
        """(R, M*(G+1)): weight of the shapes a node could host, by m and GPUs with room."""
        a = self.access[model_id.astype(np.int64) + 1] & (cpu_left[:, None] >= self.cpu[None, :])
        return a.astype(np.float64) @ self.pb

    def stats(self, left: np.ndarray):
        """Per row: idle milli, and per m: GPUs with room >= m, idle milli on those GPUs."""
        idle = np.maximum(left, 0)
        ge = left[:, :, None] >= self.mvals[None, None, :]  # (R, G, M)
        cnt = ge.sum(axis=1)
        big = (idle[:, :, None] * ge).sum(axis=1)
        return idle.sum(axis=1), cnt, big

    def frag_of(self, w: np.ndarray, idle_total, cnt, big) -> np.ndarray:
        """Fragmentation from weights ``w`` (R, M*(G+1)) and stats of any trailing shape."""
        base = np.arange(w.shape[0], dtype=np.int64) * w.shape[1]
        if cnt.ndim == 2:
            idx = cnt + self.offsets + base[:, None]
        else:
            idx = cnt + self.offsets[:, None, :] + base[:, None, None]
        return idle_total - (w.reshape(-1)[idx] * big).sum(axis=-1)

    def base(self, arrays: ClusterArrays, rows: np.ndarray) -> dict[str, np.ndarray]:
        """What the deltas of every pod shape share: the rows' own state, before any pod."""
        left = arrays.gpu_free[rows].astype(np.int64)
        idle, cnt, big = self.stats(left)
        before = self.frag_of(self.weights(arrays.cpu_free[rows], arrays.model_id[rows]), idle, cnt, big)
        return {"idle": idle, "cnt": cnt, "big": big, "before": before}

    def deltas(
        self, arrays: ClusterArrays, rows: np.ndarray, demand: PodDemand, need, base: dict | None = None
    ) -> np.ndarray:
        """(R, G) fragmentation growth avoided, ``frag(before) - frag(after)``, for putting
        the pod on each GPU slot of each row (fractions), or in column 0 (whole GPUs,
        CPU-only); NEG where the pod does not fit on the GPUs. ``base``: ``self.base`` of
        the rows, when the caller has it cached."""
        base = self.base(arrays, rows) if base is None else base
        left = arrays.gpu_free[rows].astype(np.int64)
        cpu = arrays.cpu_free[rows]
        model = arrays.model_id[rows]
        idle_total, cnt, big, before = base["idle"], base["cnt"], base["big"], base["before"]
        w_after = self.weights(cpu - demand.cpu_milli, model)
        out = np.full(left.shape, NEG)
        if demand.gpus:
            k = demand.gpus
            ok = arrays.full_free[rows] >= k
            after = self.frag_of(w_after, idle_total - k * MILLI, np.maximum(cnt - k, 0), big - k * MILLI)
            out[:, 0] = np.where(ok, before - after, NEG)
        elif demand.is_fractional:
            nd = need if np.isscalar(need) else need[rows]
            after_left = left - nd
            ok = after_left >= 0
            mv = self.mvals[None, None, :]
            ge0 = left[:, :, None] >= mv
            ge1 = after_left[:, :, None] >= mv
            cnt1 = cnt[:, None, :] - ge0 + ge1
            big1 = big[:, None, :] - left[:, :, None] * ge0 + after_left[:, :, None] * ge1
            after = self.frag_of(w_after, (idle_total[:, None] - nd), cnt1, big1)
            out = np.where(ok, before[:, None] - after, NEG)
        else:
            after = self.frag_of(w_after, idle_total, cnt, big)
            out[:, 0] = before - after
        return out


SMALL = 32  # changed rows up to which a refresh is done row by row in Python


def _need(arrays: ClusterArrays, demand: PodDemand):
    return arrays.need_milli(demand)


def _demand_key(demand: PodDemand) -> tuple:
    return (demand.gpus, demand.gpu_fraction, demand.gpu_memory_mib, demand.cpu_milli)


class _BaseCache:
    """``bound.base`` of every node, kept in step with the arrays through their stamps and
    shared by all pod shapes (a node changed by one placement is recomputed once)."""

    def __init__(self, n: int):
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.data: dict[str, np.ndarray] = {}
        self.lookups = self.hits = 0  # of the per-state memos (``_RowCache.memo``)

    def memo_pays(self) -> bool:
        """Whether looking node states up in the memos is worth its cost in incremental
        refreshes: it is where many nodes share states (big, evenly used clusters;
        rolled-back trials), not where every node's free CPU differs (the FGD simulator's
        small heterogeneous cluster). Either way the scores are the same."""
        return self.lookups < 2000 or self.hits * 4 >= self.lookups

    def memo_seen(self, lookups: int, hits: int) -> None:
        self.lookups += lookups
        self.hits += hits

    def rows(self, bound: _Bound, arrays: ClusterArrays, rows: np.ndarray) -> dict[str, np.ndarray]:
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


class _RowCache:
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
            for r, f in zip(rows, fits):
                masked[r] = score[r] if f else fill
        self.kept_seen = len(log)
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


class FragPolicy:
    """Base of the fragmentation-aware policies: subclasses turn the (R, G) matrix of
    fragmentation deltas into per-node scores with ``_reduce``."""

    name = "frag"
    cache_size = 512
    coverage = 0.95  # share of the demands the mix's most frequent shapes must cover
    gpu_weight = 0.0  # see Mix.from_demands
    bound_class: type = None  # type: ignore[assignment]  # set below: _Bound

    def __init__(self, seed: int | None = None):
        self.mix: Mix = default_mix()
        self.ties = _TieOrder(seed)
        self._last_state: tuple | None = None  # (lineage, mix, params, state) of the last call

    def prepare(self, demands: Sequence[PodDemand], models: Sequence[tuple[str, ...]] | None = None) -> None:
        """Learn the workload mix (the core passes the pending and running demands)."""
        self.mix = Mix.from_demands(demands, models, self.coverage, self.gpu_weight)

    def prepare_counts(self, counts: dict[tuple[PodDemand, tuple[str, ...]], int]) -> None:
        """Learn the workload mix from pod counts per (demand, GPU models), as the
        scheduler's snapshot keeps them."""
        shapes: dict[Shape, float] = {}
        for (d, m), n in counts.items():
            s = shape_of(d, m)
            shapes[s] = shapes.get(s, 0.0) + n
        mix = Mix.from_counts(shapes) if shapes else default_mix()
        # Every arrival nudges the counts; keep the old mix (and with it every per-node score
        # cache) until the shapes change or a probability moves by more than MIX_DRIFT.
        old = self.mix
        if mix.shapes == old.shapes and float(np.abs(mix.probs - old.probs).max()) <= MIX_DRIFT:
            return
        self.mix = mix

    def _state(self, arrays: ClusterArrays):
        last, params = self._last_state, self._params()
        if last is not None and last[0] is arrays.lineage and last[1] is self.mix and last[2] == params:
            return last[3]  # asked for every pod placed: the key below costs more than this
        key = (type(self).__name__, self.mix.token, params)
        caches = arrays.lineage.caches
        st = caches.get(key)
        if st is None:
            if len(caches) > 8:  # old mixes
                caches.clear()
            bound = self.bound_class(self.mix, arrays.models, arrays.gpu_free.shape[1])
            st = caches[key] = (bound, {}, _BaseCache(len(arrays.names)))
        self._last_state = (arrays.lineage, self.mix, params, st)
        return st

    def _params(self) -> tuple:
        return ()

    def _reduce(self, arrays: ClusterArrays, rows: np.ndarray, delta: np.ndarray, demand: PodDemand):
        """(score (R,), slot (R,)) from the delta matrix; higher score is better."""
        slot = np.argmax(delta, axis=1)
        return delta[np.arange(len(rows)), slot], slot

    def node_scores(
        self, arrays: ClusterArrays, demand: PodDemand, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per node: best score and GPU slot for ``demand``; NEG where the pod cannot fit on
        the GPUs (CPU, memory, pool and model are the caller's ``mask``, not checked here).
        Rows outside ``mask`` may be stale: they are rescored when a later call needs them."""
        bound, base, rc = self._row_cache(arrays, demand)
        self._refresh(bound, base, rc, arrays, demand, rc.dirty(arrays, mask))
        return rc.score, rc.slot

    def _row_cache(self, arrays: ClusterArrays, demand: PodDemand) -> tuple[_Bound, _BaseCache, _RowCache]:
        bound, rows_by_shape, base = self._state(arrays)
        key = _demand_key(demand)
        rc = rows_by_shape.get(key)
        if rc is None:
            if len(rows_by_shape) >= self.cache_size:
                rows_by_shape.clear()
            rc = rows_by_shape[key] = _RowCache(len(arrays.names), bound.cpu_cap(demand))
        return bound, base, rc

    def _refresh(self, bound: _Bound, base: _BaseCache, rc: _RowCache, arrays: ClusterArrays, demand: PodDemand, dirty) -> None:
        """Rescore the ``dirty`` rows (a list when few, else an array) in ``rc``."""
        if not len(dirty):
            return
        few = isinstance(dirty, list)  # an incremental refresh, where the memo's worth shows
        use_memo = not few or base.memo_pays()
        if use_memo:
            states = rc.states(arrays, dirty, demand)
            memo = rc.memo
            known = [memo.get(s) for s in states]
            miss = [i for i, k in enumerate(known) if k is None]
            if few:
                base.memo_seen(len(known), len(known) - len(miss))
        else:
            known, miss = [None] * len(dirty), list(range(len(dirty)))
        if miss:
            todo = miss
            if use_memo:  # rows sharing a state are scored once (a cold cache: 4,000 rows, ~200 states)
                first = {}
                for i in miss:
                    first.setdefault(states[i], i)
                todo = list(first.values())
            rows = np.asarray(dirty, dtype=np.int64)
            rows = rows[todo] if len(todo) < len(dirty) else rows
            delta = bound.deltas(arrays, rows, demand, _need(arrays, demand), base.rows(bound, arrays, rows))
            # A delta is a difference of float sums whose order depends on the batch (matrix
            # products over however many rows are scored together, a ``before`` cached from
            # another batch): ~1e-12 of noise, enough to turn an exact 0 into 49 or 50 after
            # the floor of the sigmoid. Rounded, a node's score depends on its state alone,
            # so the memo and the scoring history cannot change a decision.
            delta = np.round(delta, 6)
            score, slot = self._reduce(arrays, rows, delta, demand)
            if use_memo and len(memo) + len(todo) > rc.MEMO_MAX:
                memo.clear()
            for i, sc, sl in zip(todo, score.tolist(), slot.tolist()):
                known[i] = (sc, sl)
                if use_memo:
                    memo[states[i]] = known[i]
            if len(todo) < len(miss):
                for i in miss:
                    known[i] = known[first[states[i]]]
        if few:
            score, slot, stamp, now = rc.score, rc.slot, rc.stamp, arrays.stamp
            for r, (sc, sl) in zip(dirty, known):
                score[r], slot[r], stamp[r] = sc, sl, now[r]
        else:
            sc, sl = zip(*known)
            rc.score[dirty] = sc
            rc.slot[dirty] = sl
            rc.stamp[dirty] = arrays.stamp[dirty]

    def _kept_scores(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> _RowCache:
        """The scores where ``mask`` (kept in step) and the GPU count allow the pod, kept
        between calls (``_RowCache.in_step``): the row cache, its ``masked`` up to date."""
        bound, base, rc = self._row_cache(arrays, demand)
        rc.in_step(arrays, mask, demand.gpus, NEG, lambda rows: self._refresh(bound, base, rc, arrays, demand, rows))
        return rc

    def _best_on_kept(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> tuple[int, int] | None:
        """``place``'s node and slot, unseeded, on a mask kept in step by the arrays: the
        same argmax over the same masked scores, kept between calls."""
        rc = self._kept_scores(arrays, mask, demand)
        node = int(np.argmax(rc.masked))  # the first best: lowest index, as unseeded ties go
        if rc.masked[node] <= NEG / 2:
            return None
        return node, int(rc.slot[node])

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        if self.ties.seed is None and arrays.kept_in_step(mask):
            best = self._best_on_kept(arrays, mask, demand)
            return None if best is None else _choice(arrays, best[0], best[1], demand)
        # Whole GPUs: a cheap exact fit test, which also spares scoring nodes that cannot
        # take the pod. Fractions: the deltas are NEG where no GPU has room, so the mask is
        # enough (testing every slot here would cost N x G per call).
        fit = mask & (arrays.full_free >= demand.gpus) if demand.gpus else mask
        score, slot = self.node_scores(arrays, demand, fit)
        s = np.where(fit, score, NEG)
        node = self.ties.pick(s)
        if node is None:
            return None
        return _choice(arrays, node, int(slot[node]), demand)


class _TieOrder:
    """How a policy breaks ties between equally scored nodes.

    Unseeded (the scheduler): the lowest node index. Seeded (the simulator): the first node
    in a node order shuffled once with the seed. That is what the FGD paper's simulator does
    (it numbers the nodes in a random order and its scheduler fork keeps the first best
    node); with it our BestFit and FGD land within 0.1 point of the published figures, with
    a fresh random pick at every tie they lose about 6 points (FGD) because consistent ties
    pack work onto the same nodes and random ones spread it.
    """

    def __init__(self, seed: int | None):
        self.seed = seed
        self.rank: np.ndarray | None = None

    def pick(self, score: np.ndarray) -> int | None:
        best = int(np.argmax(score))
        top = score[best]
        if top <= NEG / 2:
            return None
        if self.seed is None:
            return best
        if self.rank is None or len(self.rank) != len(score):
            self.rank = np.random.default_rng(self.seed).permutation(len(score))
        ties = np.flatnonzero(score == top)
        return int(ties[np.argmin(self.rank[ties])]) if len(ties) > 1 else best


def _choice(arrays: ClusterArrays, node: int, slot: int, demand: PodDemand) -> Choice:
    # One node's row, in Python: numpy calls on 8 slots cost more than the work.
    if demand.gpus:
        free = [j for j, x in enumerate(arrays.gpu_free[node].tolist()) if x == MILLI]
        return Choice(node, tuple(free[: demand.gpus]), MILLI)
    if demand.gpu_memory_mib:
        return Choice(node, (slot,), int(arrays.need_milli(demand)[node, slot]))
    if demand.is_fractional:
        return Choice(node, (slot,), demand.milli_on(1))
    return Choice(node, (), 0)


def _fits(arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> np.ndarray:
    """Nodes in ``mask`` whose GPUs can hold the pod."""
    if demand.gpus:
        return mask & (arrays.full_free >= demand.gpus)
    if demand.is_fractional:
        need = arrays.need_milli(demand)
        return mask & (arrays.gpu_free >= need).any(axis=1)
    return mask


def _best_slot(arrays: ClusterArrays, node: int, demand: PodDemand) -> int:
    """The GPU with least room that still fits a fraction (first of equals)."""
    need = arrays.need_milli(demand)
    row = arrays.gpu_free[node]
    nd = need if np.isscalar(need) else need[node]
    left = np.where(row >= nd, row - nd, MILLI + 1)
    return int(np.argmin(left))


# -- the baselines of the FGD paper --------------------------------------------------------


class FGD(FragPolicy):
    """The FGD paper's policy as its simulator scores it: per node the GPU whose use grows
    fragmentation least, node score ``int(100 * sigmoid(delta / 1000))``; ties: ``_TieOrder``."""

    name = "fgd"

    def _reduce(self, arrays, rows, delta, demand):
        x = np.clip(delta, -50_000.0, 50_000.0) / 1000.0
        score = np.where(delta > NEG / 2, np.floor(100.0 / (1.0 + np.exp(-x))), NEG)
        slot = np.argmax(score, axis=1)  # first of equal scores, as the simulator
        return score[np.arange(len(rows)), slot], slot


class BestFit:
    """The FGD paper's BestFit: least free CPU and GPU left after the pod, each normalised by
    a full node (128 CPUs, 8 GPUs) and weighted 1/2, as an integer score 0-100; ties:
    ``_TieOrder``. Fractions go on the fitting GPU with least room, whole GPUs on the first free."""

    name = "bestfit"

    def __init__(self, seed: int | None = None):
        self.ties = _TieOrder(seed)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        ok = _fits(arrays, mask, demand)
        gpu_left = np.maximum(arrays.gpu_free, 0).sum(axis=1)
        req_gpu = demand.gpus * MILLI if demand.gpus else (int(np.max(arrays.need_milli(demand))) if demand.is_fractional else 0)
        rest = 0.5 * (arrays.cpu_free - demand.cpu_milli) / MAX_SPEC_CPU + 0.5 * (gpu_left - req_gpu) / MAX_SPEC_GPU
        score = np.where(ok, np.floor((1.0 - rest) * 100.0), NEG)
        node = self.ties.pick(score)
        if node is None:
            return None
        return _choice(arrays, node, _best_slot(arrays, node, demand) if demand.is_fractional else 0, demand)


class RandomFit:
    """Any node that fits, uniformly at random (seeded); the paper's lower baseline."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(0 if seed is None else seed)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        ok = np.flatnonzero(_fits(arrays, mask, demand))
        if not len(ok):
            return None
        node = int(ok[self.rng.integers(len(ok))])
        if demand.is_fractional:
            need = arrays.need_milli(demand)
            nd = need if np.isscalar(need) else need[node]
            slots = np.flatnonzero(arrays.gpu_free[node] >= nd)
            return _choice(arrays, node, int(slots[self.rng.integers(len(slots))]), demand)
        return _choice(arrays, node, 0, demand)


# -- gpupool's own ------------------------------------------------------------------------


class _GpupoolBound(_Bound):
    """FGD's fragmentation and a capacity-aware one; a placement is scored by the worse.

    Capacity-aware fragmentation: against shape t a node's usable GPU milli is what the most
    pods of t it can still take would use, counting CPU as well as GPU room,
    ``n_t = min(sum_g floor(room_g / milli_t) // count_t, cpu_left // cpu_t)``, and
    ``F_t = idle - n_t * milli_t * count_t``. FGD's measure counts every GPU with room for
    one pod as fully usable once one pod fits: blind to the CPU that later pods need and to
    the slack a pod leaves on a GPU (530 free is 60 of waste for 470-milli pods). Alone the
    capacity view spends the few nodes that can take 8-GPU pods (FGD's view guards them by
    how it scores emptiness). Each view sees a waste the other misses, so a placement counts
    as growing fragmentation by the larger of the two growths: ``min`` of the two deltas
    (their mean, used before, let one view's gain hide the other's loss).
    """

    def __init__(self, mix: Mix, models: list[str], g: int):
        super().__init__(mix, models, g)
        gpu = [s for s in mix.shapes if s.milli > 0]
        self.midx = np.searchsorted(self.mvals, [s.milli for s in gpu]).astype(np.int64)  # (T,)
        self.tk = np.array([s.count for s in gpu], dtype=np.int64)
        self.units = np.array([s.milli * s.count for s in gpu], dtype=np.float64)
        self.cpu_div = np.maximum(self.cpu, 1)
        self.free_units = (MILLI // self.mvals)[None, :]  # (1, M): pods of m on a free GPU

    def cpu_cap(self, demand: PodDemand) -> int:
        # Also: CPU for as many pods of every shape as the emptiest node's GPUs could hold,
        # so the CPU never binds the capacity count.
        most = (self.g * self.free_units[0][self.midx]) // self.tk  # (T,)
        return max(super().cpu_cap(demand), int(demand.cpu_milli + (self.cpu * np.maximum(most, 1)).max(initial=0)))

    def _cap_weight(self, model: np.ndarray) -> np.ndarray:
        return self.access[model.astype(np.int64) + 1] * (self.prob * self.units)[None, :]  # (R, T)

    def _cpu_fit(self, cpu: np.ndarray) -> np.ndarray:
        fit = np.maximum(cpu, 0)[:, None] // self.cpu_div[None, :]
        return np.where(self.cpu[None, :] > 0, fit, 1 << 40)  # (R, T)

    def _cap_usable(self, fl: np.ndarray, cpu_fit: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """fl (R, [S,] M) pods-of-m per node -> probability-weighted usable milli (R, [S])."""
        per = fl[..., self.midx] // self.tk  # (R, [S,] T)
        if fl.ndim == 3:
            n = np.minimum(per, cpu_fit[:, None, :])
            return (n * weight[:, None, :]).sum(axis=-1)
        return (np.minimum(per, cpu_fit) * weight).sum(axis=-1)

    def base(self, arrays: ClusterArrays, rows: np.ndarray) -> dict[str, np.ndarray]:
        out = super().base(arrays, rows)
        room = np.maximum(arrays.gpu_free[rows], 0).astype(np.int64)
        fl = (room[:, :, None] // self.mvals[None, None, :]).sum(axis=1)  # (R, M)
        weight = self._cap_weight(arrays.model_id[rows])
        out["fl"] = fl
        out["cap_before"] = -self._cap_usable(fl, self._cpu_fit(arrays.cpu_free[rows]), weight)  # minus idle
        return out

    def deltas(
        self, arrays: ClusterArrays, rows: np.ndarray, demand: PodDemand, need, base: dict | None = None
    ) -> np.ndarray:
        base = self.base(arrays, rows) if base is None else base
        fgd = super().deltas(arrays, rows, demand, need, base)
        left = arrays.gpu_free[rows].astype(np.int64)
        room = np.maximum(left, 0)
        cpu = arrays.cpu_free[rows]
        weight = self._cap_weight(arrays.model_id[rows])
        fl = base["fl"]
        before = base["cap_before"]
        fit_after = self._cpu_fit(cpu - demand.cpu_milli)
        cap = np.full(left.shape, NEG)
        if demand.gpus:
            after = -demand.gpus * MILLI - self._cap_usable(fl - demand.gpus * self.free_units, fit_after, weight)
            cap[:, 0] = before - after
        elif demand.is_fractional:
            nd = need if np.isscalar(need) else need[rows]
            rest = np.maximum(left - nd, 0)
            mv = self.mvals[None, None, :]
            fl1 = fl[:, None, :] - room[:, :, None] // mv + rest[:, :, None] // mv  # (R, G, M)
            cap = before[:, None] + nd + self._cap_usable(fl1, fit_after, weight)
        else:
            cap[:, 0] = before + self._cap_usable(fl, fit_after, weight)
        return np.where(fgd > NEG / 2, np.minimum(fgd, cap), NEG)


FILL_SHARE = 0.04  # share of the fractional pods from which a size counts as sure to come again
RANK_MAX = np.iinfo(np.int64).max


class HoleWaste:
    """How much of a GPU's free room is expected to stay idle for good, by room size and
    by the CPU its node has left.

    ``waste[c, r]`` is the least room left when a room of ``r`` milli on a node with ``c``
    CPUs free is filled only with the fraction sizes the mix makes common (each at least
    ``FILL_SHARE`` of the fractional pods; a size needs the least CPU its shapes ask), any
    number of each, within the ``c`` CPUs: 530 free -> 60 (a 470-milli pod will come, if 8
    CPUs are free), 350 -> 30 (320), 210 -> 210 (only rare pods fit). A free GPU wastes
    nothing (whole-GPU pods take it). Rare sizes are left out on purpose: the 160/110/50-milli
    pods are far fewer than the 190-milli holes of 810-milli pods that wait for them, so a
    room counting on them stays idle.
    """

    def __init__(self, mix: Mix):
        share: dict[int, float] = {}
        cpu: dict[int, int] = {}
        for s, p in zip(mix.shapes, mix.probs):
            if s.count == 1 and 0 < s.milli < MILLI:
                share[s.milli] = share.get(s.milli, 0.0) + float(p)
                cpu[s.milli] = min(cpu.get(s.milli, s.cpu), s.cpu)
        total = sum(share.values()) or 1.0
        sizes = sorted(m for m, p in share.items() if p / total >= FILL_SHARE)
        need = {m: max(1, -(-cpu[m] // 1000)) for m in sizes}  # whole CPUs, at least 1
        # CPUs past which more changes nothing: no set of pods in one GPU's room needs more.
        self.cpus = max((-(-need[m] * MILLI // m) for m in sizes), default=0)
        waste = np.tile(np.arange(MILLI + 1, dtype=np.int64), (self.cpus + 1, 1))
        for c in range(self.cpus + 1):  # unbounded knapsack over room and CPU
            for m in sizes:
                if need[m] <= c:
                    np.minimum(waste[c, m:], waste[c - need[m], : MILLI + 1 - m], out=waste[c, m:])
        waste[:, MILLI] = 0
        self.sizes = tuple(sizes)
        self.waste = waste

    def rank(self, free: np.ndarray, cpu_free: np.ndarray, need: int, cpu: int) -> np.ndarray:
        """(R, G) for nodes with GPU rooms ``free`` and ``cpu_free`` milli-CPU: the rank of
        putting a fraction of ``need`` milli and ``cpu`` milli-CPU on each GPU slot, lower
        is better, ``RANK_MAX`` where it does not fit: first the growth of expected idle
        milli on the node (the slot's leftover room, and the node's other rooms that the CPU
        it takes may leave unfillable), then the room left (best fit)."""
        # np.minimum/np.maximum, not np.clip: the same integers, without clip's Python-level
        # checks (a third of this call on the few rows a placement refreshes).
        left = free.astype(np.int64) - need
        room = np.minimum(np.maximum(free, 0), MILLI)
        c0 = np.minimum(np.maximum(cpu_free // 1000, 0), self.cpus)[:, None]  # a node may be over its CPU
        c1 = np.minimum(np.maximum((cpu_free - cpu) // 1000, 0), self.cpus)[:, None]
        w0 = self.waste[c0, room]
        others = self.waste[c1, room] - w0
        grow = self.waste[c1, np.maximum(left, 0)] - w0 + others.sum(axis=1, keepdims=True) - others
        return np.where(left >= 0, grow * (2 * MILLI) + left, RANK_MAX)


class GpupoolPolicy(FragPolicy):
    """gpupool's placement: the FGD paper's policy on a better fragmentation measure, and
    for fractions, the GPU chosen by the waste its leftover room is expected to keep.

    Score per node: ``int(100 * sigmoid(delta / 1000))`` as FGD, where ``delta`` is the
    growth of fragmentation avoided, the smaller of FGD's measure's and a capacity-aware
    one's (``_GpupoolBound``). The integer score is kept on purpose: it makes near-equal nodes tie,
    and a fixed tie order (lowest node index; the simulator: a seeded node order, as for the
    baselines) then fills nodes one after another, which keeps whole nodes free for large
    pods; exact deltas with packing tie-breaks did worse in the simulator. Deterministic
    when unseeded, as the scheduler core needs.

    A fraction first picks the *room size* it goes into, over every GPU that fits: the one
    whose expected idle milli (``HoleWaste``) grows least, then the least room left; then
    the node, among those with such a GPU, by the score above. Both fragmentation measures
    score a room by what fits in it now, so a 320-milli pod filled the 530 left by a 470
    (leaving 210 that almost nothing fits) rather than open a GPU, where the 530 would have
    been filled by the next 470 (60 left) and the 320 paired with a 650 (30 left).
    """

    name = "gpupool"
    bound_class = _GpupoolBound

    def _reduce(self, arrays, rows, delta, demand):
        return FGD._reduce(self, arrays, rows, delta, demand)

    def _holes(self) -> HoleWaste:
        hw = getattr(self, "_hole_waste", None)
        if hw is None or hw[0] is not self.mix:
            hw = self._hole_waste = (self.mix, HoleWaste(self.mix))
        return hw[1]

    def _hole_ranks(self, arrays: ClusterArrays, demand: PodDemand, need: int, mask: np.ndarray):
        """Per node: the best ``HoleWaste.rank`` of its GPU slots for ``demand`` (inf where
        none fits) and that slot (the first of equals), kept per pod shape in the arrays'
        lineage like the node scores and refreshed only for the rows whose stamp moved."""
        rc = self._hole_cache(arrays, demand)
        self._refresh_holes(rc, arrays, demand, need, rc.dirty(arrays, mask))
        return rc.score, rc.slot

    def _hole_cache(self, arrays: ClusterArrays, demand: PodDemand) -> _RowCache:
        _, rows_by_shape, _ = self._state(arrays)
        key = ("holes",) + _demand_key(demand)
        rc = rows_by_shape.get(key)
        if rc is None:
            if len(rows_by_shape) >= self.cache_size:
                rows_by_shape.clear()
            rc = rows_by_shape[key] = _RowCache(len(arrays.names), 0)
        return rc

    def _refresh_holes(self, rc: _RowCache, arrays: ClusterArrays, demand: PodDemand, need: int, dirty) -> None:
        if not len(dirty):
            return
        holes = self._holes()

        def ranks(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rank = holes.rank(arrays.gpu_free[rows], arrays.cpu_free[rows], need, demand.cpu_milli)
            slot = np.argmin(rank, axis=1)
            best = rank[np.arange(len(rows)), slot]
            return np.where(best == RANK_MAX, np.inf, best), slot

        if not isinstance(dirty, list):
            rows = np.asarray(dirty, dtype=np.int64)
            rc.score[rows], rc.slot[rows] = ranks(rows)
            rc.stamp[rows] = arrays.stamp[rows]
            return
        # A few rows (a placement's refresh): looked up by node state first, as the scores
        # are (``_RowCache.memo``). A rank reads the GPU rooms and the node's whole CPUs
        # before and after the pod, each capped at ``holes.cpus``: that is the state.
        free, cpu_free, cap, cpu = arrays.gpu_free, arrays.cpu_free, holes.cpus, demand.cpu_milli
        keys = []
        for r in dirty:
            c = int(cpu_free[r])
            keys.append((free[r].tobytes(), min(max(c // 1000, 0), cap), min(max((c - cpu) // 1000, 0), cap)))
        memo = rc.memo
        miss = [i for i, key in enumerate(keys) if key not in memo]
        if miss:
            if len(memo) + len(miss) > rc.MEMO_MAX:
                memo.clear()
            best, slot = ranks(np.asarray([dirty[i] for i in miss], dtype=np.int64))
            for i, b, sl in zip(miss, best.tolist(), slot.tolist()):
                memo[keys[i]] = (b, sl)
        score, slots, stamp, now = rc.score, rc.slot, rc.stamp, arrays.stamp
        for r, key in zip(dirty, keys):
            score[r], slots[r] = memo[key]
            stamp[r] = now[r]

    def _fraction_on_kept(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand, need: int) -> Choice | None:
        """``place`` for a fraction, unseeded, on a mask kept in step by the arrays: the
        same room ranks, kept between calls (``_RowCache.in_step``), and the same node
        scores, brought up to date and read for the candidates only (few), not masked
        N-wide."""
        holes = self._hole_cache(arrays, demand)
        rank = holes.in_step(arrays, mask, 0, np.inf, lambda rows: self._refresh_holes(holes, arrays, demand, need, rows))
        best = rank.min()
        if best == np.inf:
            return None
        nodes = np.flatnonzero(rank == best)  # ascending: argmax below keeps the lowest index
        # Only the candidates' scores are read, so only they are brought up to date.
        bound, base, rc = self._row_cache(arrays, demand)
        stale = nodes[rc.stamp[nodes] != arrays.stamp[nodes]]
        self._refresh(bound, base, rc, arrays, demand, stale.tolist() if len(stale) <= SMALL else stale)
        scores = rc.score[nodes]
        i = int(np.argmax(scores))
        node = int(nodes[i] if scores[i] > NEG / 2 else nodes[0])  # else: as ``place``'s fallback
        return Choice(node, (int(holes.slot[node]),), need)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        if not demand.is_fractional:
            return super().place(arrays, mask, demand)
        need = arrays.need_milli(demand)
        if not np.isscalar(need):  # a memory request: its milli differ by GPU
            return super().place(arrays, mask, demand)
        if self.ties.seed is None and arrays.kept_in_step(mask):
            return self._fraction_on_kept(arrays, mask, demand, int(need))
        rank, slot = self._hole_ranks(arrays, demand, int(need), mask)
        rank = np.where(mask, rank, np.inf)
        best = rank.min()
        if best == np.inf:
            return None
        nodes = rank == best
        score, _ = self.node_scores(arrays, demand, nodes)
        node = self.ties.pick(np.where(nodes, score, NEG))
        if node is None:  # cannot happen (a candidate GPU fits); kept total
            node = int(np.argmax(nodes))
        return Choice(node, (int(slot[node]),), int(need))


class GpupoolKeepWhole(GpupoolPolicy):
    """gpupool's placement for a live cluster, where pods wait for room and nodes empty
    again: it keeps the largest nodes (the cluster's most GPUs) whole for the pods that
    need a whole node. A GPU pod whose scored choice is such a node with no GPU taken goes
    to the best other node that can take it instead (a used one, or a smaller node), and
    where none can, to the smallest whole largest node (GPUs / 8 + CPUs / 128, BestFit's
    measure): a 96-CPU node before a 128-CPU one, which stays whole for an 8-GPU pod that
    asks for 120 CPUs.

    Why a policy of its own: the fragmentation views weigh a pod shape by how often it
    comes, so the rare 8-GPU pods (0.6% of the openb pods, 6% of their GPUs) fall outside
    them; in the live trace replay those pods then waited while the cluster was 70-90%
    allocated. In the FGD paper's one-shot fill, where a pod that does not fit is dropped
    rather than waiting, the same rule costs allocation (``gpupool`` stays the default
    there and in the scheduler; the README has both figures). Asked only when the scored
    choice is an unused largest node: where the best node overall is a used one, it is
    also the best used one."""

    name = "gpupool-keepwhole"

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        choice = super().place(arrays, mask, demand)
        if choice is None or not demand.gpu_count:
            return choice
        n, largest = choice.node, arrays.gpu_count.max()
        if arrays.gpu_count[n] < largest or arrays.full_free[n] < largest:
            return choice
        whole = (arrays.full_free == largest) & (arrays.gpu_count == largest)
        others = mask & ~whole
        if others.any():
            elsewhere = super().place(arrays, others, demand)
            if elsewhere is not None:
                return elsewhere
        whole = _fits(arrays, mask & whole, demand)
        size = np.where(whole, arrays.gpu_count / 8 + arrays.cpu_free / MAX_SPEC_CPU, np.inf)
        return super().place(arrays, whole & (size == size.min()), demand)


FragPolicy.bound_class = _Bound
