"""Requirement 1: every lookup path reaches the hooks (link, dlsym, dlvsym, cuGetProcAddress
and _v2 at the runtime's versions and flags), and cuGetProcAddress passes symbolStatus
through exactly; the real libcudart's ~400 look-ups all pass through the hook."""

from __future__ import annotations

import collections
import re

import pytest

from .conftest import CUDA_OOM, LIBCUDART, base_env, run_probe

VIAS = ["link", "dlsym", "dlvsym", "getproc", "getproc_v2", "getproc_ptsz"]


@pytest.mark.parametrize("via", VIAS)
def test_each_lookup_path_is_limited(native, region_dir, via):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, via, "init", "ctx:0", "alloc:600M", "alloc:600M", "info",
                  "async:300M", "async:300M", "launch:3")
    assert r.rc == 0, r.stderr
    assert r.rcs("alloc") == [0, CUDA_OOM]
    assert r.values("info", "total") == [1 << 30]
    assert r.rcs("async") == [0, CUDA_OOM]
    # launches pass through: every variant reached the driver (the ptsz path uses _ptsz)
    counts = [int(x) for x in r.by_cmd["launch"][0].split("counts")[1].split()]
    assert sum(counts) == 3 * 8


@pytest.mark.parametrize("via", ["dlsym", "getproc_v2"])
def test_without_preload_the_fake_is_unlimited(native, region_dir, via):
    """The control: the same calls without the library are not capped."""
    env = base_env(native, region_dir, preload=False, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, via, "init", "ctx:0", "alloc:600M", "alloc:600M", "info")
    assert r.rcs("alloc") == [0, 0]
    assert r.values("info", "total") == [80 << 30]


def _procaddr(native, region_dir, preload):
    env = base_env(native, region_dir, preload=preload, GPUPOOL_MEMORY_LIMIT="1G")
    r = run_probe(native, env, "dlsym", "init", "procaddr")
    assert r.rc == 0, r.stderr
    return [ln for ln in r.lines if ln.startswith("proc_")]


def test_getprocaddress_status_and_codes_pass_through(native, region_dir):
    hooked = _procaddr(native, region_dir, True)
    plain = _procaddr(native, region_dir, False)
    assert len(hooked) == len(plain) > 50
    for h, p in zip(hooked, plain):
        # same query, same return code, same symbolStatus; only the pointer may differ
        assert h.rsplit(" ", 1)[0] == p.rsplit(" ", 1)[0]


EXPECTED = {
    ("cuGetProcAddress", "11030", "0"): "wrapped:cuGetProcAddress",
    ("cuGetProcAddress", "12000", "0"): "wrapped:cuGetProcAddress_v2",
    ("cuMemAlloc", "12000", "0"): "wrapped:cuMemAlloc_v2",
    ("cuMemAlloc", "2000", "0"): "null",  # v1 is older than any hook: driver's answer
    ("cuMemGetInfo", "12000", "0"): "wrapped:cuMemGetInfo_v2",
    ("cuMemAllocAsync", "12000", "2"): "wrapped:cuMemAllocAsync_ptsz",
    ("cuMemAllocAsync", "11000", "0"): "null",
    ("cuMemFreeAsync", "12000", "2"): "wrapped:cuMemFreeAsync_ptsz",
    ("cuLaunchKernel", "12000", "0"): "wrapped:cuLaunchKernel",
    ("cuLaunchKernel", "12000", "1"): "wrapped:cuLaunchKernel",
    ("cuLaunchKernel", "12000", "2"): "wrapped:cuLaunchKernel_ptsz",
    ("cuLaunchKernelEx", "12000", "2"): "wrapped:cuLaunchKernelEx_ptsz",
    ("cuGraphLaunch", "12000", "2"): "wrapped:cuGraphLaunch_ptsz",
    ("cuInit", "12000", "0"): "real:cuInit",
    ("cuCtxGetDevice", "12000", "2"): "real:cuCtxGetDevice",
    ("cuNoSuchFunction", "12000", "0"): "null",
}


def test_getprocaddress_wraps_only_hooked_symbols(native, region_dir):
    seen = {}
    for ln in _procaddr(native, region_dir, True):
        kind, sym, ver, flags, *_rest, what = ln.split()
        seen[(kind, sym, ver, flags)] = what
    for (sym, ver, flags), what in EXPECTED.items():
        for kind in ("proc_v1", "proc_v2"):
            assert seen[(kind, sym, ver, flags)] == what, (kind, sym, ver, flags)
    statuses = {ln.split()[1]: ln for ln in _procaddr(native, region_dir, True)
                if ln.startswith("proc_v2") and "rc=500" in ln}
    assert "status=1" in statuses["cuNoSuchFunction"]  # SYMBOL_NOT_FOUND
    assert "status=2" in statuses["cuMemAlloc"]  # VERSION_NOT_SUFFICIENT


MEMORY_BASES = {
    "cuMemAlloc": "cuMemAlloc_v2", "cuMemFree": "cuMemFree_v2",
    "cuMemGetInfo": "cuMemGetInfo_v2", "cuMemAllocManaged": "cuMemAllocManaged",
    "cuMemAllocPitch": "cuMemAllocPitch_v2", "cuMemAllocAsync": "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync": "cuMemAllocFromPoolAsync", "cuMemFreeAsync": "cuMemFreeAsync",
    "cuDeviceTotalMem": "cuDeviceTotalMem_v2", "cuArrayCreate": "cuArrayCreate_v2",
    "cuLaunchKernel": "cuLaunchKernel",
}


@pytest.mark.skipif(not LIBCUDART.exists(), reason="libcudart.so.12 wheel not fetched")
def test_real_libcudart_lookups_all_pass_through_the_hook(native, region_dir, tmp_path):
    log = tmp_path / "driver_lookups.log"
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G", GPUPOOL_LOG_LEVEL="debug",
                   FAKE_CUDA_PROC_LOG=str(log), FAKE_CUDA_STUB_UNKNOWN="1")
    import subprocess

    p = subprocess.run([str(native.bin_dir / "cudart_probe"), str(LIBCUDART)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert "cudaGetDeviceCount" in p.stdout, p.stdout + p.stderr
    driver_saw = [tuple(ln.split(" ")) for ln in log.read_text().splitlines()]
    trace = [m.groups() for m in re.finditer(r"getproc (\S*) (\d+) (\d+) -> (\S+)", p.stderr)]
    assert len(driver_saw) > 300  # about 400 symbols
    # the runtime asked the driver for cuGetProcAddress itself at 11030 and 12000 ...
    assert ("cuGetProcAddress", "11030", "0") in driver_saw
    assert ("cuGetProcAddress", "12000", "0") in driver_saw
    # ... and every look-up the driver answered went through our hook first
    assert collections.Counter(driver_saw) == collections.Counter(t[:3] for t in trace)
    answers = {(s, v, f): w for s, v, f, w in trace}
    assert answers[("cuGetProcAddress", "12000", "0")] == "cuGetProcAddress_v2"
    for base, wrapper in MEMORY_BASES.items():
        got = {w for (s, _v, f), w in answers.items() if s == base and f == "0"}
        assert got == {wrapper}, (base, got)
    assert answers[("cuMemAllocAsync", "11020", "2")] == "cuMemAllocAsync_ptsz"
