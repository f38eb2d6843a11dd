"""Starting, finding again, stopping and reading workloads on this host.

``Launcher.start(spec)`` writes ``RUN_DIR/NAME/spec.json`` and starts a root monitor for the
workload (``hub_ext.host.monitor``); the monitor, not the hub, is the workload's parent, so
the workload outlives the hub and its end is still recorded. A hub that starts later calls
``Launcher.adopt(name)`` and gets the same ``Handle``: alive (checked by pid and the start
time in /proc, so a reused pid is never taken for it) or ended with its ``Exit``.

A workload's environment is exactly ``Spec.env``: nothing of the hub's is inherited.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import regions
from .accounts import Account
from .cgroups import Cgroups, Limits, detect, group_from_json
from .errors import LaunchError, SpecError
from .state import (
    CHILD,
    ERROR,
    EXIT,
    MONITOR_LOG,
    SPEC,
    Exit,
    proc_stat,
    read_json,
    same_process,
    write_json,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REGION_ENV = "GPUPOOL_SHARED_REGION"
REGION_FILE = "region"  # run/NAME/region: the region file created for the workload
_ROOT = Path(__file__).resolve().parents[2]  # where hub_ext and gpupool are importable
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Spec:
    """What to run. ``env`` is the workload's complete environment; ``cwd`` defaults to the
    account's home and ``log_path`` (its stdout and stderr, owned by the account, 0600) to
    ``RUN_DIR/NAME/output.log``."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | Path | None
    account: Account
    limits: Limits = field(default_factory=Limits)
    log_path: str | Path | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise SpecError(f"workload name {self.name!r}: 1 to 100 of A-Z, a-z, 0-9, '_', '.', '-', "
                            "starting with a letter or digit")
        if isinstance(self.argv, str) or not self.argv or not all(isinstance(a, str) and "\0" not in a
                                                                   for a in self.argv):
            raise SpecError(f"argv of {self.name!r}: a non-empty list of strings without NUL")
        bad = [k for k, v in self.env.items() if not isinstance(k, str) or not isinstance(v, str)
               or not k or "=" in k or "\0" in k or "\0" in v]
        if bad:
            raise SpecError(f"env of {self.name!r}: names {bad!r} are not NAME=string pairs "
                            "(no '=' in a name, no NUL)")
        if not isinstance(self.account, Account):
            raise SpecError(f"account of {self.name!r}: an accounts.Account")
        if not isinstance(self.limits, Limits):
            raise SpecError(f"limits of {self.name!r}: a cgroups.Limits")


class Handle:
    """One workload started by a ``Launcher`` (now or before a hub restart)."""

    def __init__(self, run: Path, info: dict, monitor: subprocess.Popen | None = None):
        self.run = run
        self.name = run.name
        self.pid: int = info["pid"]
        self.start_time: int | None = info.get("start_time")
        self.started_at: float | None = info.get("started_at")
        self.monitor_pid: int = info["monitor_pid"]
        self.monitor_start_time: int | None = info.get("monitor_start_time")
        self.memory_limit_bytes: int | None = info.get("memory_limit_bytes")
        self.group = group_from_json(info.get("group"))
        self._monitor = monitor

    def __repr__(self) -> str:
        return f"<Handle {self.name} pid={self.pid}>"

    def _reap(self) -> None:
        """Collect the monitor's exit status when it is this process's child, so that no
        zombie is left: through its Popen, or (adopted in the same process) by pid once it is
        a zombie of ours with the recorded start time, so that no other child is reaped."""
        if self._monitor is not None:
            self._monitor.poll()
            return
        st = proc_stat(self.monitor_pid)
        if st is not None and st[0] == "Z" and st[1] == os.getpid() and st[2] == self.monitor_start_time:
            try:
                os.waitpid(self.monitor_pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def _recorded_exit(self) -> Exit | None:
        d = read_json(self.run / EXIT)
        return Exit.from_json(d) if d is not None else None

    def alive(self) -> bool:
        """Whether the workload's process still runs (not merely its pid reused)."""
        return same_process(self.pid, self.start_time) and not (self.run / EXIT).exists()

    def monitor_alive(self) -> bool:
        self._reap()
        return same_process(self.monitor_pid, self.monitor_start_time)

    def exit(self) -> Exit | None:
        """How it ended, or None while it runs. A monitor killed before it could write the
        end gives ``Exit(None, None)``: "ended; its monitor was killed"."""
        self._reap()
        end = self._recorded_exit()
        if end is not None:
            return end
        if same_process(self.pid, self.start_time) or self.monitor_alive():
            return None
        return self._recorded_exit() or Exit(None, None, False, self.memory_limit_bytes)

    async def wait(self, poll_s: float = 0.5) -> Exit:
        while True:
            end = self.exit()
            if end is not None:
                return end
            await asyncio.sleep(poll_s)

    async def terminate(self, grace_s: float = 10.0) -> Exit | None:
        """SIGTERM the workload's process group; after ``grace_s`` SIGKILL every process in
        its cgroup (its process group when there is none). Returns how it ended."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.exit() is None and time.monotonic() < deadline:
                await asyncio.sleep(min(0.05, grace_s))
        if self.exit() is None:
            if self.alive():
                self._signal_group(signal.SIGKILL)
            self.group.kill(exclude={self.monitor_pid})
        deadline = time.monotonic() + 10
        while (end := self.exit()) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return end

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the workload is its own session and process group
        except ProcessLookupError:
            pass

    def cpu_seconds(self) -> float | None:
        """CPU time used: by its cgroup while it runs, as recorded once it ended; without a
        cgroup, by the workload's own process."""
        end = self._recorded_exit()
        if end is not None:
            return end.cpu_seconds
        used = self.group.cpu_seconds()
        if used is None and self.alive():
            try:
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                used = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
            except (OSError, IndexError, ValueError):
                return None
        return used

    def memory_bytes(self) -> int | None:
        """Memory in use now (its cgroup's, else the workload's resident set); None once ended."""
        if not self.alive():
            return None
        used = self.group.memory_bytes()
        if used is None:
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
            except (OSError, ValueError):
                return None
        return used


class Launcher:
    """Starts workloads under their monitors, each in ``run_dir/NAME`` (0700, root's)."""

    def __init__(self, run_dir: str | Path, cgroups: Cgroups | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.run_dir, 0o700)
        self.cgroups = cgroups if cgroups is not None else detect()
        self.regions = regions.region_dir(self.run_dir)
        self._starting: set[str] = set()

    def _dir(self, name: str) -> Path:
        if not isinstance(name, str) or not NAME.match(name):
            raise SpecError(f"workload name {name!r}: 1 to 100 of A-Z, a-z, 0-9, '_', '.', '-'")
        return self.run_dir / name

    def group_name(self, name: str) -> str:
        """The cgroup (or systemd scope) of workload ``name``: its name and a digest of
        ``run_dir``, so that two hubs on one host (or two test runs) never share one."""
        return f"{name}.{regions.run_digest(self.run_dir)}"

    def region(self, name: str) -> str:
        """The interception library's account of ``name`` (GPUPOOL_SHARED_REGION), in this
        launcher's own folder of regions (hub_ext/host/regions.py). A workload whose
        environment names one gets it created, owned by its account, when it starts."""
        self._dir(name)  # the same names as workloads
        return str(self.regions / name)

    def _region_of(self, spec: Spec) -> Path | None:
        value = spec.env.get(REGION_ENV)
        if value is None:
            return None
        path = Path(value)
        if path.parent != self.regions or not NAME.match(path.name):
            raise SpecError(f"{REGION_ENV} of {spec.name!r}: {value!r} is not a region of this "
                            f"launcher (Launcher.region gives {self.regions}/NAME)")
        return path

    async def start(self, spec: Spec, timeout_s: float = 30.0) -> Handle:
        """Start ``spec`` and return once its process runs (exec'd, in its cgroup, as its
        account). A workload of that name still running is an error; one that ended is
        forgotten first."""
        run = self._dir(spec.name)
        if spec.name in self._starting:
            raise LaunchError(f"workload {spec.name!r} is being started already")
        self._starting.add(spec.name)
        try:
            return await self._start(run, spec, timeout_s)
        finally:
            self._starting.discard(spec.name)

    async def _start(self, run: Path, spec: Spec, timeout_s: float) -> Handle:
        if run.exists():
            old = self.adopt(spec.name)
            if old is not None and old.exit() is None:
                raise LaunchError(f"workload {spec.name!r} is already running (pid {old.pid})")
            shutil.rmtree(run)
        region = self._region_of(spec)
        if region is not None:
            regions.create(region, spec.account.uid, spec.account.gid)
        run.mkdir(mode=0o700)
        write_json(run / SPEC, {
            "name": spec.name, "argv": list(spec.argv), "env": dict(spec.env),
            "cwd": str(spec.cwd if spec.cwd is not None else spec.account.home),
            "account": spec.account.to_json(), "limits": spec.limits.to_json(),
            "log_path": str(spec.log_path if spec.log_path is not None else run / "output.log"),
            "cgroups": self.cgroups.to_json(), "group_name": self.group_name(spec.name),
        })
        if region is not None:  # spec.json is the monitor's to delete: forget() reads this
            (run / REGION_FILE).write_text(str(region))
        argv = self.cgroups.wrap(self.group_name(spec.name), spec.limits,
                                 [sys.executable, "-S", "-u", "-m", "hub_ext.host.monitor", str(run)])
        # The monitor gets no environment of the hub's either: only where to find itself.
        env = {"PATH": os.defpath, "PYTHONPATH": str(_ROOT), "LC_ALL": "C.UTF-8"}
        with open(run / MONITOR_LOG, "ab") as log:
            monitor = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, cwd="/", start_new_session=True)
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while True:
            info = read_json(run / CHILD)
            if info is not None:
                return Handle(run, info, monitor)
            if monitor.poll() is not None:
                why = self._why(run, monitor.returncode)
                shutil.rmtree(run, ignore_errors=True)  # nothing runs: nothing to adopt later
                raise LaunchError(f"workload {spec.name!r} did not start: {why}")
            if time.monotonic() > deadline:
                monitor.kill()
                monitor.wait()
                shutil.rmtree(run, ignore_errors=True)
                raise LaunchError(f"workload {spec.name!r} did not start within {timeout_s:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    @staticmethod
    def _why(run: Path, returncode: int | None) -> str:
        try:
            return (run / ERROR).read_text().strip()
        except FileNotFoundError:
            pass
        try:
            tail = (run / MONITOR_LOG).read_text()[-1000:].strip()
        except FileNotFoundError:
            tail = ""
        return f"its monitor exited with status {returncode}" + (f": {tail}" if tail else "")

    def adopt(self, name: str) -> Handle | None:
        """The handle of workload ``name`` started earlier (by this or an earlier hub), alive
        or with its end still unread; None when ``run_dir`` has no started workload so named."""
        info = read_json(self._dir(name) / CHILD)
        return Handle(self.run_dir / name, info) if info is not None else None

    def names(self) -> list[str]:
        """The workloads ``run_dir`` holds (running, or ended and not yet forgotten)."""
        return sorted(p.name for p in self.run_dir.iterdir() if p.is_dir() and NAME.match(p.name))

    def forget(self, name: str) -> None:
        """Remove ``run_dir/NAME`` once the workload's end has been reported (and its cgroup,
        when its monitor was killed before it could remove it)."""
        run = self._dir(name)
        handle = self.adopt(name)
        if handle is not None:
            if handle.exit() is None:
                raise LaunchError(f"workload {name!r} is still running (pid {handle.pid}); terminate it first")
            if not handle.monitor_alive() and handle.group.exists():
                handle.group.remove()  # its monitor was killed before it could
        try:
            region = Path((run / REGION_FILE).read_text())
        except FileNotFoundError:
            region = None
        if region is not None and region.parent == self.regions:
            regions.remove(region)
        shutil.rmtree(run, ignore_errors=True)


__all__ = ["Exit", "Handle", "Launcher", "Spec"]
