"""Requirements 2, 3 and 5: every allocation path is counted, refusal is exactly
CUDA_ERROR_OUT_OF_MEMORY with the count unchanged, frees give back, memory queries (driver
and NVML) report min(limit, physical) and never a negative free, and allocations from a
thread without a context land on the right device."""

from __future__ import annotations

import pytest

from .conftest import CUDA_OOM, base_env, run_probe, start_probe, wait_for

G = 1 << 30
M = 1 << 20

# (id, allocate-600M command, its output name, free command): each path twice over a 1G cap
PATHS = [
    ("alloc", "alloc:600M", "alloc", "free"),
    ("managed", "managed:600M", "managed", "free"),
    ("async", "async:600M", "async", "freeasync"),
    ("async_ptsz", "async_ptsz:600M", "async_ptsz", "freeasync"),
    ("pool", "pool:600M", "pool", "freeasync"),
    ("pool_ptsz", "pool_ptsz:600M", "pool_ptsz", "freeasync"),
    ("create", "create:0:600M", "create", "release"),
    ("array", "array:153600:1024", "array", "arraydestroy"),  # 600 MiB of floats
    ("array3d", "array3d:1024:1024:150", "array3d", "arraydestroy"),
    ("mipmap", "mipmap:12000:12000:3", "mipmap", "mipmapdestroy"),  # 549+137+34 MiB
    ("pitch", "pitch:1000:614400", "pitch", "free"),  # 1024-byte pitch x 614400 rows
]


@pytest.mark.parametrize(("alloc", "name", "free"), [p[1:] for p in PATHS],
                         ids=[p[0] for p in PATHS])
def test_every_allocation_path_is_counted(native, region_dir, alloc, name, free):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "info", alloc, "info", alloc, "info",
                  free, "info", alloc, "info")
    assert r.rc == 0, r.stderr
    assert r.rcs(name) == [0, CUDA_OOM, 0]
    assert r.rcs(free.split(":")[0]) == [0]
    free_after = r.values("info", "free")
    assert free_after[0] == G
    assert free_after[1] < G - 500 * M  # counted
    assert free_after[2] == free_after[1]  # the refusal left the count unchanged
    assert free_after[3] == G  # the free gave it all back
    assert free_after[4] == free_after[1]


def test_pitch_is_settled_to_the_real_pitch(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "pitch:1000:1000", "info")
    assert r.values("pitch", "pitch") == [1024]
    assert r.values("info", "free") == [G - 1024 * 1000]


def test_failed_driver_call_rolls_back(native, region_dir):
    """The fake refuses beyond its 512 MiB of physical memory: our reservation is undone."""
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G", FAKE_CUDA_MEM=str(512 * M))
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:600M", "info", "alloc:400M",
                  "info")
    assert r.rcs("alloc") == [CUDA_OOM, 0]  # the first came from the driver
    # total = min(limit, physical) = 512 MiB
    assert r.values("info", "total") == [512 * M, 512 * M]
    assert r.values("info", "free") == [512 * M, 112 * M]


def test_total_mem_is_capped_per_device(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G,2G")
    r = run_probe(native, env, "getproc_v2", "init", "total:0", "total:1")
    assert r.values("total", "total") == [G, 2 * G]


def test_free_never_below_zero_when_over_the_limit(native, region_dir, tmp_path):
    """Another process of the container (with a bigger cap) already used more than ours."""
    ready = tmp_path / "ready"
    env_big = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="2G")
    holder = start_probe(native, env_big, "dlsym", "init", "ctx:0", "alloc:1536M",
                         f"touch:{ready}", "hold")
    try:
        wait_for(ready, holder)
        env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G", FAKE_NVML_USED=str(3 * G))
        r = run_probe(native, env, "dlsym", "init", "ctx:0", "info", "alloc:1M", "nvml")
        assert r.values("info", "free") == [0]
        assert r.values("info", "total") == [G]
        assert r.rcs("alloc") == [CUDA_OOM]
        nv = r.by_cmd["nvml"][0]
        assert "total=1073741824" in nv and "used=1610612736" in nv and "free=0" in nv
        nv2 = r.by_cmd["nvml_v2"][0]
        assert "total=1073741824" in nv2 and "free=0" in nv2
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("visible", ["1", "GPU-fa4e0000-0000-0000-0000-000000000001"])
def test_nvml_maps_devices_through_cuda_visible_devices(native, region_dir, visible):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G", CUDA_VISIBLE_DEVICES=visible,
                   FAKE_NVML_RESERVED=str(100 * M))
    r = run_probe(native, env, "dlsym", "nvml")
    by_index = {ln.split()[1]: ln for ln in r.by_cmd["nvml"]}
    assert f"total={80 * G}" in by_index["0"]  # not visible to this container: unchanged
    assert "total=1073741824" in by_index["1"] and f"free={G}" in by_index["1"]
    v2 = {ln.split()[1]: ln for ln in r.by_cmd["nvml_v2"]}
    assert f"reserved={100 * M}" in v2["1"] and f"free={G - 100 * M}" in v2["1"]


def test_thread_without_context_counts_on_the_right_device(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G,2G")
    r = run_probe(native, env, "getproc_v2", "init", "ctx:0", "thread_create:1:1536M", "info",
                  "thread_create:1:600M", "thread_create:0:1536M", "total:1")
    assert r.rc == 0, r.stderr
    assert r.rcs("thread_create") == [0, CUDA_OOM, CUDA_OOM]
    assert r.values("info", "free") == [G]  # device 0 untouched


def test_thread_without_any_context_in_the_process(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G,2G")
    r = run_probe(native, env, "dlsym", "init", "thread_create:1:1G", "thread_create:1:1G",
                  "thread_create:1:1G", "release", "thread_create:1:1G")
    assert r.rc == 0, r.stderr
    assert r.rcs("thread_create") == [0, 0, CUDA_OOM, 0]
    assert r.rcs("release") == [0]
