"""What the hub (root) makes, reads and removes in an account's home (hub_ext/host/launch.py):
the account's own, private, and never through a link the account planted -- a symlink
``~/.gpupool -> /somewhere`` must not make root create, chown, truncate or delete there."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from hub_ext.host import launch
from hub_ext.host.process import Spec

from .conftest import needs_root

pytestmark = needs_root


@pytest.fixture
def victim():
    """A root-owned folder the account must never get the hub to touch."""
    d = Path(tempfile.mkdtemp(prefix="gpupool-victim-"))
    d.chmod(0o755)
    (d / "wl").mkdir()
    (d / "wl" / "keep").write_text("root's")
    yield d
    for p in sorted(d.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
    d.rmdir()


def plant(account, path: Path, target: Path) -> None:
    """A symlink made by the account (owned by it)."""
    path.symlink_to(target)
    os.lchown(path, account.uid, account.gid)


def test_folders_and_files_are_the_accounts_own(accounts):
    a = accounts.for_user("alice")
    d = launch.private_dir(a, "workloads", "job")
    assert d == a.home / ".gpupool" / "workloads" / "job"
    for p in (a.home / ".gpupool", d.parent, d):
        st = p.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (a.uid, a.gid, 0o700)
    folder = launch.write_private(a, ("secrets", "job", "registry"), {"token": "t0ken"})
    st = (folder / "token").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), (folder / "token").read_text()) == (a.uid, 0o400, "t0ken")
    launch.log_header(a, ("workloads", "job"), "worker-0.log", "one\n", fresh=True)
    launch.log_header(a, ("workloads", "job"), "worker-0.log", "two\n", fresh=False)
    assert (d / "worker-0.log").read_text() == "one\ntwo\n"
    launch.log_header(a, ("workloads", "job"), "worker-0.log", "new\n", fresh=True)
    assert launch.read_tail(d / "worker-0.log", a.uid, 100) == "new\n"
    launch.remove_private(a, "secrets", "job")
    assert not (a.home / ".gpupool" / "secrets" / "job").exists()


def test_a_planted_symlink_sends_nothing_elsewhere(accounts, victim):
    a = accounts.for_user("alice")
    plant(a, a.home / ".gpupool", victim)
    with pytest.raises(OSError):
        launch.private_dir(a, "wl")
    with pytest.raises(OSError):
        launch.write_private(a, ("wl",), {"x": "y"})
    with pytest.raises(OSError):
        launch.log_header(a, ("wl",), "keep", "overwritten\n", fresh=True)
    with pytest.raises(OSError):
        launch.remove_private(a, "wl")
    assert sorted(p.name for p in victim.rglob("*")) == ["keep", "wl"]
    assert (victim / "wl" / "keep").read_text() == "root's"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755 and victim.stat().st_uid == 0


def test_a_planted_symlink_deeper_down_is_refused_too(accounts, victim):
    a = accounts.for_user("alice")
    launch.private_dir(a, "workloads")
    plant(a, a.home / ".gpupool" / "secrets", victim)
    with pytest.raises(OSError):
        launch.remove_private(a, "secrets", "wl")
    assert (victim / "wl" / "keep").read_text() == "root's"
    # a data link: the folder it goes in may not be a link either; the account's own file stays
    job = launch.private_dir(a, "workloads", "job")
    plant(a, job / "data", victim)
    with pytest.raises(OSError):
        launch.link_in_home(a, job / "data", "wl", "/srv/shared")
    (job / "data").unlink()
    (job / "data").mkdir()
    (job / "data" / "mine").write_text("the account's")
    assert launch.link_in_home(a, job / "data", "mine", "/srv/shared") is False
    assert launch.link_in_home(a, job / "data", "shared", "/srv/shared") is True
    assert os.readlink(job / "data" / "shared") == "/srv/shared"
    assert os.lstat(job / "data" / "shared").st_uid == a.uid


def test_the_log_reader_reads_only_the_accounts_own_plain_file(accounts, victim):
    a, b = accounts.for_user("alice"), accounts.for_user("bob")
    d = launch.private_dir(a, "workloads", "job")
    plant(a, d / "worker-0.log", victim / "wl" / "keep")
    assert launch.read_tail(d / "worker-0.log", a.uid, 100) == ""  # not through a link
    other = launch.private_dir(b, "workloads", "job")
    launch.log_header(b, ("workloads", "job"), "worker-0.log", "bob's\n", fresh=True)
    assert launch.read_tail(other / "worker-0.log", a.uid, 100) == ""  # another account's
    assert launch.read_tail(other / "worker-0.log", b.uid, 100) == "bob's\n"
    os.mkfifo(d / "fifo.log")
    os.chown(d / "fifo.log", a.uid, a.gid)
    assert launch.read_tail(d / "fifo.log", a.uid, 100) == ""  # never waits on a FIFO
    with pytest.raises(OSError):
        launch.log_header(a, ("workloads", "job"), "fifo.log", "x\n", fresh=True)


def test_a_start_cancelled_halfway_leaves_nothing_running(launcher, alice):
    spec = Spec(name="halfway", argv=[sys.executable, "-c", "import time; time.sleep(600)"],
                env=launch.account_env(alice), cwd=None, account=alice)

    async def run():
        task = asyncio.ensure_future(launch.start(launcher, spec))
        while not (launcher.run_dir / "halfway").exists():  # the monitor is being started
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(600):  # the start goes on, and what it started is ended and forgotten
            if not launcher.names():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"left running: {launcher.names()}")

    asyncio.run(run())
