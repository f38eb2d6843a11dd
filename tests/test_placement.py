"""Placement policies: the fragmentation measure against its definition, the stamp cache
against a fresh computation, and every policy's choices against the arrays' rules."""

from __future__ import annotations

import numpy as np
import pytest

import scheduler.cluster as cluster_module
from scheduler.cluster import ClusterArrays
from scheduler.model import GPU, MILLI, Node, PodDemand
from scheduler.placement import POLICIES, Choice, get_policy
from scheduler.placement.choice import NEG
from scheduler.placement.frag_policy import FragPolicy
from scheduler.placement.gpupool import GpupoolPolicy, HoleWaste
from scheduler.placement.mix import Mix, Shape
from scheduler.placement.views import FgdView, GpupoolView

MIX = Mix(
    [
        Shape(4000, 1000, 1),
        Shape(8000, 500, 1),
        Shape(2000, 0, 0),
        Shape(16000, 1000, 2),
        Shape(1000, 300, 1, ("A",)),
        Shape(30000, 1000, 4, ("B",)),
    ],
    [5, 3, 2, 1, 1, 1],
)


def random_cluster(seed: int, n: int = 40) -> ClusterArrays:
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(n):
        g = int(rng.choice([0, 1, 2, 4, 8]))
        model = "AB"[i % 2]
        nodes.append(Node(f"n{i}", [GPU(j, model, 16000) for j in range(g)], cpu_milli=int(rng.integers(8, 64)) * 1000))
    arrays = ClusterArrays.from_nodes(nodes)
    for i in range(n):  # random load, through take so the derived columns stay true
        for j in range(int(arrays.gpu_count[i])):
            used = int(rng.choice([0, 0, 1000, 500, 810, 190, 700]))
            if used:
                arrays.take(i, (j,), used, 0, 0)
        arrays.take(i, (), 0, int(rng.integers(0, arrays.cpu_free[i] // 1000 + 1)) * 1000, 0)
    return arrays


def frag_by_definition(left: list[int], cpu: int, model: str | None) -> float:
    """The FGD paper's node fragmentation, one shape at a time."""
    idle = sum(left)
    total = 0.0
    for s, p in zip(MIX.shapes, MIX.probs):
        if s.milli == 0:
            total += p * idle
            continue
        access = model is not None and (not s.models or model in s.models)
        can = sum(1 for x in left if x >= s.milli) >= s.count and cpu >= s.cpu
        total += p * (sum(x for x in left if x < s.milli) if access and can else idle)
    return total


DEMANDS = [
    pytest.param(PodDemand(gpu_fraction=0.3, cpu_milli=2000), id="fraction"),
    pytest.param(PodDemand(gpus=1, cpu_milli=1000), id="one-gpu"),
    pytest.param(PodDemand(gpus=2, cpu_milli=4000), id="two-gpus"),
    pytest.param(PodDemand(cpu_milli=8000), id="cpu-only"),
]


@pytest.mark.parametrize("demand", DEMANDS)
def test_frag_delta_matches_definition(demand):
    arrays = random_cluster(1)
    bound = FgdView(MIX, arrays.models, arrays.gpu_free.shape[1])
    rows = np.arange(len(arrays.names))
    delta = bound.deltas(arrays, rows, demand, arrays.need_milli(demand))
    for n in rows:
        left = [int(x) for x in arrays.gpu_free[n] if x >= 0]
        cpu = int(arrays.cpu_free[n])
        model = arrays.models[arrays.model_id[n]] if arrays.model_id[n] >= 0 else None
        before = frag_by_definition(left, cpu, model)
        if demand.is_fractional:
            need = demand.milli_on(1)
            for j, x in enumerate(left):
                if x >= need:
                    after = list(left)
                    after[j] -= need
                    assert delta[n, j] == pytest.approx(before - frag_by_definition(after, cpu - demand.cpu_milli, model))
                else:
                    assert delta[n, j] <= NEG / 2
        elif demand.gpus:
            free = [j for j, x in enumerate(left) if x == MILLI]
            if len(free) < demand.gpus:
                assert delta[n, 0] <= NEG / 2
                continue
            after = list(left)
            for j in free[: demand.gpus]:
                after[j] = 0
            assert delta[n, 0] == pytest.approx(before - frag_by_definition(after, cpu - demand.cpu_milli, model))
        else:
            assert delta[n, 0] == pytest.approx(before - frag_by_definition(left, cpu - demand.cpu_milli, model))


def cap_frag_by_definition(left: list[int], cpu: int, model: str | None) -> float:
    """gpupool's capacity-aware fragmentation, one shape at a time."""
    idle = sum(left)
    total = 0.0
    for s, p in zip(MIX.shapes, MIX.probs):
        if s.milli == 0 or model is None or (s.models and model not in s.models):
            total += p * idle
            continue
        n = sum(x // s.milli for x in left) // s.count
        if s.cpu:
            n = min(n, max(cpu, 0) // s.cpu)
        total += p * (idle - n * s.milli * s.count)
    return total


@pytest.mark.parametrize("demand", DEMANDS)
def test_gpupool_delta_is_worse_of_fgd_and_capacity_deltas(demand):
    arrays = random_cluster(5)
    rows = np.arange(len(arrays.names))
    fgd = FgdView(MIX, arrays.models, arrays.gpu_free.shape[1]).deltas(arrays, rows, demand, arrays.need_milli(demand))
    mixed = GpupoolView(MIX, arrays.models, arrays.gpu_free.shape[1]).deltas(arrays, rows, demand, arrays.need_milli(demand))
    for n in rows:
        left = [int(x) for x in arrays.gpu_free[n] if x >= 0]
        cpu = int(arrays.cpu_free[n])
        model = arrays.models[arrays.model_id[n]] if arrays.model_id[n] >= 0 else None
        before = cap_frag_by_definition(left, cpu, model)
        for j in range(arrays.gpu_free.shape[1]):
            if fgd[n, j] <= NEG / 2:
                assert mixed[n, j] <= NEG / 2
                continue
            after = list(left)
            if demand.is_fractional:
                after[j] -= demand.milli_on(1)
            elif demand.gpus:
                for i in [i for i, x in enumerate(left) if x == MILLI][: demand.gpus]:
                    after[i] = 0
            cap = before - cap_frag_by_definition(after, cpu - demand.cpu_milli, model)
            assert mixed[n, j] == pytest.approx(min(fgd[n, j], cap))


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("log_max", [None, 7])
@pytest.mark.parametrize("name", ["fgd", "gpupool"])
def test_stamp_cache_equals_fresh_computation(name, log_max, kept, monkeypatch):
    """Scores from the cache (per-node stamps, the change log, the per-state memo) stay equal
    to a recomputation through takes, gives and copies; also when the change log restarts
    often (``log_max``), and on the arrays' kept masks (``kept``: the masked scores kept
    between calls), with calls on other masks in between."""
    if log_max is not None:
        monkeypatch.setattr(cluster_module, "CHANGE_LOG_MAX", log_max)
    base = random_cluster(2)
    policy = get_policy(name)
    policy.mix = MIX
    rng = np.random.default_rng(3)
    demands = [PodDemand(gpu_fraction=0.5, cpu_milli=1000), PodDemand(gpus=1, cpu_milli=2000), PodDemand(cpu_milli=500)]
    for _ in range(3):  # cycles: each works on a copy, as the core does
        arrays = base.copy()
        taken: list[tuple] = []
        for _ in range(60):
            d = demands[int(rng.integers(len(demands)))]
            if taken and rng.random() < 0.3:
                arrays.give(*taken.pop(int(rng.integers(len(taken)))))
                continue
            if kept and rng.random() < 0.2:  # a gang-like call on a mask of its own
                some = arrays.eligible(None, (), d) & (rng.random(len(arrays.names)) < 0.5)
                policy.place(arrays, some, d)
            mask = arrays.eligible_view(None, (), d) if kept else arrays.eligible(None, (), d)
            assert arrays.kept_in_step(mask) == kept
            c = policy.place(arrays, mask, d)
            fresh = get_policy(name)
            fresh.mix = MIX
            fresh_arrays = arrays.copy()
            fresh_arrays.lineage = type(arrays.lineage)()  # a new lineage: empty caches
            want = fresh.place(fresh_arrays, mask.copy(), d)
            assert c == want
            if c is not None:
                args = (c.node, c.gpus, c.milli, d.cpu_milli, d.memory_mib)
                arrays.take(*args)
                taken.append(args)


@pytest.mark.parametrize("name", ["fgd", "gpupool"])
def test_scores_ignore_float_summation_noise(name, monkeypatch):
    """A delta is a difference of float sums whose order depends on which rows are scored
    together; the ~1e-12 that leaves must not move a score (an exact 0 would floor to 49 or
    50 by chance, and a node's score would then hang on the cache's history). In a replay of
    the openb trace it did: the per-state memo changed which node got a whole-GPU pod."""
    arrays = random_cluster(4, n=60)
    clean = get_policy(name)
    clean.mix = MIX
    demands = [PodDemand(gpus=1, cpu_milli=1000), PodDemand(gpu_fraction=0.3, cpu_milli=2000), PodDemand(cpu_milli=800)]
    want = [clean.node_scores(arrays, d, None)[0].copy() for d in demands]
    real = type(clean).view_class.deltas

    def noisy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        return np.where(out > NEG / 2, out - 3e-12, out)  # an exact 0 comes out a hair below

    monkeypatch.setattr(type(clean).view_class, "deltas", noisy)
    for d, w in zip(demands, want):
        fresh = get_policy(name)
        fresh.mix = MIX
        fresh_arrays = arrays.copy()
        fresh_arrays.lineage = type(arrays.lineage)()  # empty caches: every row is scored anew
        assert np.array_equal(fresh.node_scores(fresh_arrays, d, None)[0], w), d


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("demand", DEMANDS)
def test_choices_follow_the_rules(name, demand):
    arrays = random_cluster(4)
    policy = get_policy(name, seed=7)
    if isinstance(policy, FragPolicy):
        policy.mix = MIX
    for _ in range(30):
        mask = arrays.eligible(None, ("A",), demand) if demand.gpu_count else arrays.eligible(None, (), demand)
        c = policy.place(arrays, mask, demand)
        if c is None:
            assert not any(
                mask[n] and (demand.gpus and arrays.full_free[n] >= demand.gpus or demand.is_fractional and (arrays.gpu_free[n] >= demand.milli_on(1)).any() or not demand.gpu_count)
                for n in range(len(arrays.names))
            )
            break
        assert isinstance(c, Choice) and mask[c.node]
        assert len(c.gpus) == demand.gpu_count and len(set(c.gpus)) == len(c.gpus)
        for j in c.gpus:
            assert arrays.gpu_free[c.node, j] >= c.milli
        if demand.gpu_count:
            assert arrays.models[arrays.model_id[c.node]] == "A"
        arrays.take(c.node, c.gpus, c.milli, demand.cpu_milli, demand.memory_mib)
        assert (arrays.gpu_free[arrays.gpu_free >= 0] <= MILLI).all() and (arrays.cpu_free >= 0).all()


def test_gpupool_is_deterministic_and_fills_holes():
    """The scheduler's policy: same input, same answer; a fraction goes into an existing
    hole of its size rather than opening a fresh GPU."""
    nodes = [Node("a", [GPU(i, "T4", 15000) for i in range(4)]), Node("b", [GPU(i, "T4", 15000) for i in range(4)])]
    arrays = ClusterArrays.from_nodes(nodes)
    arrays.take(1, (2,), 500, 0, 0)
    d = PodDemand(gpu_fraction=0.5, cpu_milli=1000)
    mask = arrays.eligible(None, (), d)
    picks = {get_policy("gpupool").place(arrays, mask, d) for _ in range(3)}
    assert picks == {Choice(1, (2,), 500)}


def test_gpupool_counts_a_loss_only_one_view_sees():
    """A cost that only one of the two fragmentation views sees is not averaged away.

    A CPU-only pod (4 CPUs); node 0: 8 free GPUs, 48 CPUs free; node 1: 6 free GPUs, 12 CPUs
    free. Both views charge node 0 the 8-GPU shape's place (0.1 x 8000 = -800). On node 1
    FGD sees no loss (every shape still fits), the capacity view sees GPUs stranded for
    want of CPU (one 1-GPU pod: 0.6 x 1000, two 500-milli pods: 0.3 x 1000; -900). The mean
    (-450) sent the pod to node 1; the worse view's growth sends it to node 0."""
    mix = Mix([Shape(4000, 1000, 1), Shape(2000, 500, 1), Shape(48000, 1000, 8)], [6, 3, 1])
    nodes = [Node("a", [GPU(j, "A100", 81920) for j in range(8)], cpu_milli=64000), Node("b", [GPU(j, "A100", 81920) for j in range(8)], cpu_milli=16000)]
    arrays = ClusterArrays.from_nodes(nodes)
    arrays.take(0, (), 0, 16000, 0)
    arrays.take(1, (0, 1), MILLI, 4000, 0)
    d = PodDemand(cpu_milli=4000)
    rows = np.arange(2)
    fgd = FgdView(mix, arrays.models, 8).deltas(arrays, rows, d, arrays.need_milli(d))[:, 0]
    ours = GpupoolView(mix, arrays.models, 8).deltas(arrays, rows, d, arrays.need_milli(d))[:, 0]
    assert fgd.tolist() == pytest.approx([-800, 0]) and ours.tolist() == pytest.approx([-800, -900])
    policy = get_policy("gpupool")
    policy.mix = mix
    assert policy.place(arrays, arrays.eligible(None, (), d), d) == Choice(0, (), 0)


# Fractions as in the openb trace: 470 and 320 common, 650 less, 160 rare (under FILL_SHARE).
FRACTION_MIX = Mix(
    [Shape(8000, 470, 1), Shape(4000, 320, 1), Shape(12000, 650, 1), Shape(4000, 160, 1), Shape(4000, 1000, 1)],
    [30, 25, 20, 1, 24],
)


def test_hole_waste_counts_only_common_fillers_and_their_cpu():
    hw = HoleWaste(FRACTION_MIX)
    assert hw.sizes == (320, 470, 650)  # 160 is too rare to count on
    w = hw.waste[hw.cpus]  # CPU to spare
    assert (w[530], w[350], w[680], w[210], w[190], w[1000]) == (60, 30, 30, 210, 190, 0)
    assert hw.waste[7, 530] == 210  # no CPU for a 470 (8 CPUs): only a 320 (4 CPUs) fits
    assert hw.waste[3, 530] == 530


def test_gpupool_keeps_a_room_for_the_pod_that_fills_it():
    """A 320-milli pod next to a 530 room (a 470 on the GPU): both fragmentation views
    score the room by what fits now and put the pod there, leaving 210 that only rare pods
    fit; gpupool opens a free GPU (680 left: a 650 or two 320s fill it), keeping the 530
    for the next 470 (60 left). A 350 room (a 650 on the GPU) it fills: 30 left."""
    nodes = [Node("a", [GPU(i, "T4", 15000) for i in range(4)], cpu_milli=64000), Node("b", [GPU(i, "T4", 15000) for i in range(4)], cpu_milli=64000)]
    arrays = ClusterArrays.from_nodes(nodes)
    arrays.take(0, (1,), 470, 8000, 0)
    d = PodDemand(gpu_fraction=0.32, cpu_milli=4000)
    policy = get_policy("gpupool")
    policy.mix = FRACTION_MIX
    mask = arrays.eligible(None, (), d)
    assert FragPolicy.place(policy, arrays, mask, d) == Choice(0, (1,), 320)  # the node score alone
    c = policy.place(arrays, mask, d)
    assert c is not None and arrays.gpu_free[c.node, c.gpus[0]] == MILLI
    arrays.take(1, (3,), 650, 12000, 0)
    assert policy.place(arrays, arrays.eligible(None, (), d), d) == Choice(1, (3,), 320)


def test_gpupool_leaves_a_room_the_cpu_to_be_filled():
    """A 470-milli pod (8 CPUs) opens a GPU either way, leaving 530: on node a only 2 CPUs
    would be left, too few for the 470 that would fill the room, so it goes to node b."""
    nodes = [Node("a", [GPU(i, "T4", 15000) for i in range(2)], cpu_milli=10000), Node("b", [GPU(i, "T4", 15000) for i in range(2)], cpu_milli=64000)]
    arrays = ClusterArrays.from_nodes(nodes)
    d = PodDemand(gpu_fraction=0.47, cpu_milli=8000)
    rank = HoleWaste(FRACTION_MIX).rank(arrays.gpu_free, arrays.cpu_free, 470, 8000)
    assert rank[:, 0].tolist() == [530 * 2 * MILLI + 530, 60 * 2 * MILLI + 530]
    policy = get_policy("gpupool")
    policy.mix = FRACTION_MIX
    assert policy.place(arrays, arrays.eligible(None, (), d), d).node == 1


def test_gpupool_counts_the_rooms_a_pods_cpu_strands():
    """Node a has a 530 room (a 470 on it) and 12 CPUs free; a 320-milli pod with 8 CPUs
    on its free GPU would leave 4 CPUs: too few for the 470 that fills the room (its
    expected idle goes from 60 to 210) and for more than one 320 in the new room (680 ->
    360), so it goes to node b, where the CPU is plentiful (680 -> 30)."""
    nodes = [Node("a", [GPU(i, "T4", 15000) for i in range(2)], cpu_milli=20000), Node("b", [GPU(i, "T4", 15000) for i in range(2)], cpu_milli=64000)]
    arrays = ClusterArrays.from_nodes(nodes)
    arrays.take(0, (0,), 470, 8000, 0)
    d = PodDemand(gpu_fraction=0.32, cpu_milli=8000)
    rank = HoleWaste(FRACTION_MIX).rank(arrays.gpu_free, arrays.cpu_free, 320, 8000)
    assert rank[0, 1] == (360 + 150) * 2 * MILLI + 680 and rank[1, 0] == 30 * 2 * MILLI + 680
    policy = get_policy("gpupool")
    policy.mix = FRACTION_MIX
    assert policy.place(arrays, arrays.eligible(None, (), d), d) == Choice(1, (0,), 320)


def test_keepwhole_keeps_the_largest_unused_nodes_for_whole_node_pods():
    """gpupool-keepwhole: a GPU pod goes to a used node that can take it rather than open
    an unused 8-GPU node, and opens one only where no used node fits, then the smallest
    (GPUs / 8 + CPUs / 128): the 96-CPU node before the 128-CPU one, which stays whole for
    the 8-GPU pod that asks for 120 CPUs and fits nowhere else. Plain gpupool fails this."""
    for name, keeps in (("gpupool-keepwhole", True), ("gpupool", False)):
        nodes = [
            Node("big", [GPU(i, "G2", 16384) for i in range(8)], cpu_milli=128_000),
            Node("small", [GPU(i, "G2", 16384) for i in range(8)], cpu_milli=96_000),
            Node("used", [GPU(i, "G2", 16384) for i in range(8)], cpu_milli=96_000),
        ]
        arrays = ClusterArrays.from_nodes(nodes)
        arrays.take(2, (0, 1, 2, 3, 4, 5), MILLI, 80_000, 0)
        policy = get_policy(name)
        picks = []
        for d in (PodDemand(gpus=1, cpu_milli=4000), PodDemand(gpus=1, cpu_milli=4000), PodDemand(gpus=1, cpu_milli=4000), PodDemand(gpu_fraction=0.5, cpu_milli=4000)):
            c = policy.place(arrays, arrays.eligible(None, (), d), d)
            picks.append(c.node)
            arrays.take(c.node, c.gpus, c.milli, d.cpu_milli, d.memory_mib)
        huge = PodDemand(gpus=8, cpu_milli=120_000)
        fits = policy.place(arrays, arrays.eligible(None, (), huge), huge)
        if keeps:
            assert picks == [2, 2, 1, 1] and fits is not None and fits.node == 0
        else:
            assert fits is None, picks


def test_get_policy_rejects_unknown():
    with pytest.raises(ValueError, match="unknown placement policy"):
        get_policy("nope")


@pytest.mark.parametrize("seed", [None, "ties-to-the-scarce-node"])
@pytest.mark.parametrize("demand", [PodDemand(gpus=1, cpu_milli=4000), PodDemand(gpu_fraction=0.5, cpu_milli=4000)])
def test_gpupool_keeps_a_scarce_model_for_the_pods_that_name_it(seed, demand, monkeypatch):
    """Between nodes of equal score, a pod that names no model keeps off a scarce model: one
    whose naming pods ask for a larger share of the GPUs than the model holds. S has a
    quarter of the GPUs (one node of four) and its pods ask for a little more than a
    quarter of the GPU milli, so S is scarce and the pod goes to C. Without the rule the
    tie goes to S (the lowest index; the seeded tie order is picked to do the same). Where
    S is asked for within its share, or no pod names a model, nothing changes."""
    nodes = [Node("s0", [GPU(i, "S", 16000) for i in range(4)], cpu_milli=32000)]
    nodes += [Node(f"c{i}", [GPU(j, "C", 16000) for j in range(4)], cpu_milli=32000) for i in range(3)]
    shapes = [Shape(4000, 1000, 1), Shape(4000, 500, 1), Shape(4000, 1000, 1, ("S",)), Shape(4000, 1000, 1, ("C",))]
    scarce = Mix(shapes, [6, 3, 4, 4])  # S: 4,000 of 15,500 milli asked, 25.8% for 25% of the GPUs
    within = Mix(shapes, [6, 3, 2, 2])  # S: 17.4% asked
    plain = Mix(shapes[:2], [6, 3])
    if seed is not None:  # a seed whose tie order puts the S node first
        seed = next(s for s in range(100) if np.random.default_rng(s).permutation(len(nodes))[0] == 0)

    def pick(mix: Mix, kept: bool) -> int:
        arrays = ClusterArrays.from_nodes(nodes)
        policy = get_policy("gpupool", seed=seed)
        policy.mix = mix
        mask = arrays.eligible_view(None, (), demand) if kept else arrays.eligible(None, (), demand)
        scores = policy.node_scores(arrays, demand, mask)[0]
        assert len(set(scores.tolist())) == 1  # all four tie on the score
        c = policy.place(arrays, mask, demand)
        assert c is not None
        return c.node

    for kept in ([False, True] if seed is None else [False]):
        assert nodes[pick(scarce, kept)].gpus[0].model == "C"
        assert pick(within, kept) == 0
        assert pick(plain, kept) == 0
        monkeypatch.setattr(GpupoolPolicy, "KEEP_OFF_MAX", 0.0)
        assert pick(scarce, kept) == 0
        monkeypatch.undo()
