"""The files of one workload's run directory (``RUN_DIR/NAME``), written by the hub and its
monitor and read by whichever hub runs later, so that a workload started before a hub
restart can be adopted and still reports how it ended:

- ``spec.json``  what to run (the hub writes it 0600; the monitor deletes it once read, since
  the environment may hold secrets);
- ``child.pid``  the workload's pid and its start time in /proc (so a reused pid is not
  mistaken for it), the monitor's, and the cgroup it runs in;
- ``exit.json``  how it ended: exit code or signal, OOM, CPU seconds;
- ``error``      why the monitor could not start the workload;
- ``monitor.log`` the monitor's own output.

Standard library only: the monitor imports it at start.
"""

from __future__ import annotations

import json
import os
import signal as _signal
from dataclasses import dataclass
from pathlib import Path

RUN_DIR = "run"  # STATE_DIR/run: the launcher's folder of workload run directories
SPEC = "spec.json"
CHILD = "child.pid"
EXIT = "exit.json"
ERROR = "error"
MONITOR_LOG = "monitor.log"


def write_json(path: Path, data: dict, mode: int = 0o600) -> None:
    """Write atomically: a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) from /proc/PID/stat, or None when there is no such
    process. The start time (field 22, clock ticks since boot) and the pid together identify
    one process for good, whatever later reuses the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[19])


def proc_start_time(pid: int) -> int | None:
    """The start time of ``pid`` while it runs; None when it is gone or a zombie."""
    st = proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else st[2]


def same_process(pid: int | None, start_time: int | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``start_time``."""
    return pid is not None and start_time is not None and proc_start_time(pid) == start_time


@dataclass(frozen=True)
class Exit:
    """How a workload ended. ``code`` and ``signal`` are both None when its monitor was
    killed before it could record the end. ``oom``: the kernel's OOM killer killed a
    process of the workload's cgroup (its limit in ``memory_limit_bytes`` when known)."""

    code: int | None
    signal: int | None
    oom: bool = False
    memory_limit_bytes: int | None = None
    ended_at: float | None = None
    cpu_seconds: float | None = None

    def describe(self) -> str:
        if self.oom:
            limit = f" (limit {_mib(self.memory_limit_bytes)})" if self.memory_limit_bytes else ""
            return f"killed: out of memory{limit}"
        if self.signal is not None:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        if self.code is not None:
            return f"exit code {self.code}"
        return "ended; its monitor was killed"

    def to_json(self) -> dict:
        return {"code": self.code, "signal": self.signal, "oom": self.oom,
                "memory_limit_bytes": self.memory_limit_bytes, "ended_at": self.ended_at,
                "cpu_seconds": self.cpu_seconds}

    @classmethod
    def from_json(cls, d: dict) -> Exit:
        return cls(d.get("code"), d.get("signal"), bool(d.get("oom")), d.get("memory_limit_bytes"),
                   d.get("ended_at"), d.get("cpu_seconds"))


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


__all__ = ["CHILD", "ERROR", "EXIT", "Exit", "MONITOR_LOG", "SPEC", "proc_start_time", "proc_stat", "read_json",
           "same_process", "write_json"]
