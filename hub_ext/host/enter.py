"""Entering a running workload's environment: ``python -m hub_ext.host.enter RUN_DIR/NAME
[--env NAME=VALUE]... -- ARGV...`` (as root).

The one place that turns a root process into one of a workload's own processes:
``become`` (the account, used by the monitor too), ``join`` (the cgroup) and ``enter``
(both, plus the workload's environment, read from its process as it was exec'd). A shell or
an SFTP server started here therefore sees exactly the GPU share, memory cap and
``LD_PRELOAD`` the workload was given, and its files are the account's.

Standard library and this package only, like the monitor.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import signal
import sys
import termios
from dataclasses import dataclass
from pathlib import Path

from .cgroups import Group, ScopeGroup, group_from_json
from .errors import LaunchError
from .state import CHILD, EXIT, read_json, same_process

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


class NotRunning(LaunchError):
    """The workload has no running process to enter."""


def become(name: str, uid: int, gid: int) -> None:
    """Drop from root to the account (its groups too); refuses root and checks the result."""
    if os.geteuid() == 0:
        if uid == 0:
            raise RuntimeError("refusing to run a workload as root")
        try:
            os.initgroups(name, gid)
        except OSError:
            os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (uid, uid, gid, gid):
        raise RuntimeError(f"could not become uid {uid} gid {gid}")


def join(group: Group, pid: int) -> None:
    """Move ``pid`` into the workload's cgroup (a systemd scope's through its cgroup view)."""
    (group.view if isinstance(group, ScopeGroup) else group).add(pid)


@dataclass(frozen=True)
class Target:
    """A running workload as seen from outside: its process, account, cgroup and env."""

    name: str
    pid: int
    uid: int
    gid: int
    account: str
    group: Group
    env: dict[str, str]

    @property
    def home(self) -> str:
        return self.env.get("HOME") or pwd.getpwuid(self.uid).pw_dir


def target(run: Path) -> Target:
    """The running workload of ``RUN_DIR/NAME``; NotRunning when it has none."""
    info = read_json(run / CHILD)
    if info is None or (run / EXIT).exists() or not same_process(info["pid"], info.get("start_time")):
        raise NotRunning(run.name)
    pid = info["pid"]
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        st = os.stat(f"/proc/{pid}")
    except OSError:
        raise NotRunning(run.name) from None
    env = dict(kv.split("=", 1) for kv in raw.decode(errors="surrogateescape").split("\0") if "=" in kv)
    if not same_process(pid, info.get("start_time")):  # read from a reused pid
        raise NotRunning(run.name)
    return Target(run.name, pid, st.st_uid, st.st_gid, pwd.getpwuid(st.st_uid).pw_name,
                  group_from_json(info.get("group")), env)


def enter(t: Target, argv: list[str], extra_env: dict[str, str]) -> None:
    """Become one of ``t``'s processes and exec ``argv``: its cgroup, a new session (with
    stdin as controlling terminal when it is one), its account, its home and its env."""
    os.setsid()
    if os.isatty(0):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    join(t.group, os.getpid())
    become(t.account, t.uid, t.gid)
    try:
        os.chdir(t.home)
    except OSError:
        os.chdir("/")
    os.umask(0o077)
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.execvpe(argv[0], argv, {**t.env, **extra_env})


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or args.index("--") < 1 or args.index("--") == len(args) - 1:
        print("usage: python -m hub_ext.host.enter RUN_DIR/NAME [--env NAME=VALUE]... -- ARGV...",
              file=sys.stderr)
        return 2
    sep = args.index("--")
    run, opts, command = Path(args[0]), args[1:sep], args[sep + 1:]
    extra = {}
    while opts:
        if opts[0] != "--env" or len(opts) < 2 or "=" not in opts[1]:
            print(f"enter: unknown option {opts[0]!r}", file=sys.stderr)
            return 2
        k, v = opts[1].split("=", 1)
        extra[k] = v
        opts = opts[2:]
    try:
        enter(target(run), command, extra)
    except NotRunning:
        print(f"workload {run.name} is not running", file=sys.stderr)
        return 125
    except OSError as e:
        print(f"cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    return 127


if __name__ == "__main__":
    sys.exit(main())
