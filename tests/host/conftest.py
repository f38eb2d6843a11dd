"""Fixtures of the host package's tests: real Unix accounts (useradd/userdel), real cgroups
and real processes, so these tests run as root (as CI does); as another user they are
skipped. Every account, workload and cgroup a test makes is removed by its fixture."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hub_ext.host.accounts import AccountError, Accounts
from hub_ext.host.cgroups import detect
from hub_ext.host.process import Launcher

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="makes Unix accounts and cgroups: run as root")


@pytest.fixture(scope="session")
def home_root():
    """Homes of the test accounts: a 0755 directory (the accounts must reach their homes,
    which pytest's 0700 tmp_path would not let them)."""
    d = Path(tempfile.mkdtemp(prefix="gpupool-test-homes-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def accounts(home_root):
    """``create`` mode with a prefix of this test run's own, so that runs side by side never
    share an account; every account made is deleted afterwards."""
    made = Accounts(mode="create", prefix=f"t{os.getpid() % 100000}-", home_root=home_root)
    users: list[str] = []
    original = made.for_user

    def for_user(hub_user: str):
        users.append(hub_user)
        return original(hub_user)

    made.for_user = for_user  # type: ignore[method-assign]
    yield made
    failed = []
    for user in dict.fromkeys(users):
        try:
            made.remove(user)
        except AccountError as e:  # remove the others all the same, then say which failed
            failed.append(str(e))
    assert not failed, failed


@pytest.fixture
def alice(accounts):
    return accounts.for_user("alice")


@pytest.fixture(scope="session")
def cgroups():
    return detect()


@pytest.fixture
def launcher(tmp_path, cgroups, accounts):
    """A Launcher over a fresh run directory; afterwards every workload still running is
    terminated, its cgroup must be gone, and the run directory is emptied (before the
    accounts are deleted: ``accounts`` is set up first, so torn down last)."""
    launcher = Launcher(tmp_path / "run", cgroups)
    yield launcher
    for name in launcher.names():
        handle = launcher.adopt(name)
        if handle is not None:
            if handle.exit() is None:
                asyncio.run(handle.terminate(grace_s=0.5))
            assert not handle.group.exists(), f"cgroup of {name} left behind"
        launcher.forget(name)


def run(coro):
    return asyncio.run(coro)
