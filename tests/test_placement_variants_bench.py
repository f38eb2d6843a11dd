"""bench/placement_variants.py: a small sweep of drawn trace variants, gpupool against FGD."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.sim.trace import default_trace_dir

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "placement_variants.py"


@pytest.mark.skipif(not (default_trace_dir() / "openb_pod_list_default.csv").exists(), reason="no openb trace")
def test_a_small_sweep_prints_each_variant_and_the_count_at_or_above_fgd():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--max-nodes", "120", "--max-pods", "900", "--seeds", "1-2",
         "--models", "0,0.5", "--multi", "0.05", "--fractions", "0.3,0.6"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["variants"] == 4 and out["seeds"] == [1, 2] and len(out["rows"]) == 4
    labels = {r["variant"] for r in out["rows"]}
    assert labels == {"m0.00-g0.05-f0.30", "m0.00-g0.05-f0.60", "m0.50-g0.05-f0.30", "m0.50-g0.05-f0.60"}
    for r in out["rows"]:
        assert len(r["gpupool_per_seed"]) == len(r["fgd_per_seed"]) == 2
        assert 0 < r["gpupool"] <= 100 and r["gpupool_minus_fgd"] == pytest.approx(r["gpupool"] - r["fgd"], abs=2e-3)
    assert out["at_or_above_fgd"] == sum(1 for r in out["rows"] if r["gpupool_minus_fgd"] >= 0)
