"""Helpers for the image tests: scripts/build-images (buildah on a local Debian base,
cached by inputs), an image's root filesystem from its docker-archive tar, and a command run
in it through chroot with the image's own environment and user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .chartlib import REPO

BUILD = REPO / "scripts" / "build-images"
NAMES = ("hub", "scheduler", "node-agent", "workspace")


@dataclass(frozen=True)
class Built:
    name: str
    image: str  # localhost/gpupool-NAME:KEY
    archive: Path
    state: str = ""  # --plan only: cached | build


def build_images(*names: str, plan: bool = False, root: Path = REPO,
                 timeout: float = 3000) -> dict[str, Built]:
    cmd = [str(root / "scripts" / "build-images"), *(["--plan"] if plan else []), *names]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]
    out = {}
    for line in p.stdout.splitlines():
        name, image, archive, *state = line.split()
        out[name] = Built(name, image, Path(archive), *state)
    return out


def archive_config(archive: Path) -> tuple[dict, dict]:
    """(manifest entry, image config) of a one-image docker-archive."""
    with tarfile.open(archive) as t:
        (entry,) = json.load(t.extractfile("manifest.json"))
        return entry, json.load(t.extractfile(entry["Config"]))


def unpack(archive: Path, dest: Path) -> dict:
    """The image's root filesystem at dest (its layers in order, whiteouts applied); returns
    the image config."""
    entry, config = archive_config(archive)
    dest.mkdir(parents=True, exist_ok=True)
    work = dest.parent / (dest.name + ".layers")
    work.mkdir()
    try:
        subprocess.run(["tar", "-xf", str(archive), "-C", str(work), *entry["Layers"]],
                       check=True, timeout=600)
        for layer in entry["Layers"]:
            subprocess.run(["tar", "-xf", str(work / layer), "-C", str(dest),
                            "--numeric-owner", "--same-permissions"], check=True, timeout=600)
            (work / layer).unlink()
            _apply_whiteouts(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return config


def _apply_whiteouts(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if not f.startswith(".wh."):
                continue
            d = Path(dirpath)
            (d / f).unlink()
            if f == ".wh..wh..opq":
                continue  # an opaque directory: this layer's entries are its whole content
            gone = d / f[len(".wh."):]
            if gone.is_dir() and not gone.is_symlink():
                shutil.rmtree(gone)
            elif gone.exists() or gone.is_symlink():
                gone.unlink()


def run_in(root: Path, config: dict, argv: list[str], user: str | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """argv in the image's root filesystem: its Env, WorkingDir and User (or user)."""
    cfg = config.get("config") or {}
    env = dict(e.split("=", 1) for e in cfg.get("Env") or [])
    u = user if user is not None else (cfg.get("User") or "0")
    uid = u.split(":")[0]
    spec = f"{uid}:{u.split(':')[1] if ':' in u else uid}"
    homes = {f[2]: f[5] for f in (line.split(":") for line in
                                  (root / "etc/passwd").read_text().splitlines()) if len(f) > 5}
    env.setdefault("HOME", homes.get(uid, "/"))  # as a container runtime sets it
    cwd = cfg.get("WorkingDir") or "/"
    return subprocess.run(["chroot", f"--userspec={spec}", str(root), "/bin/sh", "-c",
                           'cd "$0" && exec "$@"', cwd, *argv],
                          env=env, capture_output=True, text=True, timeout=timeout)
