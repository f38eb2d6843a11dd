"""The interception library's shared accounts on this host (GPUPOOL_SHARED_REGION): one
file per fractional workload, holding its GPU memory account and its activity counters.

``/dev/shm`` is the whole machine's, and any local account may create names there. So each
hub keeps its regions in a folder of its own, ``/dev/shm/gpupool.<digest of its run dir>``,
owned by the hub's account and writable by it alone; the launcher creates each workload's
file there (no file is ever taken over, no link followed), mode 0600, owned by the
workload's account. The library refuses a region that another account owns or that others
may write (native/src/account.c), so no workload can lift its own cap or fail another's
allocations by writing an account it does not own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from .errors import LaunchError
from .state import RUN_DIR

SHM = Path("/dev/shm")


def run_digest(run_dir: str | Path) -> str:
    """A short digest of a hub's run folder: what keeps two hubs (or test runs) on one host
    apart in host-wide names (cgroups, regions)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:8]


def region_dir(run_dir: str | Path) -> Path:
    """The folder of the regions of the hub whose launcher runs in ``run_dir``."""
    return SHM / f"gpupool.{run_digest(run_dir)}"


def of_state(state_dir: str | Path) -> Path:
    """The folder of the regions of the hub whose state is in ``state_dir``."""
    return region_dir(Path(state_dir) / RUN_DIR)


def _is_ours(st: os.stat_result) -> bool:
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def ensure_dir(folder: Path) -> None:
    """Make ``folder`` (0711: workloads open their own file by name, list nothing). Anything
    already there under that name that is not a folder of ours, writable by us alone (a
    link, a file, another account's folder), is removed first."""
    for _ in range(3):
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            try:
                os.mkdir(folder, 0o711)
            except FileExistsError:
                continue  # made between our look and our mkdir: look again
            os.chmod(folder, 0o711)
            return
        if _is_ours(st):
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            os.unlink(folder)
    raise LaunchError(f"cannot make the GPU accounting folder {folder}: another account keeps "
                      "putting something in its place")


def create(path: Path, uid: int, gid: int) -> None:
    """A fresh, empty region file at ``path``, mode 0600, owned by ``uid``: the library sizes
    and initialises it on first use. An old file of that name (an earlier workload's) goes."""
    ensure_dir(path.parent)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def open_for_reading(path: str | Path) -> int:
    """A read-only descriptor of a region file, never through a link."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
