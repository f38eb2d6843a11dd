"""The root monitor of one workload: ``python -m hub_ext.host.monitor RUN_DIR/NAME``.

Like podman's conmon, a small process per workload that is nobody's child but init's once
the hub has gone: it makes the workload's cgroup, forks the workload (which joins the
cgroup, drops to its account and becomes its own session and process group), and waits
for it. Because it, not the hub, is the parent, the workload keeps running when the hub is
restarted or SIGKILLed, and its exit status (and whether the OOM killer ended it) is still
collected and written to ``exit.json`` for whichever hub adopts it later, once it has killed
what the workload left behind in its cgroup and removed the cgroup.

Single-threaded, so a plain ``os.fork`` is safe. Standard library and this package only, so
that it starts quickly. It ignores SIGTERM, SIGINT and SIGHUP: stopping a workload is
signalling the workload, never its monitor.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
import traceback
from pathlib import Path

from .cgroups import Group, Limits, cgroups_from_json
from .enter import become
from .errors import CgroupError
from .state import CHILD, ERROR, EXIT, SPEC, Exit, proc_start_time, proc_stat, write_json

_CHILD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


def read_spec(run: Path) -> dict:
    """Read and delete ``spec.json``: its environment may hold the workload's secrets."""
    path = run / SPEC
    st = os.lstat(path)
    if os.geteuid() == 0 and (st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077 or not stat.S_ISREG(st.st_mode)):
        raise RuntimeError(f"{path} is not a 0600 file of root's")
    spec = json.loads(path.read_text())
    path.unlink()
    return spec


def root_safe(path: Path) -> bool:
    """Whether every directory above ``path`` is root's, no link, and writable by root only
    (or sticky, like /tmp): then no other account can swap a part of the path for a link
    while root opens it."""
    for d in reversed(path.parents):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return False
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX  # sticky /tmp: no swapping others' entries
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or shared:
            return False
    return True


def _open_log(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise RuntimeError(f"log {path} is not a plain file with one link")
    return fd


def open_log(path: Path, uid: int, gid: int) -> int | None:
    """The workload's output file, owned by the account (0600). Root opens it only on a path
    no other account controls (made by the hub, in its state directory); anywhere else
    (an account's home, /tmp) the workload opens it itself once it is the account, so a
    link planted there can make root create or hand over no file. None: the child opens it."""
    if os.geteuid() != 0:  # personal mode: the account is ours
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return _open_log(path)
    if not root_safe(path):
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = _open_log(path)
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o600)
    return fd


def _oom_score_adj(value: int) -> None:
    try:
        Path("/proc/self/oom_score_adj").write_text(str(value))
    except OSError:
        pass


def child(spec: dict, group: Group, log_fd: int | None, report: int) -> None:
    """In the forked child: join the cgroup, drop to the account, exec. Never returns; a
    failure is written to ``report`` (closed on a successful exec) and exits 127."""
    try:
        os.setsid()
        group.add(os.getpid())
        _oom_score_adj(0)  # the monitor protects itself; the workload is fair game
        acct = spec["account"]
        become(acct["name"], int(acct["uid"]), int(acct["gid"]))
        if log_fd is None:  # as the account: its own folders, made by itself
            Path(spec["log_path"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            log_fd = _open_log(Path(spec["log_path"]))
        os.chdir(spec["cwd"])
        os.umask(0o077)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for sig in _CHILD_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # ignored signals would survive exec
        argv = spec["argv"]
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as e:  # noqa: BLE001 - everything goes to the monitor, then exit
        try:
            os.write(report, f"cannot run {spec.get('argv', ['?'])[0]!r}: {e}".encode())
        finally:
            os._exit(127)


def _start(run: Path, spec: dict, group: Group) -> tuple[int, float]:
    """Fork the workload and return its pid once it has exec'd."""
    acct = spec["account"]
    log_fd = open_log(Path(spec["log_path"]), int(acct["uid"]), int(acct["gid"]))
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child(spec, group, log_fd, w)
    started_at = time.time()
    os.close(w)
    if log_fd is not None:
        os.close(log_fd)
    with os.fdopen(r, "rb") as f:
        failure = f.read()
    if failure:
        os.waitpid(pid, 0)
        raise RuntimeError(failure.decode(errors="replace"))
    return pid, started_at


def run(run: Path) -> int:
    spec = read_spec(run)
    limits = Limits.from_json(spec["limits"])
    group = cgroups_from_json(spec["cgroups"]).create(spec["group_name"], limits)
    try:
        pid, started_at = _start(run, spec, group)
    except BaseException:
        group.remove()
        raise
    try:
        write_json(run / CHILD, {
            "pid": pid, "start_time": proc_stat(pid)[2], "started_at": started_at,  # a zombie's too
            "monitor_pid": os.getpid(), "monitor_start_time": proc_start_time(os.getpid()),
            "group": group.to_json(), "memory_limit_bytes": limits.memory_bytes,
        })
    except BaseException:  # a workload nobody could find again must not run on
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        group.remove()
        raise
    _, status, usage = os.wait4(pid, 0)
    ended_at = time.time()
    cpu = group.cpu_seconds()
    if cpu is None:  # no cgroup: the workload and the children it waited for
        cpu = usage.ru_utime + usage.ru_stime
    oom = group.oom_kills() > 0
    try:
        os.killpg(pid, signal.SIGKILL)  # what the workload left in its process group
    except (ProcessLookupError, PermissionError):
        pass
    # Everything is cleaned up before the end is written, so that a hub reading exit.json
    # knows nothing of the workload is left and its name may be started again.
    group.kill(exclude={os.getpid()})  # a systemd scope holds the monitor too
    try:
        group.remove()
    except CgroupError as e:
        print(f"{spec['name']}: {e}", flush=True)
    end = Exit(
        code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        oom=oom, memory_limit_bytes=limits.memory_bytes, ended_at=ended_at, cpu_seconds=cpu,
    )
    print(f"{spec['name']}: {end.describe()}", flush=True)
    write_json(run / EXIT, end.to_json())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m hub_ext.host.monitor RUN_DIR/NAME", file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (started with start_new_session)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _oom_score_adj(-1000)  # in a systemd scope the monitor shares the workload's memory limit
    try:
        return run(run_dir)
    except BaseException as e:  # noqa: BLE001 - the hub reads why from the error file
        traceback.print_exc()
        try:
            (run_dir / ERROR).write_text(str(e) or type(e).__name__)
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
