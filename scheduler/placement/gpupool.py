"""gpupool's own placement: the FGD paper's policy on gpupool's fragmentation view
(``views.GpupoolView``), fractions placed by the waste their leftover room is expected to
keep (``HoleWaste``); and its variant for a live cluster that keeps the largest nodes whole."""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, PodDemand
from .baselines import FGD, MAX_SPEC_CPU
from .choice import NEG, Choice, fits
from .frag_policy import FragPolicy
from .mix import Mix
from .score_cache import SMALL, RowCache, demand_key
from .views import GpupoolView

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
    one's (``GpupoolView``). The integer score is kept on purpose: it makes near-equal nodes tie,
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
    view_class = GpupoolView
    KEEP_OFF_MAX = 0.5  # the most a scarce model's nodes lose: below one point of score, ties only

    def _keep_off(self, arrays: ClusterArrays) -> np.ndarray | None:
        """Keep scarce GPU models for the pods that need them: among nodes of equal score,
        prefer those whose GPU model is not scarce. A model is scarce when the pods of the
        mix that name it ask for a larger share of the GPU milli than the model's share of
        the cluster's GPUs (a shape naming several models counts for each in equal parts):
        ``f`` = that demand share over that supply share, above 1. The penalty of a scarce
        model's nodes is ``KEEP_OFF_MAX * (1 - 1 / f)``: more for a model asked for far
        beyond its supply, never a whole point of score. Models asked for within their
        supply get none, so where no model is scarce (or no shape names one) the result is
        None and every decision is as without the rule."""
        last = getattr(self, "_keep_off_state", None)
        if last is not None and last[0] is arrays.lineage and last[1] is self.mix:
            return last[2]
        off = None
        models = arrays.models
        named = np.zeros(len(models) + 1, dtype=np.float64)  # index: model id + 1
        total = 0.0
        for shape, p in zip(self.mix.shapes, self.mix.probs):
            milli = float(p) * shape.milli * shape.count
            total += milli
            ids = [models.index(m) + 1 for m in shape.models if m in models]
            for k in ids:
                named[k] += milli / len(ids)
        if named.any() and total > 0:
            gpus = np.bincount(arrays.model_id.astype(np.int64) + 1, weights=arrays.gpu_count, minlength=len(models) + 1)
            gpus[0] = 0.0  # nodes without GPUs
            f = np.zeros(len(models) + 1, dtype=np.float64)
            np.divide(named / total, gpus / gpus.sum(), out=f, where=gpus > 0)
            if (f > 1.0).any():
                pen = np.where(f > 1.0, self.KEEP_OFF_MAX * (1.0 - 1.0 / np.maximum(f, 1.0)), 0.0)
                off = pen[arrays.model_id.astype(np.int64) + 1]
        self._keep_off_state = (arrays.lineage, self.mix, off)
        return off

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

    def _hole_cache(self, arrays: ClusterArrays, demand: PodDemand) -> RowCache:
        _, rows_by_shape, _ = self._state(arrays)
        key = ("holes",) + demand_key(demand)
        rc = rows_by_shape.get(key)
        if rc is None:
            if len(rows_by_shape) >= self.cache_size:
                rows_by_shape.clear()
            rc = rows_by_shape[key] = RowCache(len(arrays.names), 0)
        return rc

    def _refresh_holes(self, rc: RowCache, arrays: ClusterArrays, demand: PodDemand, need: int, dirty) -> None:
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
        # are (``RowCache.memo``). A rank reads the GPU rooms and the node's whole CPUs
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
        same room ranks, kept between calls (``RowCache.in_step``), and the same node
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
        off = self._keep_off(arrays)
        i = int(np.argmax(scores if off is None else scores - off[nodes]))
        node = int(nodes[i] if scores[i] > NEG / 2 else nodes[0])  # else: as ``place``'s fallback
        return Choice(node, (int(holes.slot[node]),), need)

    def place(self, arrays: ClusterArrays, mask: np.ndarray, demand: PodDemand) -> Choice | None:
        if not demand.is_fractional:
            return super().place(arrays, mask, demand)
        need = arrays.need_milli(demand)
        if not isinstance(need, int):  # a memory request: its milli differ by GPU
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
        off = self._keep_off(arrays)
        node = self.ties.pick(np.where(nodes, score if off is None else score - off, NEG))
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
        whole = fits(arrays, mask & whole, demand)
        size = np.where(whole, arrays.gpu_count / 8 + arrays.cpu_free / MAX_SPEC_CPU, np.inf)
        return super().place(arrays, whole & (size == size.min()), demand)
