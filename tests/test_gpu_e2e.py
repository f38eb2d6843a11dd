"""``scripts/gpu-e2e --fake``: the GPU machine's end-to-end run, on the fake driver and NVML
of native/fake, so that every part of it is exercised on every change. It starts a real hub
(with its own accounts prefix), real workspaces, a training, an inference service; only the
GPU is fake. The test reads the one JSON line the script prints."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def run():
    if not shutil.which("cc") or not shutil.which("useradd"):
        pytest.skip("needs a C compiler (make native) and useradd (scripts/setup-system)")
    # the run's own account prefix (tests/conftest.py) reaches the script through the environment
    p = subprocess.run([str(ROOT / "scripts" / "gpu-e2e"), "--fake"], cwd=ROOT,
                       capture_output=True, text=True, timeout=560)
    lines = p.stdout.strip().splitlines()
    assert lines, f"no JSON line; rc {p.returncode}\n{p.stderr[-5000:]}"
    return p.returncode, json.loads(lines[-1]), p.stderr


def test_every_step_passes_and_the_exit_status_says_so(run):
    rc, r, err = run
    assert r["mode"] == "fake"
    failed = {k: v for k, v in r.items() if isinstance(v, dict) and not v.get("ok")}
    assert not failed, f"{failed}\n{err[-5000:]}"
    assert r["ok"] is True and rc == 0
    assert list(r) == ["mode", "setup", "nodes", "caps", "training", "inference", "idle", "released",
                       "seconds", "ok"]


def test_the_nodes_page_shows_the_gpus_nvml_reports(run):
    nodes = run[1]["nodes"]
    assert nodes["source"] == ["nvml"]
    assert nodes["gpus"] == [{"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                              "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000"}]
    assert nodes["page_shows_each"] is True


def test_each_kernel_sees_its_own_cap_and_share_of_one_gpu(run):
    caps = run[1]["caps"]
    assert caps["same_gpu"] is True
    for user, milli in (("ann", 250), ("ben", 500)):
        k = caps[user]
        assert k["gpu_milli"] == milli
        assert k["total"] == k["cap"] == 81559 * 2**20 * milli // 1000
        assert k["half_ok"] and k["past_cap_refused"]
        assert k["window"] <= milli / 1000 + 0.05  # the launches inside the share's window


def test_the_preempted_training_resumes_from_its_saved_step(run):
    t = run[1]["training"]
    assert t["preemptions"] == 1
    assert t["resumed_from"] == t["last_step_before"] > 0
    assert t["attempts"][0].startswith("start step=0 attempt=1 ")
    assert t["attempts"][1].startswith(f"start step={t['resumed_from']} attempt=2 ")
    assert "preempted" in t["events"] and "resumed" in t["events"]


def test_the_service_starts_from_zero_within_its_fraction(run):
    s = run[1]["inference"]
    assert (s["replicas_before"], s["replicas_after"]) == (0, 1)
    assert s["gpu_total"] == s["cap"] == 81559 * 2**20 * 250 // 1000
    assert 256 * 2**20 <= s["gpu_used"] <= s["cap"]


def test_only_the_workspace_that_launches_nothing_is_idle(run):
    idle = run[1]["idle"]
    assert idle["ws-ben"]["idle"] is True
    assert idle["ws-ann"]["idle"] is False and int(idle["ws-ann"]["launches"]) > 0


def test_every_share_is_back(run):
    rel = run[1]["released"]
    assert rel["gpus"] == [{"allocated": 0, "workloads": 0}]
    assert all(free == gpus for free, gpus in rel["pools_free"].values())
