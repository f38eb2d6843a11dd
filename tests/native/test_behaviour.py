"""Requirements 6, 7 and 8: no limit changes nothing; the compute share holds every launch
variant to its window; bad configuration is reported once and refuses allocations. Also
the consistency of hooks.def, the exported symbols and the wrappers, and that a hook whose
real function is missing answers with an error."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import CUDA_OOM, NATIVE, base_env, run_probe

G = 1 << 30
M = 1 << 20

SCRIPT = ["init", "ctx:0", "info", "total:0", "total:1", "alloc:600M", "alloc:600M", "info",
          "managed:1G", "pitch:1000:1000", "create:1:2G", "thread_create:1:1G", "async:1G",
          "pool_ptsz:1G", "array:1024:1024", "free", "freeasync", "release", "info",
          "fill:20G", "info", "launch:2", "nvml"]


@pytest.mark.parametrize("via", ["link", "dlsym", "getproc_v2", "getproc_ptsz"])
@pytest.mark.parametrize("setting", [{}, {"GPUPOOL_MEMORY_LIMIT": ""}])
def test_no_limit_changes_nothing(native, region_dir, via, setting):
    plain = run_probe(native, base_env(native, region_dir, preload=False), via, *SCRIPT)
    hooked = run_probe(native, base_env(native, region_dir, **setting), via, *SCRIPT)
    assert plain.rc == hooked.rc == 0, hooked.stderr
    assert hooked.lines == plain.lines
    assert hooked.stderr == plain.stderr == ""
    assert not (region_dir / "account").exists()  # not even the account is touched


def _phases(run, period_ns):
    # the fake lists every launch so far after each launch command: the last list is all
    times = {int(ln.split()[1]) for ln in run.lines if ln.startswith("launch_time")}
    return [t % period_ns for t in sorted(times)]


def test_compute_share_holds_every_launch_variant_to_its_window(native, region_dir):
    period = 50 * 1000 * 1000
    spread = ["init", "ctx:0"] + ["launch:1", "sleep:7"] * 12
    env = dict(FAKE_CUDA_LAUNCH_TIMES="1", GPUPOOL_COMPUTE_PERIOD_MS="50")
    control = run_probe(native, base_env(native, region_dir, **env), "getproc_v2", *spread)
    # without a share the launches fall anywhere in the period
    assert max(_phases(control, period)) > 15 * 1000 * 1000
    r = run_probe(native, base_env(native, region_dir, GPUPOOL_COMPUTE_SHARE="20", **env),
                  "getproc_v2", *spread)
    counts = r.by_cmd["launch"][-1].split("counts")[1].split()
    assert [int(c) for c in counts] == [12] * 8  # every variant, _ptsz included, launched
    phases = _phases(r, period)
    assert len(phases) == 96
    # 20% of 50 ms = the first 10 ms; a little slack for the scheduler between check and call
    assert max(phases) < 13 * 1000 * 1000


@pytest.mark.parametrize(("var", "value"), [
    ("GPUPOOL_MEMORY_LIMIT", "lots"),
    ("GPUPOOL_MEMORY_LIMIT", "1G,,2G"),
    ("GPUPOOL_MEMORY_LIMIT", "-5"),
    ("GPUPOOL_COMPUTE_SHARE", "150"),
    ("GPUPOOL_LOG_LEVEL", "loud"),
    ("GPUPOOL_SHARED_REGION", "relative/path"),
])
def test_bad_value_is_reported_once_and_refuses(native, region_dir, var, value):
    env = base_env(native, region_dir, **{"GPUPOOL_MEMORY_LIMIT": "1G", var: value})
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:1M", "alloc:1M", "info",
                  "create:0:1M", "async:1M", "nvml")
    assert r.rcs("alloc") == [CUDA_OOM, CUDA_OOM]
    assert r.rcs("create") == [CUDA_OOM] and r.rcs("async") == [CUDA_OOM]
    assert r.values("info", "free") == [0]
    assert r.stderr.count(f"invalid {var}") == 1, r.stderr


def test_unusable_shared_region_refuses(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G",
                   GPUPOOL_SHARED_REGION="/proc/no/such/account")
    r = run_probe(native, env, "dlsym", "init", "ctx:0", "alloc:1M", "alloc:1M")
    assert r.rcs("alloc") == [CUDA_OOM, CUDA_OOM]
    assert r.stderr.count("cannot open the shared account") == 1


@pytest.mark.parametrize(("value", "totals"), [
    ("1073741824", [G, G]),
    ("512M,2G", [512 * M, 2 * G]),
    ("4GiB", [4 * G, 4 * G]),
    ("1G", [G, G]),
    ("2G", [2 * G, 2 * G]),
])
def test_limit_forms(native, region_dir, value, totals):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT=value)
    r = run_probe(native, env, "dlsym", "init", "total:0", "total:1")
    assert r.values("total", "total") == totals
    assert r.stderr == ""


def test_devices_past_the_list_get_nothing(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    one = run_probe(native, env, "dlsym", "init", "thread_create:1:1M")
    assert one.rcs("thread_create") == [0]  # one value: every device
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G,1G", FAKE_CUDA_DEVICES="3")
    r = run_probe(native, env, "dlsym", "init", "thread_create:2:1M")
    assert r.rcs("thread_create") == [CUDA_OOM]


def _hook_rows():
    text = (NATIVE / "src" / "hooks.def").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.findall(r"^GP_HOOK\((\w+), (\w+), (\w+), (\d+), ([01]), (\w+)\)", text, re.M)


def test_hook_table_exports_and_wrappers_agree(native):
    rows = _hook_rows()
    assert len(rows) > 30
    nm = subprocess.run(["nm", "-D", "--defined-only", str(native.lib)], capture_output=True,
                        text=True, check=True).stdout
    exported = {ln.split()[-1] for ln in nm.splitlines() if ln.split()[1] in "TtWi"}
    api = {s for s in exported if s.startswith(("cu", "nvml"))}
    assert api == {r[1] for r in rows}
    assert exported - api == {"dlsym", "dlvsym", "gpupool_hook_count", "gpupool_hook_name",
                              "gpupool_hook_wrapper"}
    for lib, sym, base, ver, ptsz, pfn in rows:
        if lib == "CU":  # the pointer type is the driver's for that name and version
            assert pfn == f"PFN_{base}_v{ver}" + ("_ptsz" if ptsz == "1" else ""), sym
            assert sym.startswith(base)
            assert sym.endswith("_ptsz") == (ptsz == "1")
    # the library's table: every name resolves to its own wrapper
    check = (
        "import ctypes,sys;L=ctypes.CDLL(sys.argv[1]);L.gpupool_hook_name.restype=ctypes.c_char_p;"
        "L.gpupool_hook_wrapper.restype=ctypes.c_void_p;n=L.gpupool_hook_count();"
        "names=[L.gpupool_hook_name(i) for i in range(n)];"
        "bad=[x for i,x in enumerate(names) if x and ctypes.cast(getattr(L,x.decode()),"
        "ctypes.c_void_p).value!=L.gpupool_hook_wrapper(i)];"
        "print(len([x for x in names if x]),bad)"
    )
    import sys

    out = subprocess.run([sys.executable, "-c", check, str(native.lib)], capture_output=True,
                         text=True, check=True).stdout.split(maxsplit=1)
    assert int(out[0]) == len(rows) and out[1].strip() == "[]"


def test_missing_real_function_returns_an_error(native, region_dir):
    env = base_env(native, region_dir, GPUPOOL_MEMORY_LIMIT="1G")
    env["LD_LIBRARY_PATH"] = str(native.bin_dir / "empty")
    p = subprocess.run([str(native.bin_dir / "call_all")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = dict(ln.split() for ln in p.stdout.splitlines())
    assert len(got) == len(_hook_rows())
    for name, rc in got.items():
        # CUDA_ERROR_NOT_FOUND, or NVML_ERROR_FUNCTION_NOT_FOUND
        assert rc == ("13" if name.startswith("nvml") else "500"), name
