"""bench/peers at a small size: gpupool-scheduler, KAI-Scheduler (built from its released
source by scripts/build-peers) and kube-scheduler on one local cluster with kwok nodes, the
same work for each. Checks what every run must show whatever the speeds: all pods bound, the
returning queue served, the gang whole, each fraction placed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL_NODES, NODES, PODS, GPUS = 4, 50, 500, 8


# --stall-s: KAI's binder retries a fractional bind whose ConfigMap its own cache has not seen
# yet with a back-off of up to 60 s (--rate-limiter-max-delay), so a stall is only one longer
# than two such waits.
@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    # KAI's released source is a tarball beside the repository (scripts/build-peers)
    if subprocess.run([str(REPO / "scripts" / "build-peers"), "cached"],
                      capture_output=True).returncode == 2:
        pytest.skip("KAI-Scheduler's source tarball is not on this machine (KAI_TARBALL)")
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "peers"), "--json", "--nodes", str(NODES),
         "--pods", str(PODS), "--small-nodes", str(SMALL_NODES), "--stall-s", "150"],
        capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return {r["scenario"]: r for r in lines}


def test_every_scenario_reports_each_scheduler_with_its_version(results):
    assert set(results) == {"reclaim", "fair_share", "gangs", "fractions", "throughput"}
    assert set(results["throughput"]["schedulers"]) == {
        "gpupool", "kai-scheduler", "default-scheduler", "bench-bare"}
    for r in results.values():
        for row in r["schedulers"].values():
            assert row["version"] and row["args"]
    assert results["throughput"]["schedulers"]["kai-scheduler"]["version"] == "KAI-Scheduler v0.13.0"


def test_every_scheduler_binds_the_whole_backlog(results):
    bindable = min(PODS, NODES * GPUS)
    for name, row in results["throughput"]["schedulers"].items():
        assert row["bindable"] == bindable
        assert row["bound"] == bindable, name
        assert row["pods_s"] > 0 and row["cpu_s_per_1000_pods"] > 0


def test_the_returning_queue_gets_its_quota_back(results):
    for name, row in results["reclaim"]["schedulers"].items():
        assert row["filled"], name
        assert row["returning_bound"] == row["returning_asked"] == SMALL_NODES * GPUS // 4, name
        # the cluster was full: every GPU it got back was an eviction
        assert row["needed"] == row["returning_asked"] and row["evictions"] >= row["needed"], name


def test_fair_share_fills_the_cluster_in_proportion(results):
    for name, row in results["fair_share"]["schedulers"].items():
        assert sum(row["held"].values()) == SMALL_NODES * GPUS, name
        assert 0 < row["jain_final"] <= 1 and row["samples"] >= 1, name
        # the weight-4 queue gets more than a weight-1 queue
        assert row["held"]["w4"] > row["held"]["w1a"], name
        # every sample and every bind is there to read the fill from
        assert len(row["series"]) == row["samples"], name
        assert len(row["bind_order"]) >= SMALL_NODES * GPUS, name
        assert 0 < row["jain_min_per_change"] <= 1 and row["evicted"] >= 0, name


def test_the_gang_binds_whole(results):
    for name, row in results["gangs"]["schedulers"].items():
        assert row["whole"] and row["gang_bound"] == 16, name
        assert row["time_to_whole_s"] is not None, name


def test_every_fraction_is_placed_on_a_shared_gpu(results):
    """gpupool binds every fraction on shared GPUs; a peer's bound fractions share GPUs too.
    A peer may leave a fraction unbound past the stall (KAI's binder has left 1 or 2 of 24
    waiting on its back-off in some runs): that is the peer's result, which the bench reports,
    not a failure of the run."""
    rows = results["fractions"]["schedulers"]
    for name, row in rows.items():
        assert row["pods"] == SMALL_NODES * 6 and row["gpus_ideal"] == SMALL_NODES * 2, name
        assert 0 < row["bound"] <= row["pods"], name
        assert row["gpus_used"] < row["bound"], name  # shared, not one GPU per fraction
    ours = rows["gpupool"]
    assert ours["bound"] == ours["pods"], ours
    assert ours["gpus_ideal"] <= ours["gpus_used"], ours
