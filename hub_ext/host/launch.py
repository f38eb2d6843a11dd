"""What every workload process of embedded mode gets from the hub, in one place: an
environment built from scratch for its owner's account, private folders in that account's
home, and the GPU device files of its placement (for the device cgroup).

Folders and files in an account's home are made by the hub (root) in a tree the account
controls, so every step opens the next component with ``O_NOFOLLOW`` relative to the one
before: a symlink the account planted (``~/.gpupool -> /etc``) fails the call instead of
sending root's ``mkdir``, ``chown`` or ``rmtree`` elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from scheduler.model import Node, PodPlacement

from .accounts import Account, login_shell
from .errors import LaunchError
from .process import Handle, Launcher, Spec

log = logging.getLogger("gpupool")

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
PRIVATE = ".gpupool"  # the account's folder for what gpupool puts in its home
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def account_env(account: Account) -> dict[str, str]:
    """The base environment of a workload: nothing of the hub's (its environment holds
    passwords and tokens), gpupool's Python first on PATH, and the account's login shell as
    SHELL (what a JupyterLab terminal runs)."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{BASE_PATH}",
        "HOME": str(account.home), "USER": account.name, "LOGNAME": account.name,
        "SHELL": login_shell(account.uid),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }


async def forget(launcher: Launcher, handle: Handle, timeout_s: float = 30.0) -> None:
    """Let the launcher drop an ended workload once its monitor has finished (it still
    clears the cgroup after the exit is recorded), so the name can be started again."""
    deadline = time.monotonic() + timeout_s
    while handle.monitor_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    try:
        launcher.forget(handle.name)
    except LaunchError as e:  # still running after all: keep its record for a later hub
        log.warning("%s", e)


async def start(launcher: Launcher, spec: Spec) -> Handle:
    """``launcher.start(spec)``, but a caller cancelled meanwhile (a replica scaled down
    while it started) does not leave the workload running unfollowed: it is ended."""
    starting = asyncio.ensure_future(launcher.start(spec))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        def end(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                asyncio.ensure_future(reap(launcher, f.result()))

        starting.add_done_callback(end)
        raise


async def reap(launcher: Launcher, *handles: Handle) -> None:
    """End workloads nobody goes on with (left from a gang that cannot go on, or with no
    record to take them back by) and forget them."""
    await asyncio.gather(*(h.terminate(0.01) for h in handles if h.alive()))
    await asyncio.gather(*(forget(launcher, h) for h in handles))


def in_environment(environment: dict | None, env: dict[str, str], argv: list[str]) -> tuple[dict, list[str]]:
    """A workload's environment and argv inside a named environment (Gpupool.environments):
    its ``prefix`` (a venv or conda prefix) first on PATH, as activation does, and its
    ``start_command`` run by the shell before the workload's own program."""
    environment = environment or {}
    env, argv = dict(env), list(argv)
    prefix = environment.get("prefix") or ""
    if prefix:
        env["PATH"] = f"{prefix.rstrip('/')}/bin:{env.get('PATH', BASE_PATH)}"
        env["CONDA_PREFIX" if Path(prefix, "conda-meta").is_dir() else "VIRTUAL_ENV"] = prefix
    start = environment.get("start_command") or ""
    if start and argv:
        argv = ["/bin/sh", "-c", f'{start}\nexec "$@"', "sh", *argv]
    return env, argv


def check_argv(argv: list[str], env: dict[str, str]) -> None:
    """Refuse at once what could never start, with the reason: no command, a NUL byte,
    or a program not found on the workload's PATH (ValueError, FileNotFoundError)."""
    if not argv:
        raise ValueError("no command")
    for k, v in (*((a, a) for a in argv), *env.items()):
        if "\0" in k or "\0" in v:
            raise ValueError("embedded null byte")
    relative = "/" in argv[0] and not argv[0].startswith("/")  # found from the workload's cwd
    if not relative and shutil.which(argv[0], path=env.get("PATH", BASE_PATH)) is None:
        raise FileNotFoundError(f"no such program: {argv[0]!r}")


def gpu_devices(node: Node, pod: PodPlacement) -> tuple[str, ...]:
    """The GPUs (``/dev/nvidiaN`` by index N) a workload placed on ``pod`` may open: its own."""
    return tuple(str(node.gpus[i].index) for i in pod.gpu_indices)


@contextlib.contextmanager
def _opened(account: Account, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """A descriptor of HOME/PARTS..., each folder the account's and mode 0700 (made when
    ``create``). FileNotFoundError when one is missing and not ``create``; OSError when
    one is a symlink or another account's."""
    fd = os.open(account.home, _DIR)
    try:
        for part in parts:
            if not part or "/" in part or part in (".", ".."):
                raise ValueError(f"not a folder name: {part!r}")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            if st.st_uid not in (account.uid, os.geteuid()):
                raise PermissionError(f"{account.home.joinpath(*parts)} holds a folder of another account")
            if create and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (account.uid, account.gid, 0o700):
                os.fchown(fd, account.uid, account.gid)
                os.fchmod(fd, 0o700)
        yield fd
    finally:
        os.close(fd)


def private_dir(account: Account, *parts: str) -> Path:
    """HOME/.gpupool/PARTS, made where missing: the account's, mode 0700."""
    with _opened(account, (PRIVATE, *parts), create=True):
        return account.home.joinpath(PRIVATE, *parts)


def write_private(account: Account, parts: tuple[str, ...], files: dict[str, str], mode: int = 0o400) -> Path:
    """Write ``files`` (name -> text) into HOME/.gpupool/PARTS as new files the account
    owns with ``mode``; the folder's path."""
    with _opened(account, (PRIVATE, *parts), create=True) as dfd:
        for name, text in files.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            try:
                os.fchown(fd, account.uid, account.gid)
                os.write(fd, text.encode())
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    return account.home.joinpath(PRIVATE, *parts)


def log_header(account: Account, parts: tuple[str, ...], name: str, text: str, fresh: bool) -> None:
    """Write a header line into a log file of the account's folder (made, the account's, when
    missing); ``fresh``: start the file anew (a new workload of an earlier one's name)."""
    # no link followed, no FIFO waited on, nothing truncated before it is known to be the log
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
    with _opened(account, (PRIVATE, *parts), create=True) as dfd:
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (account.uid, 0):
                raise OSError(f"{name} in {account.home.joinpath(PRIVATE, *parts)} is not a plain file")
            if st.st_uid != account.uid:
                os.fchown(fd, account.uid, account.gid)
            if fresh:
                os.ftruncate(fd, 0)
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def seed_file(account: Account, parts: tuple[str, ...], name: str, text: str) -> bool:
    """Write HOME/PARTS/NAME (folders made where missing) as a new file the account owns,
    unless something is already there: the account's own version wins. Whether written."""
    with _opened(account, parts, create=True) as dfd:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        except FileExistsError:
            return False
        try:
            os.fchown(fd, account.uid, account.gid)
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    return True


def remove_private(account: Account, *parts: str) -> None:
    """Remove HOME/.gpupool/PARTS and everything in it (nothing if it is not there)."""
    *parents, last = parts
    try:
        with _opened(account, (PRIVATE, *parents), create=False) as dfd:
            shutil.rmtree(last, dir_fd=dfd)
    except FileNotFoundError:
        pass


def link_in_home(account: Account, folder: Path, name: str, target: str) -> bool:
    """Make the symlink FOLDER/NAME -> TARGET, owned by the account, where FOLDER is in its
    home (made where missing); an earlier symlink there is replaced, anything else (the
    account's own file or folder) is kept. Whether the link is there now."""
    parts = folder.relative_to(account.home).parts  # ValueError: not in the home
    with _opened(account, parts, create=True) as dfd:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            return False
        if st is not None:
            os.unlink(name, dir_fd=dfd)
        os.symlink(target, name, dir_fd=dfd)
        os.chown(name, account.uid, account.gid, dir_fd=dfd, follow_symlinks=False)
        return True


def read_tail(path: Path, uid: int, max_bytes: int) -> str:
    """The last ``max_bytes`` of a log file an account wrote, read by the hub: "" unless it
    is a plain file (never through a symlink) of that account or of the hub's own user."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (uid, os.geteuid()):
            return ""
        f.seek(max(0, st.st_size - max_bytes))
        return f.read().decode(errors="replace")


OUTPUT_LOGS = {  # where each kind's output goes in its account's home (HOME/.gpupool/...)
    "workspace": ("logs", "{name}.log"),
    "replica": ("serve", "{name}", "server.log"),  # an inference service's replica
    "command": ("workloads", "{name}", "output.log"),  # a training or inference workload of its own
}


def output_log(home: str | Path, kind: str, name: str) -> Path:
    """The output file of workload ``name`` of ``kind`` (a key of OUTPUT_LOGS)."""
    return Path(home, PRIVATE, *(p.format(name=name) for p in OUTPUT_LOGS[kind]))


def read_from(path: Path, uid: int, offset: int | None, max_bytes: int) -> tuple[str, int]:
    """What an account's log file holds after byte ``offset`` (None: its last ``max_bytes``),
    at most ``max_bytes`` of it, and the offset it ends at: "" unless it is a plain file of
    that account, opened without following a final symlink.
    A file shorter than ``offset`` was started anew: read from its start."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "", offset or 0
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        # the account's file only (root's own files are never shown, wherever a link led)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return "", offset or 0
        start = max(0, st.st_size - max_bytes) if offset is None else (0 if offset > st.st_size else offset)
        f.seek(start)
        data = f.read(max_bytes)
        if offset is not None:  # whole lines only: the rest comes with the next read
            data = data[:data.rfind(b"\n") + 1]
        return data.decode(errors="replace"), start + len(data)


__all__ = ["OUTPUT_LOGS", "PRIVATE", "output_log", "account_env", "check_argv", "in_environment", "forget", "gpu_devices", "link_in_home", "log_header", "private_dir", "read_from", "read_tail", "reap", "start",
           "remove_private", "write_private"]
