"""Project data sources on a real hub: admins describe a host path, an NFS export or a PVC;
bad input gets a 400 naming the field; a training that attaches a host path finds it
through ``GPUPOOL_DATA_<NAME>`` and the ``data/NAME`` symlink in its folder; an NFS source
is described, not mounted, in embedded mode; mount paths of one workload may not overlap."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from .test_credentials import call, error, run_training

pytestmark = pytest.mark.slow

READ = """
import os, pathlib
print("env", open(os.path.join(os.environ["GPUPOOL_DATA_SHARED"], "hello.txt")).read())
print("link", pathlib.Path("data/shared/hello.txt").read_text())
print("nfs", os.environ["GPUPOOL_DATA_SCRATCH"])
"""


@pytest.fixture(scope="module")
def shared(gov_hub):
    """nlp's data sources: ``shared`` (a host folder with hello.txt that every account may
    read: the workloads run as their owners' accounts), ``scratch`` (NFS)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-shared-"))
    folder.chmod(0o755)
    (folder / "hello.txt").write_text("hello from the host")
    (folder / "hello.txt").chmod(0o644)
    have = {d["name"] for d in call(gov_hub, "admin", "GET", "/projects/nlp/datasources", expect=200)["items"]}
    if "shared" not in have:
        call(gov_hub, "admin", "POST", "/projects/nlp/datasources",
             {"name": "shared", "kind": "hostpath", "path": str(folder)}, expect=201)
    if "scratch" not in have:
        call(gov_hub, "admin", "POST", "/projects/nlp/datasources",
             {"name": "scratch", "kind": "nfs", "server": "nfs.example.org", "path": "/export/scratch",
              "mount_path": "/scratch", "read_only": False}, expect=201)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_create_list_and_describe(gov_hub, shared):
    items = {d["name"]: d for d in call(gov_hub, "alice", "GET", "/projects/nlp/datasources", expect=200)["items"]}
    assert items["shared"]["path"] == str(shared) and items["shared"]["mount_path"] == "/data/shared"
    assert items["shared"]["read_only"] is True
    assert items["scratch"]["source"] == "nfs://nfs.example.org/export/scratch"
    call(gov_hub, "admin", "POST", "/projects/vision/datasources",
         {"name": "claim", "kind": "pvc", "claim": "imagenet.ro-1", "mount_path": "/data/imagenet"}, expect=201)
    assert call(gov_hub, "admin", "GET", "/projects/vision/datasources/claim", expect=200)["source"] == "pvc://imagenet.ro-1"
    call(gov_hub, "admin", "DELETE", "/projects/vision/datasources/claim", expect=204)
    error(gov_hub, "admin", "GET", "/projects/vision/datasources/claim", None, 404)
    error(gov_hub, "admin", "POST", "/projects/nlp/datasources",
          {"name": "shared", "kind": "hostpath", "path": "/tmp"}, 409, "name")


@pytest.mark.parametrize("body, field", [
    ({"name": "d", "kind": "hostpath", "path": "relative/dir"}, "path"),
    ({"name": "d", "kind": "hostpath", "path": "/data/../etc"}, "path"),
    ({"name": "d", "kind": "hostpath"}, "path"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "claim": "x"}, "claim"),
    ({"name": "d", "kind": "nfs", "path": "/export"}, "server"),
    ({"name": "d", "kind": "nfs", "server": "bad host!", "path": "/export"}, "server"),
    ({"name": "d", "kind": "nfs", "server": "nfs1", "path": "export"}, "path"),
    ({"name": "d", "kind": "pvc", "claim": "Bad_Claim"}, "claim"),
    ({"name": "d", "kind": "pvc", "claim": "-starts-with-dash"}, "claim"),
    ({"name": "d", "kind": "pvc"}, "claim"),
    ({"name": "d", "kind": "s3", "path": "/x"}, "kind"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "mount_path": "data"}, "mount_path"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "mount_path": "/etc/data"}, "mount_path"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "mount_path": "/var/run/gpupool/x"}, "mount_path"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "mount_path": "/a/../b"}, "mount_path"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "read_only": "yes"}, "read_only"),
    ({"name": "D!", "kind": "hostpath", "path": "/srv"}, "name"),
    ({"name": "d", "kind": "hostpath", "path": "/srv", "size": 5}, "size"),
])
def test_bad_input_names_the_field(gov_hub, body, field):
    msg = error(gov_hub, "admin", "POST", "/projects/nlp/datasources", body, 400, field)
    assert msg


@pytest.mark.parametrize("user, method, status", [
    ("alice", "POST", 403), ("vic", "POST", 403), ("olga", "POST", 403), ("bob", "GET", 403),
    ("oscar", "GET", 403), ("alice", "DELETE", 403),
])
def test_non_admins_are_denied(gov_hub, shared, user, method, status):
    path = "/projects/nlp/datasources" + ("/shared" if method == "DELETE" else "")
    body = {"name": "x", "kind": "hostpath", "path": "/srv"} if method == "POST" else None
    assert error(gov_hub, user, method, path, body, status)


def test_training_sees_the_data(gov_hub, shared):
    job = run_training(gov_hub, "alice", {"name": "data-train", "datasources": ["shared", "scratch"],
                                          "command": [sys.executable, "-c", READ]})
    assert job["status"] == "Succeeded", job
    lines = [ln for ln in job["lines"] if not ln.startswith("---")]
    assert lines == ["env hello from the host", "link hello from the host",
                     "nfs nfs://nfs.example.org/export/scratch"]


def test_attach_errors(gov_hub, shared):
    call(gov_hub, "admin", "POST", "/projects/nlp/datasources",
         {"name": "inner", "kind": "hostpath", "path": str(shared), "mount_path": "/data/shared/inner"},
         expect=201)
    try:
        msg = error(gov_hub, "alice", "POST", "/trainings", {
            "name": "data-x", "project": "nlp", "gpu": 0, "command": ["true"],
            "datasources": ["shared", "inner"]}, 400, "datasources")
        assert "/data/shared/inner" in msg and "conflicts with /data/shared" in msg
        msg = error(gov_hub, "alice", "POST", "/workloads", {
            "kind": "training", "project": "nlp", "gpu_mode": "none", "command": ["true"],
            "datasources": ["nope"]}, 400, "datasources")
        assert "no data source 'nope'" in msg
        # another project's data source is not visible from this one
        error(gov_hub, "bob", "POST", "/trainings", {"name": "data-y", "project": "serving", "gpu": 0,
              "command": ["true"], "datasources": ["shared"]}, 400, "datasources")
        msg = error(gov_hub, "alice", "POST", "/trainings", {
            "name": "data-z", "project": "nlp", "gpu": 0, "command": ["true"],
            "checkpoint_dir": "/data/shared", "datasources": ["shared"]}, 400, "datasources")
        assert "checkpoint_dir" in msg
    finally:
        call(gov_hub, "admin", "DELETE", "/projects/nlp/datasources/inner", expect=204)
