"""Sessions of the SSH gateway on this host (embedded mode).

A login's shell, command or SFTP server is a process started through
``hub_ext.host.enter``: the workload's account, cgroup and environment, as its own
processes have them. SFTP is the system's OpenSSH ``sftp-server`` started the same way, so
every file it touches is touched as the account.
A local forward goes only to a port on the loopback address that a process of the
workload listens on (never to the hub's own ports or another workload's).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import struct
import sys
import termios
from pathlib import Path

import asyncssh
from sqlalchemy import select

from ..config import ROOT
from ..db.tables import WorkloadRow
from ..host.accounts import login_shell
from ..host.enter import NotRunning, target
from ..requests.rules import workload_name

SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")
LOOPBACK = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}
_WORKER = re.compile(r"(.+)-w\d+$")
_LISTEN = "0A"


def sftp_server() -> str | None:
    return next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)


class EmbeddedBackend:
    def __init__(self, run_dir: Path, Session):
        self.run_dir, self.Session = Path(run_dir), Session

    async def workload(self, user: str, name: str) -> str | None:
        """USER's workspace NAME (its default one for ''), or a training worker or inference
        replica named NAME whose workload USER owns; only while it runs."""
        candidates = [workload_name(user, name)]
        if name:
            with self.Session() as s:
                owner = s.scalar(select(WorkloadRow.owner).where(
                    WorkloadRow.name.in_({name, *(m.group(1) for m in [_WORKER.match(name)] if m)})))
            if owner == user:
                candidates.append(name)
        for c in candidates:
            try:
                target(self.run_dir / c)
                return c
            except (NotRunning, ValueError):
                continue
        return None

    def argv(self, process: asyncssh.SSHServerProcess, shell: str) -> list[str]:
        if process.subsystem == "sftp":
            server = sftp_server()
            if server is None:
                raise RuntimeError("this host has no sftp-server (Debian: apt-get install openssh-sftp-server)")
            return [server]
        if process.subsystem:
            raise RuntimeError(f"no subsystem {process.subsystem!r}")
        if process.command is not None:
            return [shell, "-c", process.command]
        return [shell, "-i"] if shell.endswith("sh") else [shell]

    async def session(self, process: asyncssh.SSHServerProcess, workload: str) -> int:
        run = self.run_dir / workload
        t = target(run)
        argv = self.argv(process, login_shell(t.uid))
        extra = {"GPUPOOL_SSH": "1"}
        if process.term_type:
            extra["TERM"] = process.term_type
        cmd = [sys.executable, "-S", "-m", "hub_ext.host.enter", str(run),
               *(a for k, v in extra.items() for a in ("--env", f"{k}={v}")), "--", *argv]
        env = {"PATH": os.defpath, "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8"}
        if process.term_type and process.subsystem is None:
            return await _with_pty(process, cmd, env)
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=env, cwd="/")
        await process.redirect(stdin=proc.stdin, stdout=proc.stdout, stderr=proc.stderr)
        code = await proc.wait()
        await process.stdout.drain()
        return code

    def tcp_session(self, workload: str, host: str, port: int):
        return True  # asyncssh connects to HOST:PORT itself: this host is the workload's

    def may_forward(self, workload: str, host: str, port: int) -> bool:
        if host.lower() not in LOOPBACK or not 0 < port < 65536:
            return False
        try:
            t = target(self.run_dir / workload)
        except NotRunning:
            return False
        return bool(listening_inodes(port) & socket_inodes(workload_pids(t.pid, t.group.pids())))


async def _with_pty(process: asyncssh.SSHServerProcess, cmd: list[str], env: dict[str, str]) -> int:
    master, slave = os.openpty()
    cols, rows, pw, ph = process.term_size
    if cols and rows:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, pw, ph))
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=slave, stdout=slave, stderr=slave,
                                                    env=env, cwd="/")
    finally:
        os.close(slave)
    process.set_redirect_pid(proc.pid)  # window size changes and signals reach the shell
    reader = os.fdopen(master, "rb", buffering=0)
    writer = os.fdopen(os.dup(master), "wb", buffering=0)
    await process.redirect(stdin=writer, stdout=reader, send_eof=False)
    code = await proc.wait()
    await asyncio.sleep(0.1)  # the last output still in the pty
    await process.stdout.drain()
    return code


def workload_pids(pid: int, group_pids: list[int]) -> set[int]:
    """The workload's processes: its cgroup's, or without a cgroup its process and descendants."""
    if group_pids:
        return set(group_pids)
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(children.get(p, ()))
    return found


def socket_inodes(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def listening_inodes(port: int) -> set[int]:
    """Inodes of TCP sockets listening on ``port`` on a loopback or any address."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr, _, p = f[1].rpartition(":")
            if f[3] == _LISTEN and int(p, 16) == port and _loopback_or_any(addr):
                inodes.add(int(f[9]))
    return inodes


def _loopback_or_any(hexaddr: str) -> bool:
    if len(hexaddr) == 8:
        return hexaddr in ("00000000", "0100007F")
    return hexaddr in ("0" * 32, "0" * 24 + "01000000", "0000000000000000FFFF00000100007F")


__all__ = ["EmbeddedBackend", "listening_inodes", "sftp_server", "socket_inodes", "workload_pids"]
