"""CPU, memory and GPU-device limits of a workload, enforced by the kernel's cgroups, and
the counters that say how it ended (OOM kills) and what it used (CPU seconds, memory).

``detect()`` picks one backend for the host:

- ``systemd``: PID 1 is systemd, which owns the cgroup tree; each workload's monitor runs in
  a transient scope (``systemd-run --scope -p MemoryMax= -p CPUQuota=``), as SystemdSpawner
  does. Not testable on the development machine (its PID 1 is not systemd); kept small.
- ``v2``: /sys/fs/cgroup is the unified hierarchy with the memory and cpu controllers:
  ``gpupool/NAME`` under the root with ``memory.max``, ``cpu.max``; OOM from
  ``memory.events``. No device control: that needs an eBPF program, not done.
- ``v1``: the legacy per-controller hierarchies (memory, cpu, cpuacct, devices, pids):
  ``gpupool/NAME`` under the hub's own cgroup in each, so the hub's own limits still hold;
  ``memory.limit_in_bytes`` (and ``memsw``), ``cpu.cfs_quota_us``, the device whitelist.
- ``none``: not root, or nothing writable: limits are not enforced; ``reason`` says why,
  for the start-up log.

The monitor (``hub_ext.host.monitor``) makes the group, puts the workload in it, and
removes it when the workload has ended; the hub reads it through ``group_from_json``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import CgroupError, LimitsError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "gpupool"
CPU_PERIOD_US = 100_000
MIN_CPU = 0.01  # the kernel's smallest quota is 1 ms per period
MAX_CPU = 4096.0
MIN_MEMORY = 4 * 2**20  # below this a Python or shell process cannot even start
MAX_MEMORY = 2**62
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "devices", "pids")
V2_CONTROLLERS = ("memory", "cpu", "pids")

# Character devices every workload may use when the device whitelist is on: the usual
# container set (null, zero, full, random, urandom, tty, ptmx) and the NVIDIA driver's
# shared nodes; pseudo-terminals by their fixed major (Documentation/admin-guide/devices.txt).
COMMON_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx")
NVIDIA_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
PTS_RULE = "c 136:* rwm"
_GPU_NODE = re.compile(r"^nvidia(\d+)$")


def _undone(group, what: str, error: Exception) -> CgroupError:
    """The error of a group that could not be made, once its half-made folders are gone."""
    try:
        group.remove()
    except CgroupError:
        pass
    return CgroupError(f"{what}: {error}")


@dataclass(frozen=True)
class Limits:
    """What one workload may use. ``cpu`` in cores (0.5 = half of one core), ``memory_bytes``
    of RAM (swap included), ``gpu_devices`` the GPU indices ("0", "3") it may open; None:
    no limit (for ``gpu_devices``: no device whitelist at all)."""

    cpu: float | None = None
    memory_bytes: int | None = None
    gpu_devices: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.cpu is not None and (isinstance(self.cpu, bool) or not isinstance(self.cpu, (int, float))
                                     or not MIN_CPU <= self.cpu <= MAX_CPU):
            raise LimitsError(f"cpu limit {self.cpu!r}: a number of cores from {MIN_CPU} to {MAX_CPU:g}")
        if self.memory_bytes is not None and (isinstance(self.memory_bytes, bool)
                                              or not isinstance(self.memory_bytes, int)
                                              or not MIN_MEMORY <= self.memory_bytes <= MAX_MEMORY):
            raise LimitsError(f"memory limit {self.memory_bytes!r}: whole bytes from {MIN_MEMORY} (4 MiB) "
                              f"to {MAX_MEMORY}")
        if self.gpu_devices is not None:
            if isinstance(self.gpu_devices, str) or not all(
                    isinstance(g, str) and g.isdigit() and g.isascii() for g in self.gpu_devices):
                raise LimitsError(f"gpu_devices {self.gpu_devices!r}: a tuple of GPU indices such as ('0', '3')")
            object.__setattr__(self, "gpu_devices", tuple(self.gpu_devices))

    def to_json(self) -> dict:
        return {"cpu": self.cpu, "memory_bytes": self.memory_bytes,
                "gpu_devices": list(self.gpu_devices) if self.gpu_devices is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> Limits:
        gpus = d.get("gpu_devices")
        return cls(d.get("cpu"), d.get("memory_bytes"), tuple(gpus) if gpus is not None else None)


def cpu_quota_us(cpu: float) -> int:
    return max(1000, round(cpu * CPU_PERIOD_US))


# -- device whitelist (v1) -------------------------------------------------------------------

def scan_devices(dev: Path = Path("/dev")) -> dict[str, tuple[int, int]]:
    """The character devices the whitelist may name: name under ``dev`` -> (major, minor)."""
    out = {}
    names = list(COMMON_DEVICES) + sorted(p.name for p in dev.glob("nvidia*"))
    for name in names:
        try:
            st = os.stat(dev / name)
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o020000:  # S_IFCHR
            out[name] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return out


def has_gpu_nodes(nodes: Mapping[str, tuple[int, int]]) -> bool:
    return any(_GPU_NODE.match(n) for n in nodes)


def device_rules(gpu_devices: Iterable[str], nodes: Mapping[str, tuple[int, int]]) -> list[str]:
    """The ``devices.allow`` lines (after ``devices.deny a``) for a workload that may open
    the GPUs ``gpu_devices`` (indices) of ``nodes`` (as ``scan_devices`` returns): the
    common devices, pseudo-terminals, the driver's shared nodes, and its own GPUs only."""
    rules = []
    for name in (*COMMON_DEVICES, *NVIDIA_SHARED):
        if name in nodes:
            major, minor = nodes[name]
            rules.append(f"c {major}:{minor} rwm")
    rules.append(PTS_RULE)
    for index in gpu_devices:
        node = f"nvidia{index}"
        if node not in nodes:
            present = sorted(n for n in nodes if _GPU_NODE.match(n))
            raise LimitsError(f"gpu_devices: GPU {index} has no device node /dev/{node} "
                              f"(present: {', '.join(present) or 'none'})")
        major, minor = nodes[node]
        rules.append(f"c {major}:{minor} rwm")
    return rules


# -- groups ------------------------------------------------------------------------------------

def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupError(f"writing {value!r} to {path}: {e.strerror}") from None


def _read_int(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path | None, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``, ``cpu.stat``)."""
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        return None
    return None


def _procs(path: Path | None) -> list[int]:
    if path is None:
        return []
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _rmdir(path: Path, tries: int = 50) -> None:
    """A cgroup directory can be removed once its last process has left the kernel's books,
    a moment after it was killed: retry briefly on EBUSY."""
    for _ in range(tries):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise CgroupError(f"removing {path}: {e.strerror}") from None
            time.sleep(0.02)
    raise CgroupError(f"removing {path}: still busy")


class Group:
    """One workload's cgroup(s). The base class is the ``none`` backend: no group at all."""

    kind = "none"

    def add(self, pid: int) -> None:
        """Move ``pid`` (the caller itself, before it drops privileges) into the group."""

    def pids(self) -> list[int]:
        return []

    def cpu_seconds(self) -> float | None:
        return None

    def memory_bytes(self) -> int | None:
        return None

    def memory_peak_bytes(self) -> int | None:
        return None

    def oom_kills(self) -> int:
        return 0

    def exists(self) -> bool:
        return False

    def kill(self, exclude: Iterable[int] = (), tries: int = 100) -> None:
        """SIGKILL every process in the group until it is empty (a process may fork while
        it is being killed, so read the list again)."""
        skip = set(exclude)
        for _ in range(tries):
            left = [p for p in self.pids() if p not in skip]
            if not left:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the group."""

    def to_json(self) -> dict:
        return {"kind": self.kind}


class V1Group(Group):
    kind = "v1"

    def __init__(self, paths: Mapping[str, Path]):
        self.paths = {c: Path(p) for c, p in paths.items()}

    def _dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.paths.values()))  # cpu and cpuacct may share a directory

    def _file(self, controller: str, name: str) -> Path | None:
        d = self.paths.get(controller)
        return d / name if d is not None else None

    def add(self, pid: int) -> None:
        for d in self._dirs():
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        return _procs(self.paths.get("memory") or self.paths.get("cpu") or next(iter(self.paths.values()), None))

    def cpu_seconds(self) -> float | None:
        ns = _read_int(self._file("cpuacct", "cpuacct.usage"))
        return ns / 1e9 if ns is not None else None

    def memory_bytes(self) -> int | None:
        return _read_int(self._file("memory", "memory.usage_in_bytes"))

    def memory_peak_bytes(self) -> int | None:
        return _read_int(self._file("memory", "memory.max_usage_in_bytes"))

    def oom_kills(self) -> int:
        return _read_key(self._file("memory", "memory.oom_control"), "oom_kill") or 0

    def exists(self) -> bool:
        return any(d.is_dir() for d in self._dirs())

    def remove(self) -> None:
        self.kill()
        for d in self._dirs():
            _rmdir(d)

    def to_json(self) -> dict:
        return {"kind": self.kind, "paths": {c: str(p) for c, p in self.paths.items()}}


class V2Group(Group):
    kind = "v2"

    def __init__(self, path: Path):
        self.path = Path(path)

    def add(self, pid: int) -> None:
        _write(self.path / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        return _procs(self.path)

    def cpu_seconds(self) -> float | None:
        us = _read_key(self.path / "cpu.stat", "usage_usec")
        return us / 1e6 if us is not None else None

    def memory_bytes(self) -> int | None:
        return _read_int(self.path / "memory.current")

    def memory_peak_bytes(self) -> int | None:
        return _read_int(self.path / "memory.peak")

    def oom_kills(self) -> int:
        return _read_key(self.path / "memory.events", "oom_kill") or 0

    def exists(self) -> bool:
        return self.path.is_dir()

    def kill(self, exclude: Iterable[int] = (), tries: int = 100) -> None:
        if not exclude and (self.path / "cgroup.kill").exists():
            try:
                _write(self.path / "cgroup.kill", "1")  # the kernel kills forks in flight too
            except CgroupError:
                pass
        super().kill(exclude, tries)

    def remove(self) -> None:
        self.kill()
        _rmdir(self.path)

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": str(self.path)}


class ScopeGroup(Group):
    """The systemd scope the monitor and its workload run in: read it, kill in it, but
    leave its removal to systemd (the scope ends with its last process)."""

    kind = "systemd"

    def __init__(self, view: Group):
        self.view = view

    def pids(self) -> list[int]:
        return self.view.pids()

    def cpu_seconds(self) -> float | None:
        return self.view.cpu_seconds()

    def memory_bytes(self) -> int | None:
        return self.view.memory_bytes()

    def memory_peak_bytes(self) -> int | None:
        return self.view.memory_peak_bytes()

    def oom_kills(self) -> int:
        return self.view.oom_kills()

    def exists(self) -> bool:
        return self.view.exists()

    def to_json(self) -> dict:
        return {"kind": self.kind, "view": self.view.to_json()}


def group_from_json(d: dict | None) -> Group:
    kind = (d or {}).get("kind")
    if kind == "v1":
        return V1Group({c: Path(p) for c, p in d["paths"].items()})
    if kind == "v2":
        return V2Group(Path(d["path"]))
    if kind == "systemd":
        return ScopeGroup(group_from_json(d["view"]))
    return Group()


# -- backends ----------------------------------------------------------------------------------

class Cgroups:
    """A backend: makes a workload's group. This base class is ``none``: nothing enforced."""

    kind = "none"
    enforced = False

    def __init__(self, reason: str = "limits are not enforced"):
        self.reason = reason

    def wrap(self, name: str, limits: Limits, argv: list[str]) -> list[str]:
        """The command that starts the monitor (systemd puts it in a scope first)."""
        return argv

    def create(self, name: str, limits: Limits) -> Group:
        """Make ``name``'s group with ``limits`` (in the monitor, as root)."""
        return Group()

    def to_json(self) -> dict:
        return {"kind": self.kind, "reason": self.reason}


class V1Cgroups(Cgroups):
    kind = "v1"
    enforced = True

    def __init__(self, parents: Mapping[str, Path], dev: Path = Path("/dev")):
        """``parents``: controller -> the directory under which each workload's group is
        made (``<mount>/<hub's own cgroup>/gpupool``)."""
        self.parents = {c: Path(p) for c, p in parents.items()}
        self.dev = Path(dev)
        self.reason = "cgroup v1: " + ", ".join(sorted(self.parents))

    def create(self, name: str, limits: Limits) -> Group:
        nodes = scan_devices(self.dev) if limits.gpu_devices is not None else {}
        devices = limits.gpu_devices is not None and has_gpu_nodes(nodes) and "devices" in self.parents
        rules = device_rules(limits.gpu_devices or (), nodes) if devices else None
        paths = {c: p / name for c, p in self.parents.items() if c != "devices" or devices}
        group = V1Group(paths)
        try:
            for d in group._dirs():
                d.mkdir(parents=True, exist_ok=True)
            mem = paths.get("memory")
            if limits.memory_bytes is not None and mem is not None:
                _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # no swap beyond the limit
                    _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            cpu = paths.get("cpu")
            if limits.cpu is not None and cpu is not None:
                _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(cpu_quota_us(limits.cpu)))
            if rules is not None:
                self.apply_device_rules(paths["devices"], rules)
        except (CgroupError, OSError) as e:
            raise _undone(group, f"cgroup v1 group {name!r}", e) from None
        return group

    @staticmethod
    def apply_device_rules(path: Path, rules: Iterable[str]) -> None:
        _write(path / "devices.deny", "a")
        for rule in rules:
            _write(path / "devices.allow", rule)

    def to_json(self) -> dict:
        return {"kind": self.kind, "parents": {c: str(p) for c, p in self.parents.items()}, "dev": str(self.dev)}


class V2Cgroups(Cgroups):
    kind = "v2"
    enforced = True

    def __init__(self, root: Path = CGROUP_ROOT):
        self.root = Path(root)
        self.reason = f"cgroup v2 at {self.root} (no GPU device control: it needs eBPF)"

    def _enable(self, d: Path) -> None:
        """Let ``d``'s children use the controllers (each one ``d`` has)."""
        try:
            have = set((d / "cgroup.controllers").read_text().split())
            on = set((d / "cgroup.subtree_control").read_text().split())
        except OSError as e:
            raise CgroupError(f"reading {d}: {e.strerror}") from None
        missing = [c for c in V2_CONTROLLERS if c in have and c not in on]
        if missing:
            _write(d / "cgroup.subtree_control", " ".join("+" + c for c in missing))

    def create(self, name: str, limits: Limits) -> Group:
        parent = self.root / PARENT
        group = V2Group(parent / name)
        try:
            self._enable(self.root)
            parent.mkdir(exist_ok=True)
            self._enable(parent)
            group.path.mkdir(exist_ok=True)
            if limits.memory_bytes is not None:
                _write(group.path / "memory.max", str(limits.memory_bytes))
                if (group.path / "memory.swap.max").exists():
                    _write(group.path / "memory.swap.max", "0")
            if limits.cpu is not None:
                _write(group.path / "cpu.max", f"{cpu_quota_us(limits.cpu)} {CPU_PERIOD_US}")
        except (CgroupError, OSError) as e:
            raise _undone(group, f"cgroup v2 group {name!r}", e) from None
        return group

    def to_json(self) -> dict:
        return {"kind": self.kind, "root": str(self.root)}


class SystemdCgroups(Cgroups):
    """Through systemd, which owns the cgroup tree when it is PID 1: the monitor is started
    in a transient scope ``gpupool-NAME-DIGEST.scope`` in ``gpupool.slice`` with the limits as unit
    properties; the workload, the monitor's child, stays in it. The monitor reads its own
    cgroup from /proc/self/cgroup for the counters. The scope also keeps a restart of a
    hub that is itself a systemd service from killing the monitors with it.
    Untested here: the development machine's PID 1 is not systemd."""

    kind = "systemd"
    enforced = True

    def __init__(self, systemd_run: str = "systemd-run"):
        self.systemd_run = systemd_run
        self.reason = "systemd transient scopes (MemoryMax, CPUQuota)"

    def wrap(self, name: str, limits: Limits, argv: list[str]) -> list[str]:
        props = []
        if limits.memory_bytes is not None:
            props += ["-p", f"MemoryMax={limits.memory_bytes}", "-p", "MemorySwapMax=0"]
        if limits.cpu is not None:
            props += ["-p", f"CPUQuota={round(limits.cpu * 100)}%"]
        return [self.systemd_run, "--scope", "--quiet", "--collect", "--slice", "gpupool.slice",
                "--unit", unit_name(name), *props, "--", *argv]

    def create(self, name: str, limits: Limits) -> Group:
        return ScopeGroup(own_group())

    def to_json(self) -> dict:
        return {"kind": self.kind, "systemd_run": self.systemd_run}


def unit_name(name: str) -> str:
    """The scope unit of group ``name``; its '.' would read as a unit type suffix."""
    return f"gpupool-{name.replace('.', '-')}.scope"


def cgroups_from_json(d: dict) -> Cgroups:
    kind = d.get("kind")
    if kind == "v1":
        return V1Cgroups({c: Path(p) for c, p in d["parents"].items()}, Path(d.get("dev", "/dev")))
    if kind == "v2":
        return V2Cgroups(Path(d["root"]))
    if kind == "systemd":
        return SystemdCgroups(d.get("systemd_run", "systemd-run"))
    return Cgroups(d.get("reason", "limits are not enforced"))


# -- detection ---------------------------------------------------------------------------------

def cgroup_mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """From /proc/self/mountinfo: v1 controller -> mount point, and the cgroup2 mount at
    /sys/fs/cgroup (or None)."""
    v1: dict[str, Path] = {}
    v2 = None
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, rest = pre.split(), post.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if rest[0] == "cgroup":
            for opt in rest[2].split(","):
                if opt in V1_CONTROLLERS:
                    v1.setdefault(opt, point)
        elif rest[0] == "cgroup2" and point == CGROUP_ROOT:
            v2 = point
    return v1, v2


def own_cgroups(text: str) -> tuple[dict[str, str], str | None]:
    """From /proc/self/cgroup: v1 controller -> this process's cgroup path, and its v2 path."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
            continue
        for c in controllers.split(","):
            v1[c] = path
    return v1, v2


def own_group() -> Group:
    """The cgroup this process is in (a systemd scope's monitor reads its scope so)."""
    v1_mounts, v2_mount = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    v1_paths, v2_path = own_cgroups(Path("/proc/self/cgroup").read_text())
    if v2_mount is not None and v2_path is not None:
        return V2Group(v2_mount / v2_path.lstrip("/"))
    return V1Group({c: m / v1_paths[c].lstrip("/") for c, m in v1_mounts.items() if c in v1_paths})


def _systemd_is_init() -> bool:
    # sd_booted()'s test: this directory exists only when systemd is PID 1.
    return Path("/run/systemd/system").is_dir()


def detect() -> Cgroups:
    """The backend for this host (see the module docstring), checked by making and removing
    a probe group, so that a read-only or delegated-away tree is ``none`` with its reason."""
    if os.geteuid() != 0:
        return Cgroups("not running as root: CPU and memory limits are not enforced")
    if _systemd_is_init():
        run = shutil.which("systemd-run")
        if run:
            return SystemdCgroups(run)
    v1_mounts, v2_mount = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    candidates: list[Cgroups] = []
    if v2_mount is not None:
        have = set(_read_text(v2_mount / "cgroup.controllers").split())
        if {"memory", "cpu"} <= have:
            candidates.append(V2Cgroups(v2_mount))
    if "memory" in v1_mounts and "cpu" in v1_mounts:
        own, _ = own_cgroups(Path("/proc/self/cgroup").read_text())
        parents = {c: m / own.get(c, "/").lstrip("/") / PARENT for c, m in v1_mounts.items()}
        candidates.append(V1Cgroups(parents))
    problems = []
    for backend in candidates:
        try:
            backend.create(f"probe-{os.getpid()}", Limits()).remove()
            return backend
        except CgroupError as e:
            problems.append(str(e))
    why = "; ".join(problems) or "no cgroup v1 memory and cpu hierarchies and no cgroup v2 with them"
    return Cgroups(f"CPU and memory limits are not enforced: {why}")


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


__all__ = ["CGROUP_ROOT", "Cgroups", "Group", "Limits", "ScopeGroup", "SystemdCgroups", "V1Cgroups", "V1Group",
           "V2Cgroups", "V2Group", "cgroup_mounts", "cgroups_from_json", "cpu_quota_us", "detect", "device_rules",
           "group_from_json", "own_cgroups", "own_group", "scan_devices", "unit_name"]
