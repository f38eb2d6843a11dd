"""Cgroup limits: the device whitelist as a pure function and on a real devices cgroup
(with device nodes made by mknod, since this machine has no GPU), detection, the v1 group's
limit files, and the v2 backend on the unified hierarchy where one is mounted."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from hub_ext.host.cgroups import (
    PTS_RULE,
    Limits,
    SystemdCgroups,
    V1Cgroups,
    V1Group,
    V2Cgroups,
    cgroup_mounts,
    cgroups_from_json,
    detect,
    device_rules,
    own_cgroups,
    own_group,
    scan_devices,
    unit_name,
)
from hub_ext.host.errors import CgroupError, LimitsError
from hub_ext.host.process import Launcher, Spec

from .conftest import needs_root, run

PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
FAKE_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9),
              "tty": (5, 0), "ptmx": (5, 2), "nvidiactl": (195, 255), "nvidia-uvm": (508, 0),
              "nvidia-uvm-tools": (508, 1), "nvidia0": (195, 0), "nvidia1": (195, 1), "nvidia2": (195, 2)}


@pytest.mark.parametrize("gpus, allowed, denied", [
    (("1",), ["c 195:1 rwm"], ["c 195:0 rwm", "c 195:2 rwm"]),
    (("0", "2"), ["c 195:0 rwm", "c 195:2 rwm"], ["c 195:1 rwm"]),
    ((), [], ["c 195:0 rwm", "c 195:1 rwm", "c 195:2 rwm"]),
])
def test_device_rules_allow_only_its_own_gpus(gpus, allowed, denied):
    rules = device_rules(gpus, FAKE_NODES)
    for rule in allowed + ["c 1:3 rwm", "c 1:9 rwm", "c 5:2 rwm", "c 195:255 rwm", "c 508:0 rwm", PTS_RULE]:
        assert rule in rules
    for rule in denied:
        assert rule not in rules
    assert not any(r.startswith("a") or r.startswith("b") for r in rules)  # nothing wider


def test_device_rules_skip_absent_shared_nodes_and_refuse_absent_gpus():
    nodes = {k: v for k, v in FAKE_NODES.items() if k != "nvidia-uvm-tools"}
    assert "c 508:1 rwm" not in device_rules(("0",), nodes)
    with pytest.raises(LimitsError, match=r"gpu_devices: GPU 5 .*present: nvidia0, nvidia1, nvidia2"):
        device_rules(("5",), nodes)


@pytest.mark.parametrize("kwargs, field", [
    ({"cpu": 0}, "cpu"), ({"cpu": -1}, "cpu"), ({"cpu": True}, "cpu"), ({"cpu": "1"}, "cpu"),
    ({"cpu": 1e9}, "cpu"), ({"memory_bytes": 1}, "memory"), ({"memory_bytes": 1.5e9}, "memory"),
    ({"gpu_devices": "0"}, "gpu_devices"), ({"gpu_devices": ("GPU-1",)}, "gpu_devices"),
])
def test_bad_limits_name_the_field_and_range(kwargs, field):
    with pytest.raises(LimitsError, match=field) as e:
        Limits(**kwargs)
    assert isinstance(e.value, ValueError)


def test_limits_round_trip():
    limits = Limits(cpu=1.5, memory_bytes=2**30, gpu_devices=("0", "3"))
    assert Limits.from_json(limits.to_json()) == limits
    assert Limits.from_json(Limits().to_json()) == Limits()


MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
"""


def test_mounts_and_own_cgroups_are_parsed():
    v1, v2 = cgroup_mounts(MOUNTINFO)
    assert v1 == {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct"), "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
                  "memory": Path("/sys/fs/cgroup/memory")}
    assert v2 is None  # cgroup2 only at /sys/fs/cgroup is the unified tree
    _, v2 = cgroup_mounts("40 1 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n")
    assert v2 == Path("/sys/fs/cgroup")
    own, unified = own_cgroups("4:memory:/a/b\n2:cpu,cpuacct:/\n0::/user.slice\n")
    assert own == {"memory": "/a/b", "cpu": "/", "cpuacct": "/"} and unified == "/user.slice"


def test_systemd_wraps_the_monitor_in_a_scope_with_its_limits():
    argv = SystemdCgroups("/usr/bin/systemd-run").wrap("w0.ab12", Limits(cpu=0.5, memory_bytes=2**30), ["mon"])
    assert argv[:2] == ["/usr/bin/systemd-run", "--scope"]
    assert argv[argv.index("--unit") + 1] == unit_name("w0.ab12") == "gpupool-w0-ab12.scope"
    assert "MemoryMax=1073741824" in argv and "CPUQuota=50%" in argv and argv[-2:] == ["--", "mon"]
    assert cgroups_from_json(SystemdCgroups("/x").to_json()).systemd_run == "/x"


def test_not_root_means_not_enforced_with_a_reason():
    if os.geteuid() == 0:
        pytest.skip("runs as another user only")
    backend = detect()
    assert not backend.enforced and "not running as root" in backend.reason


@needs_root
def test_detect_finds_this_hosts_cgroups():
    backend = detect()
    v1, v2 = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    if "memory" in v1 and "cpu" in v1 or v2 is not None:
        assert backend.enforced, backend.reason
    print(backend.kind, backend.reason)


@needs_root
def test_v1_group_has_its_limits_and_is_removed(cgroups):
    if cgroups.kind != "v1":
        pytest.skip(f"backend here is {cgroups.kind}")
    name = f"test-limits-{os.getpid()}"
    group = cgroups.create(name, Limits(cpu=0.25, memory_bytes=96 * 2**20))
    try:
        mem, cpu = group.paths["memory"], group.paths["cpu"]
        assert int((mem / "memory.limit_in_bytes").read_text()) == 96 * 2**20
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == 25_000
        assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
        assert "devices" not in group.paths  # no gpu_devices asked for: no whitelist
    finally:
        group.remove()
    assert not group.exists()
    assert isinstance(cgroups_from_json(cgroups.to_json()), V1Cgroups)


@pytest.fixture
def fake_dev():
    """A /dev of its own: the common nodes as links to the real ones, and NVIDIA nodes made
    with mknod (major 195, as the driver's). With no driver loaded, opening an allowed one
    fails with ENXIO; one the device cgroup denies fails with EPERM first."""
    d = Path(tempfile.mkdtemp(prefix="gpupool-test-dev-"))
    d.chmod(0o755)
    for name in ("null", "zero", "full", "random", "urandom", "tty", "ptmx"):
        (d / name).symlink_to(f"/dev/{name}")
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(d / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        os.chmod(d / name, 0o666)
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


PROBE = """
import errno, json, os, sys
out = {}
for name in sys.argv[1:]:
    try:
        os.close(os.open(name, os.O_RDWR))
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
"""


@needs_root
def test_device_cgroup_lets_a_workload_open_only_its_own_gpu(tmp_path, alice, cgroups, fake_dev):
    if cgroups.kind != "v1" or "devices" not in cgroups.parents:
        pytest.skip("needs the cgroup v1 devices controller")
    backend = V1Cgroups(cgroups.parents, dev=fake_dev)
    launcher = Launcher(tmp_path / "run", backend)
    names = [str(fake_dev / n) for n in ("nvidia0", "nvidia1", "nvidiactl", "null")]
    h = run(launcher.start(Spec("w-dev", [sys.executable, "-c", PROBE, *names], PATH, None, alice,
                                Limits(gpu_devices=("1",)))))
    end = run(h.wait(0.05))
    out = (launcher.run_dir / "w-dev" / "output.log").read_text()
    assert end.code == 0, out
    got = json.loads(out.splitlines()[-1])
    assert got[names[0]] == errno.EPERM  # another workload's GPU: denied by the cgroup
    assert got[names[1]] == errno.ENXIO  # its own: allowed (no driver behind the fake node)
    assert got[names[2]] == errno.ENXIO  # the driver's control node: allowed
    assert got[names[3]] == 0
    assert not h.group.exists()
    launcher.forget("w-dev")


@needs_root
def test_without_gpu_nodes_there_is_no_whitelist(cgroups):
    if cgroups.kind != "v1":
        pytest.skip(f"backend here is {cgroups.kind}")
    if any(scan_devices(Path("/dev"))):
        nodes = scan_devices(Path("/dev"))
        if any(n.startswith("nvidia") for n in nodes):
            pytest.skip("this host has NVIDIA device nodes")
    group = cgroups.create(f"test-nodev-{os.getpid()}", Limits(gpu_devices=("0",)))
    try:
        assert "devices" not in group.paths
    finally:
        group.remove()


UNIFIED = Path("/sys/fs/cgroup/unified")


@needs_root
@pytest.mark.skipif(not (UNIFIED / "cgroup.procs").exists(), reason="no cgroup2 mount at /sys/fs/cgroup/unified")
def test_v2_backend_on_the_unified_hierarchy(tmp_path, alice):
    """The v2 backend's membership, CPU counter, kill and removal on this host's cgroup2
    mount. Its controllers are bound to v1 here, so limits cannot be set: that is an error
    naming the group, not a silently unlimited workload."""
    backend = V2Cgroups(UNIFIED)
    with pytest.raises(CgroupError, match="memory.max"):
        backend.create(f"test-v2-{os.getpid()}", Limits(memory_bytes=64 * 2**20))
    assert not (UNIFIED / "gpupool" / f"test-v2-{os.getpid()}").exists()
    launcher = Launcher(tmp_path / "run", backend)
    busy = "import time\nend = time.time() + 0.5\nwhile time.time() < end: pass\ntime.sleep(60)"
    h = run(launcher.start(Spec("w-v2", [sys.executable, "-c", busy], PATH, None, alice)))
    own = Path(f"/proc/{h.pid}/cgroup").read_text()
    assert f"0::/gpupool/{launcher.group_name('w-v2')}" in own.splitlines()
    assert h.group.pids() == [h.pid]
    end = run(h.terminate(grace_s=2))
    assert end.signal == signal.SIGTERM
    assert end.cpu_seconds is not None and end.cpu_seconds > 0
    assert not h.group.exists()
    launcher.forget("w-v2")
    try:
        (UNIFIED / "gpupool").rmdir()  # the parent, made for this test (EBUSY if another run uses it)
    except OSError:
        pass


def test_v1_group_reads_nothing_when_gone(tmp_path):
    group = V1Group({"memory": tmp_path / "absent", "cpuacct": tmp_path / "absent"})
    assert (group.pids(), group.cpu_seconds(), group.memory_bytes(), group.oom_kills()) == ([], None, None, 0)
    assert not group.exists()


def test_own_group_holds_this_process():
    """What a monitor in a systemd scope reads its counters from: its own cgroup."""
    group = own_group()
    assert group.exists() and os.getpid() in group.pids()
