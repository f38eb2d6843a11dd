"""The interception library's account files on the host (hub_ext/host/regions.py): a hub's
own folder that no other account can fill beforehand, and files owned by each workload's
account, created afresh and never through a link."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from hub_ext.host import regions
from hub_ext.host.errors import SpecError
from hub_ext.host.process import Launcher, Spec

from .conftest import needs_root, run

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_each_hub_has_its_own_folder_under_dev_shm(tmp_path):
    a, b = regions.of_state(tmp_path / "a"), regions.of_state(tmp_path / "b")
    assert a != b and a.parent == b.parent == Path("/dev/shm")
    assert regions.of_state(tmp_path / "a") == Launcher(tmp_path / "a" / "run").regions == a


@needs_root
@pytest.mark.parametrize("squatter", ["folder", "open folder", "link", "file"])
def test_what_another_account_put_in_place_of_the_folder_is_replaced(tmp_path, squatter):
    folder, target = tmp_path / "gpupool.x", tmp_path / "target"
    target.mkdir()
    if squatter == "link":
        folder.symlink_to(target)
    elif squatter == "file":
        folder.write_text("")
    else:
        folder.mkdir()
        (folder / "ws-bob").write_text("planted")
        os.chown(folder, NOBODY, NOBODY)
        if squatter == "open folder":
            os.chown(folder, 0, 0)
            folder.chmod(0o777)
    regions.ensure_dir(folder)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and _mode(folder) == 0o711
    assert list(folder.iterdir()) == [] and target.is_dir()


@needs_root
def test_a_region_is_created_afresh_owned_by_its_account(tmp_path):
    path = tmp_path / "gpupool.x" / "ws-bob"
    regions.ensure_dir(path.parent)
    path.write_bytes(b"old counters")
    path.chmod(0o666)
    regions.create(path, NOBODY, NOBODY)
    st = os.lstat(path)
    assert (st.st_uid, st.st_gid, _mode(path), st.st_size) == (NOBODY, NOBODY, 0o600, 0)


def test_a_link_in_place_of_a_region_is_removed_not_followed(tmp_path):
    path, target = tmp_path / "gpupool.x" / "ws-bob", tmp_path / "target"
    target.write_text("someone's file")
    regions.ensure_dir(path.parent)
    path.symlink_to(target)
    regions.create(path, os.geteuid(), os.getegid())
    assert not path.is_symlink() and path.stat().st_size == 0
    assert target.read_text() == "someone's file"


@needs_root
def test_launcher_takes_no_region_outside_its_folder(tmp_path, alice):
    launcher = Launcher(tmp_path / "run")
    assert launcher.region("ws-a") == str(launcher.regions / "ws-a")
    spec = Spec("ws-a", ["true"], {"GPUPOOL_SHARED_REGION": "/dev/shm/gpupool-ws-a"}, None, alice)
    with pytest.raises(SpecError, match="not a region of this launcher"):
        run(launcher.start(spec))


@needs_root
def test_a_workload_gets_its_region_as_it_starts_and_forget_removes_it(launcher, alice):
    region = Path(launcher.region("w-region"))
    script = 'printf counters > "$GPUPOOL_SHARED_REGION"'
    h = run(launcher.start(Spec("w-region", ["sh", "-c", script],
                                {"PATH": "/usr/bin:/bin", "GPUPOOL_SHARED_REGION": str(region)},
                                None, alice)))
    try:
        assert run(h.wait()).code == 0
        st = os.lstat(region)
        assert (st.st_uid, st.st_gid, _mode(region)) == (alice.uid, alice.gid, 0o600)
        assert region.read_bytes() == b"counters"  # the workload's account wrote it
        assert _mode(region.parent) == 0o711
        launcher.forget("w-region")
        assert not region.exists()
    finally:
        shutil.rmtree(launcher.regions, ignore_errors=True)
