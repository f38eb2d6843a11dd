"""Fragmentation views: the measure the scoring policies share, bound to a cluster.

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

Shapes are grouped by their per-GPU milli (``M`` distinct values) so the work per row is
``G x M`` instead of ``G x T`` shapes: for fixed CPU left, the weight of the shapes a node can
host is a table ``W[m, c]`` over "c GPUs have room for m", built with one small matmul.

Two views, each a mix bound to an arrays lineage's model numbering: ``FgdView`` (FGD's
measure) and ``GpupoolView`` (FGD's and a capacity-aware one, a placement scored by the
worse). The per-node caches of their scores are in ``score_cache``.
"""

from __future__ import annotations

import numpy as np

from ..cluster import ClusterArrays
from ..model import MILLI, PodDemand
from .choice import NEG
from .mix import Mix


class FgdView:
    """FGD's view: a mix bound to one arrays lineage's model numbering, dense tables for
    the math."""

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
            nd = need if isinstance(need, int) else need[rows]
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


class GpupoolView(FgdView):
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
            nd = need if isinstance(need, int) else need[rows]
            rest = np.maximum(left - nd, 0)
            mv = self.mvals[None, None, :]
            fl1 = fl[:, None, :] - room[:, :, None] // mv + rest[:, :, None] // mv  # (R, G, M)
            cap = before[:, None] + nd + self._cap_usable(fl1, fit_after, weight)
        else:
            cap[:, 0] = before + self._cap_usable(fl, fit_after, weight)
        return np.where(fgd > NEG / 2, np.minimum(fgd, cap), NEG)
