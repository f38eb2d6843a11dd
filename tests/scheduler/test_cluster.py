"""ClusterArrays' kept eligibility masks: up to date, read-only, and known only while kept."""

from __future__ import annotations

import numpy as np
import pytest

import scheduler.cluster as cluster_module
from scheduler.cluster import ClusterArrays
from scheduler.model import PodDemand

from .builders import make_node


def _arrays(n: int = 20) -> ClusterArrays:
    return ClusterArrays.from_nodes([make_node(f"n{i}", gpus=2, cpu_milli=4000) for i in range(n)])


def _fresh(a: ClusterArrays, d: PodDemand) -> np.ndarray:
    return (a.gpu_count >= d.gpu_count) & (a.cpu_free >= d.cpu_milli) & (a.mem_free >= d.memory_mib)


def test_a_kept_mask_follows_takes_and_gives_and_cannot_be_written():
    a, d = _arrays(), PodDemand(gpus=1, cpu_milli=3000)
    mask = a.eligible_view(None, (), d)
    assert a.kept_in_step(mask) and mask.all()
    a.take(3, (0,), 1000, 2000, 0)
    assert not a.kept_in_step(mask)  # changed since: not until it is asked for again
    assert a.eligible_view(None, (), d) is mask and a.kept_in_step(mask)
    assert (mask == _fresh(a, d)).all() and not mask[3]
    a.give(3, (0,), 1000, 2000, 0)
    assert a.eligible_view(None, (), d) is mask and mask[3]
    with pytest.raises(ValueError):
        mask[0] = False
    assert not a.kept_in_step(a.eligible(None, (), d))  # a caller's copy is not kept
    assert not a.kept_in_step(mask.copy())


def test_a_rebuilt_mask_replaces_the_old_one():
    a, d = _arrays(), PodDemand(cpu_milli=3000)
    old = a.eligible_view(None, (), d)
    for i in range(cluster_module.MASK_ROWS_BY_HAND + 1):  # too many changes: rebuilt
        a.take(i % 20, (), 0, 10, 0)
    new = a.eligible_view(None, (), d)
    assert new is not old and a.kept_in_step(new) and not a.kept_in_step(old)
    assert (new == _fresh(a, d)).all()


def test_masks_beyond_the_kept_number_start_afresh(monkeypatch):
    monkeypatch.setattr(cluster_module, "MASKS_KEPT", 3)
    a = _arrays()
    masks = [a.eligible_view(None, (), PodDemand(cpu_milli=c)) for c in (1, 2, 3)]
    assert all(a.kept_in_step(m) for m in masks)
    fourth = a.eligible_view(None, (), PodDemand(cpu_milli=4))
    assert a.kept_in_step(fourth) and not any(a.kept_in_step(m) for m in masks)
    copy = a.copy()  # a copy keeps masks of its own
    assert not copy.kept_in_step(fourth)
