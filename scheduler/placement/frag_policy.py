"""``FragPolicy``: the base of the policies that score nodes by a fragmentation view
(``views``), over the per-node score caches (``score_cache``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from ..cluster import ClusterArrays
from ..model import PodDemand
from .choice import NEG, Choice, TieOrder, choice_at
from .mix import Mix, Shape, default_mix, shape_of
from .score_cache import BaseCache, RowCache, demand_key
from .views import FgdView

MIX_DRIFT = 0.02  # how far a shape's probability may move before the mix is re-learnt


class FragPolicy:
    """Base of the fragmentation-aware policies: subclasses turn the (R, G) matrix of
    fragmentation deltas into per-node scores with ``_reduce``."""

    name = "frag"
    cache_size = 512
    coverage = 0.95  # share of the demands the mix's most frequent shapes must cover
    gpu_weight = 0.0  # see Mix.from_demands
    view_class: type = FgdView  # the fragmentation view its scores come from

    def __init__(self, seed: int | None = None):
        self.mix: Mix = default_mix()
        self.ties = TieOrder(seed)
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
            bound = self.view_class(self.mix, arrays.models, arrays.gpu_free.shape[1])
            st = caches[key] = (bound, {}, BaseCache(len(arrays.names)))
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

    def _row_cache(self, arrays: ClusterArrays, demand: PodDemand) -> tuple[FgdView, BaseCache, RowCache]:
        bound, rows_by_shape, base = self._state(arrays)
        key = demand_key(demand)
        rc = rows_by_shape.get(key)
        if rc is None:
            if len(rows_by_shape) >= self.cache_size:
                rows_by_shape.clear()
            rc = rows_by_shape[key] = RowCache(len(arrays.names), bound.cpu_cap(demand))
        return bound, base, rc

    def _refresh(self, bound: FgdView, base: BaseCache, rc: RowCache, arrays: ClusterArrays, demand: PodDemand, dirty) -> None:
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
                first: dict[tuple, int] = {}
                for i in miss:
                    first.setdefault(states[i], i)
                todo = list(first.values())
            rows = np.asarray(dirty, dtype=np.int64)
            rows = rows[todo] if len(todo) < len(dirty) else rows
            delta = bound.deltas(arrays, rows, demand, arrays.need_milli(demand), base.rows(bound, arrays, rows))
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
                known[i] = pair = (sc, sl)
                if use_memo:
                    memo[states[i]] = pair
            if len(todo) < len(miss):
                for i in miss:
                    known[i] = known[first[states[i]]]
        filled = cast("list[tuple[float, int]]", known)  # every row scored or remembered now
        if few:
            score, slot, stamp, now = rc.score, rc.slot, rc.stamp, arrays.stamp
            for r, (sc, sl) in zip(dirty, filled):
                score[r], slot[r], stamp[r] = sc, sl, now[r]
        else:
            sc, sl = zip(*filled)
            rc.score[dirty] = sc
            rc.slot[dirty] = sl
            rc.stamp[dirty] = arrays.stamp[dirty]

    def _kept_scores(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> RowCache:
        """The scores where ``mask`` (kept in step) and the GPU count allow the pod, kept
        between calls (``RowCache.in_step``): the row cache, its ``masked`` up to date."""
        bound, base, rc = self._row_cache(arrays, demand)
        rc.in_step(arrays, mask, demand.gpus, NEG, lambda rows: self._refresh(bound, base, rc, arrays, demand, rows))
        return rc

    def _best_on_kept(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> tuple[int, int] | None:
        """``place``'s node and slot, unseeded, on a mask kept in step by the arrays: the
        same argmax over the same masked scores, kept between calls."""
        rc = self._kept_scores(arrays, mask, demand)
        masked = rc.masked
        assert masked is not None  # kept in step by in_step
        off = self._keep_off(arrays)
        node = int(np.argmax(masked if off is None else masked - off))  # the first best: lowest index, as unseeded ties go
        if masked[node] <= NEG / 2:
            return None
        return node, int(rc.slot[node])

    def _keep_off(self, arrays: ClusterArrays) -> np.ndarray | None:
        """Per node, a penalty below 1 that only parts nodes of equal integer score (lower
        is preferred), or None for none (the default)."""
        return None

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        if self.ties.seed is None and arrays.kept_in_step(mask):
            best = self._best_on_kept(arrays, mask, demand)
            return None if best is None else choice_at(arrays, best[0], best[1], demand)
        # Whole GPUs: a cheap exact fit test, which also spares scoring nodes that cannot
        # take the pod. Fractions: the deltas are NEG where no GPU has room, so the mask is
        # enough (testing every slot here would cost N x G per call).
        fit = mask & (arrays.full_free >= demand.gpus) if demand.gpus else mask
        score, slot = self.node_scores(arrays, demand, fit)
        s = np.where(fit, score, NEG)
        off = self._keep_off(arrays)
        if off is not None:
            s = s - off
        node = self.ties.pick(s)
        if node is None:
            return None
        return choice_at(arrays, node, int(slot[node]), demand)
