"""bench/reclaim_cycle.py: a cycle that makes a mass fair-share reclaim, and a baseline revision
timed in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "reclaim_cycle.py"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=600)


def test_the_cycle_reclaims_for_fair_share_and_the_baseline_is_timed_beside_it():
    proc = _run("--json", "--scale", "0.05", "--repeat", "1", "--baseline", "HEAD")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the cycle did reclaim for fair share, and only that: what the figure is the cost of
    assert out["evictions"] >= 20 and out["evictions_by_cause"] == {"fair share": out["evictions"]}
    assert 0 < out["fair_share_reclaim_s"] <= out["cycle_s"] and out["cycle_s_runs"] == [out["cycle_s"]]
    assert out["ms_per_eviction"] > 0 and out["binds"] > 0
    assert out["baseline"]["rev"] == "HEAD" and out["baseline"]["decisions_sha"]
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "scheduler"],
                           capture_output=True, text=True, check=True).stdout
    if not dirty:
        assert out["same_decisions"] is True


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--repeat", "0"], "--repeat must be an integer >= 1, got 0"),
        (["--scale", "nan"], "--scale must be a number in (0, 4], got nan"),
    ],
)
def test_bad_arguments_are_one_line(argv, says):
    proc = _run(*argv)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert says in err and err.startswith("reclaim_cycle: ") and "\n" not in err
