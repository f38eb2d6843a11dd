"""Idleness per fraction: the library counts each workload's launches and allocations in
its own shared account, and the hub's culler stops the fraction that launched nothing even
while its neighbour on the same GPU keeps launching."""

from __future__ import annotations

from types import SimpleNamespace

from hub_ext.host.activity import NONE, read_region
from hub_ext.service.culler import idle_servers

from .conftest import base_env, start_probe, wait_for

IDLE_S = 600.0
QUARTER = [{"node": "n", "gpu_indices": [0], "gpu_milli": 250}]


def _users(*names: str) -> list[dict]:
    return [{"name": n, "servers": {"": {"ready": True, "last_activity": None}}} for n in names]


def test_launches_and_allocations_are_counted_per_workload(native, region_dir, tmp_path):
    env = base_env(native, None, GPUPOOL_MEMORY_LIMIT="1G",
                   GPUPOOL_SHARED_REGION=str(region_dir / "ws-a"))
    p = start_probe(native, env, "dlsym", "init", "ctx:0", "alloc:10M", "launch:3",
                    f"touch:{tmp_path}/done", f"wait_file:{tmp_path}/end")
    wait_for(tmp_path / "done", p)
    act = read_region(str(region_dir / "ws-a"))
    (tmp_path / "end").touch()
    p.communicate(timeout=60)
    # launch:N calls each of the 8 launch entry points N times
    assert act is not None and act.launches == 24 and act.allocs == 1 and act.last_active_s > 0
    assert read_region(str(region_dir / "ws-b")) == NONE  # never touched the GPU: no file


def test_only_the_fraction_without_launches_is_culled(native, region_dir, tmp_path):
    """Two 0.25 shares of GPU 0: alice launches between the culler's checks, bob allocated
    once at start and then launches nothing."""
    procs = []
    for user, cmds in (("alice", ["launch:1", f"touch:{tmp_path}/alice1", f"wait_file:{tmp_path}/go",
                                  "launch:1", f"touch:{tmp_path}/alice2", f"wait_file:{tmp_path}/end"]),
                       ("bob", ["alloc:10M", f"touch:{tmp_path}/bob1", f"wait_file:{tmp_path}/end"])):
        env = base_env(native, None, GPUPOOL_MEMORY_LIMIT="1G", GPUPOOL_COMPUTE_SHARE="25",
                       GPUPOOL_SHARED_REGION=str(region_dir / f"ws-{user}"))
        procs.append(start_probe(native, env, "dlsym", "init", "ctx:0", *cmds))
    try:
        wait_for(tmp_path / "alice1", procs[0])
        wait_for(tmp_path / "bob1", procs[1])
        rows = {"ws-alice": SimpleNamespace(placement=QUARTER), "ws-bob": SimpleNamespace(placement=QUARTER)}
        busy: dict[str, float] = {}
        counts: dict[str, int] = {}

        def check(now: float, util: dict[int, float]) -> list:
            return idle_servers(_users("alice", "bob"), rows, util, busy, now, IDLE_S, 1.0,
                                activity=lambda name: read_region(str(region_dir / name)), counts=counts)

        # NVML would call GPU 0 busy throughout: the neighbour keeps it so
        assert check(0.0, {0: 90.0}) == []
        (tmp_path / "go").touch()
        wait_for(tmp_path / "alice2", procs[0])
        assert check(IDLE_S / 2, {0: 90.0}) == []
        assert check(IDLE_S + 1, {0: 90.0}) == [("bob", "")]
    finally:
        (tmp_path / "end").touch()
        for p in procs:
            p.communicate(timeout=60)
