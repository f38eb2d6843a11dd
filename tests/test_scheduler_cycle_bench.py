"""bench/scheduler_cycle.py: its figures per scale, and a baseline revision timed in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "scheduler_cycle.py"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=600)


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True).stdout


def test_baseline_revision_is_timed_beside_this_tree_and_removed_after():
    before = _worktrees()
    proc = _run("--json", "--scale", "0.02", "--baseline", "HEAD")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for fig in ("cycle_s", "snapshot_s", "actions_s", "cycle_cpu_s", "update_cpu_s", "decide_cpu_s", "gc_full_s",
                "gc_tracked", "loadavg", "decisions_sha"):
        for suffix in ("_quarter", "_half", ""):
            assert f"{fig}{suffix}" in out and f"{fig}{suffix}" in out["baseline"]
    for suffix in ("_quarter", "_half", ""):
        assert out[f"cycle_s{suffix}"] == pytest.approx(out[f"snapshot_s{suffix}"] + out[f"actions_s{suffix}"], abs=2e-4)
        assert out[f"snapshot_s{suffix}"] > 0 and out[f"actions_s{suffix}"] > 0
        parts = out[f"update_cpu_s{suffix}"] + out[f"decide_cpu_s{suffix}"]
        assert out[f"cycle_cpu_s{suffix}"] == pytest.approx(parts, abs=2e-4)
    assert out["nodes"] == 80 and out["running_pods"] == 2800
    assert out["baseline"]["rev"] == "HEAD" and out["ratio"]["cycle_s"] > 0
    # HEAD decides what the working tree decides (unless the scheduler has uncommitted changes)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "scheduler"],
                           capture_output=True, text=True, check=True).stdout
    if not dirty:
        assert out["same_decisions"] is True
    assert _worktrees() == before


def test_repeated_runs_keep_each_figures_least():
    proc = _run("--json", "--scale", "0.01", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["repeat"] == 2 and "baseline" not in out and out["consolidate_in_quota"] is False
    for suffix in ("_quarter", "_half", ""):
        runs = out[f"cycle_s_runs{suffix}"]
        assert len(runs) == 2 and out[f"cycle_s{suffix}"] == min(runs)


def test_consolidate_in_quota_times_this_tree_with_the_switch_and_the_baseline_without():
    proc = _run("--json", "--scale", "0.01", "--consolidate-in-quota", "--baseline", "HEAD")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["consolidate_in_quota"] is True and "consolidate_in_quota" not in out["baseline"]
    assert out["ratio"]["cycle_s"] > 0


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--repeat", "0"], "--repeat must be an integer >= 1, got 0"),
        (["--scale", "0"], "--scale must be a number in (0, 4], got 0.0"),
        (["--scale", "nan"], "--scale must be a number in (0, 4], got nan"),
        (["--baseline", "no-such-revision-here", "--scale", "0.01"], "--baseline 'no-such-revision-here' cannot be checked out"),
    ],
)
def test_bad_arguments_are_one_line(argv, says):
    before = _worktrees()
    proc = _run(*argv)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert says in err and err.startswith("scheduler_cycle: ") and "\n" not in err
    assert _worktrees() == before
