"""Requirement 4: one account per container, shared by its processes: atomic reservation
under races, no stuck lock after SIGKILL, reclaim of a killed process's memory, fork, a
process started later, and a non-root user."""

from __future__ import annotations

import os
import shutil
import signal
import stat

import pytest

from .conftest import CUDA_OOM, base_env, run_probe, start_probe, wait_for

G = 1 << 30
M = 1 << 20


def test_racing_processes_never_exceed_the_limit_together(native, region_dir, tmp_path):
    go, end = tmp_path / "go", tmp_path / "end"
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="500M")
    # all hold what they got until every one has filled (an exit gives memory back)
    procs = [start_probe(native, env, "dlsym", "init", "ctx:0", f"wait_file:{go}", "fill:10M",
                         "info", f"touch:{tmp_path}/done{i}", f"wait_file:{end}")
             for i in range(6)]
    go.touch()
    for i, p in enumerate(procs):
        wait_for(tmp_path / f"done{i}", p)
    end.touch()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    filled = [int(ln.split("n=")[1]) for out in outs for ln in out.splitlines()
              if ln.startswith("fill")]
    assert len(filled) == 6
    assert sum(filled) == 50  # exactly the limit: none over, none lost
    frees = [int(ln.split("free=")[1].split()[0]) for out in outs for ln in out.splitlines()
             if ln.startswith("info")]
    assert len(frees) == 6 and all(f < 10 * M for f in frees)  # each was refused when full


def test_killed_during_the_driver_call_is_reclaimed(native, region_dir, tmp_path):
    mark = tmp_path / "in_driver"
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G",
                   FAKE_CUDA_ALLOC_SLEEP_MS="30000", FAKE_CUDA_ALLOC_MARK=str(mark))
    victim = start_probe(native, env, "dlsym", "init", "ctx:0", "alloc:600M")
    wait_for(mark, victim)  # reserved in the account, inside the driver now
    env2 = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    before = run_probe(native, env2, "dlsym", "init", "ctx:0", "info")
    assert before.values("info", "free") == [G - 600 * M]  # the reservation is visible
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    r = run_probe(native, env2, "dlsym", "init", "ctx:0", "info", "alloc:600M", "alloc:600M")
    assert r.values("info", "free") == [G]
    assert r.rcs("alloc") == [0, CUDA_OOM]


def test_killed_while_holding_the_lock_leaves_no_stuck_lock(native, region_dir, tmp_path):
    mark = tmp_path / "locked"
    env = base_env(native, region_dir, lib=native.test_lib, GPUPOOL_MEMORY_LIMIT="1G",
                   GPUPOOL_TEST_STALL_LOCKED=str(mark))
    victim = start_probe(native, env, "dlsym", "init", "ctx:0", "alloc:100M")
    wait_for(mark, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    env2 = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env2, "dlsym", "init", "ctx:0", "info", "alloc:600M", "alloc:600M",
                  timeout=20)
    assert r.rc == 0, r.stderr
    assert r.values("info", "free") == [G]  # the half-made reservation is gone too
    assert r.rcs("alloc") == [0, CUDA_OOM]


def test_fork_and_later_processes_see_the_usage(native, region_dir, tmp_path):
    ready = tmp_path / "ready"
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    first = start_probe(native, env, "dlsym", "init", "ctx:0", "alloc:300M", "fork", "info",
                        "alloc:200M", "info", "join", "info", f"touch:{ready}", "hold")
    try:
        wait_for(ready, first)
        later = run_probe(native, env, "dlsym", "init", "ctx:0", "info", "alloc:800M")
        assert later.values("info", "free") == [G - 300 * M]
        assert later.rcs("alloc") == [CUDA_OOM]
    finally:
        first.kill()
        out = first.communicate()[0]
    lines = out.splitlines()
    child = [ln for ln in lines if ln.startswith("child info")]
    assert [int(ln.split("free=")[1].split()[0]) for ln in child] == [G - 300 * M, G - 500 * M]
    assert "child alloc rc=0" in lines
    parent = [ln for ln in lines if ln.startswith("info")]
    assert parent == [f"info rc=0 free={G - 300 * M} total={G}"]  # the exited child gave back
    after = run_probe(native, env, "dlsym", "init", "ctx:0", "info")
    assert after.values("info", "free") == [G]  # and the killed parent is reclaimed


def test_a_missing_account_is_created_private(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:300M")
    assert r.rcs("alloc") == [0], r.stderr
    st = os.lstat(region_dir / "account")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_an_account_others_may_write_is_refused(native, region_dir, mode):
    """Whoever may write the account may lift the cap or fail the allocations it counts."""
    account = region_dir / "account"
    account.touch()
    account.chmod(mode)
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:1M", "alloc:1M")
    assert r.rcs("alloc") == [CUDA_OOM, CUDA_OOM]
    assert r.stderr.count("is not a file of this account's") == 1, r.stderr
    assert account.stat().st_size == 0  # nothing was written to it


def test_a_link_in_place_of_the_account_is_not_followed(native, region_dir, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    target.chmod(0o600)
    (region_dir / "account").symlink_to(target)
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:1M")
    assert r.rcs("alloc") == [CUDA_OOM]
    assert r.stderr.count("cannot open the shared account") == 1, r.stderr
    assert target.read_bytes() == b""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to switch to an unprivileged user")
@pytest.mark.parametrize("mode", [0o600, 0o666])
def test_an_account_of_another_user_is_refused(native, region_dir, mode):
    """An unprivileged account neither uses nor writes the account another account made,
    even one the owner left writable."""
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    owner = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:300M")
    assert owner.rcs("alloc") == [0], owner.stderr
    account = region_dir / "account"
    account.chmod(mode)
    before = account.read_bytes()
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "info", "alloc:1M", user="65534")
    assert r.rcs("alloc") == [CUDA_OOM]
    why = "cannot open the shared account" if mode == 0o600 else "is not a file of this account's"
    assert r.stderr.count(why) == 1, r.stderr
    assert account.read_bytes() == before
