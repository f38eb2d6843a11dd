"""bench/consolidate_cycle.py: a cycle that consolidates, per setting of consolidate_in_quota,
and a baseline revision timed in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "consolidate_cycle.py"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=600)


def test_each_setting_moves_work_and_the_baseline_is_timed_beside_it():
    proc = _run("--json", "--scale", "0.02", "--repeat", "1", "--baseline", "HEAD")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for setting in ("off", "on"):
        fig = out[setting]
        # the cycle did consolidate: that is what the figure is the cost of
        assert fig["moved"] >= 1 and fig["evictions"] >= fig["moved"]
        assert 0 < fig["consolidate_s"] <= fig["decide_s"] and fig["decide_s_runs"] == [fig["decide_s"]]
        assert out["baseline"][setting]["decisions_sha"]
    assert out["baseline"]["rev"] == "HEAD" and out["ratio"]["decide_s_off"] > 0
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
    assert says in err and err.startswith("consolidate_cycle: ") and "\n" not in err
