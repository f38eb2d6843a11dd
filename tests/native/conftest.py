"""Builds native/ (library, fakes) and the C probes; runs probes with or without the preload.

Every test drives a C program (c/probe.c) against the fake driver in native/fake/, so no
GPU is needed. Build outputs go to native/build/ (world-readable: one test runs as nobody).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
BUILD = NATIVE / "build"
C_DIR = Path(__file__).resolve().parent / "c"
CUDA_INC = BUILD / "deps" / "nvidia" / "cuda_runtime" / "include"
NVML_INC = BUILD / "deps" / "nvidia" / "nvml_dev" / "include"
LIBCUDART = BUILD / "deps" / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
CUDA_OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


def _nice(cmd: list[str]) -> list[str]:
    return ["nice", *cmd] if shutil.which("nice") else cmd


@dataclass
class Native:
    lib: Path
    test_lib: Path
    fake_dir: Path
    bin_dir: Path

    def probe(self, via: str) -> Path:
        return self.bin_dir / ("probe_linked" if via == "link" else "probe")


@dataclass
class Run:
    rc: int
    lines: list[str]
    stderr: str
    by_cmd: dict[str, list[str]] = field(default_factory=dict)

    def rcs(self, cmd: str) -> list[int]:
        """Return codes of every line of one command, in order ("alloc" -> [0, 2])."""
        return [int(re.search(r"rc=(-?\d+)", ln).group(1)) for ln in self.by_cmd.get(cmd, [])]

    def values(self, cmd: str, key: str) -> list[int]:
        return [int(re.search(rf"\b{key}=(\d+)", ln).group(1)) for ln in self.by_cmd.get(cmd, [])]


def parse(stdout: str, stderr: str, rc: int) -> Run:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    run = Run(rc, lines, stderr)
    for ln in lines:
        run.by_cmd.setdefault(ln.split()[0], []).append(ln)
    return run


@pytest.fixture(scope="session")
def native() -> Native:
    subprocess.run(_nice(["make", "-s", "-C", str(NATIVE)]), check=True)
    bin_dir = BUILD / "tests"
    bin_dir.mkdir(parents=True, exist_ok=True)
    inc = [f"-I{CUDA_INC}", f"-I{NVML_INC}"]
    fake = BUILD / "fake"
    for out, extra in (("probe", []), ("probe_linked", ["-DPROBE_LINKED"])):
        cmd = ["cc", "-O1", "-std=gnu11", "-Wall", *extra, *inc, "-o", str(bin_dir / out),
               str(C_DIR / "probe.c")]
        if extra:
            cmd += [f"-L{fake}", "-lcuda"]
        subprocess.run(_nice([*cmd, "-ldl", "-lpthread"]), check=True)
    for src in ("cudart_probe", "call_all"):
        subprocess.run(_nice(["cc", "-O1", "-std=gnu11", "-Wall", *inc, "-o", str(bin_dir / src),
                              str(C_DIR / f"{src}.c"), "-ldl"]), check=True)
    # an "installed" driver that lacks every function: hooks must answer, not crash
    empty = bin_dir / "empty"
    empty.mkdir(exist_ok=True)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        subprocess.run(_nice(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o",
                              str(empty / soname), str(C_DIR / "empty.c")]), check=True)
    return Native(BUILD / "libgpupool-cuda.so", BUILD / "test" / "libgpupool-cuda.so", fake, bin_dir)


@pytest.fixture
def region_dir():
    """A world-writable folder for the shared account (the nobody test needs to reach it)."""
    d = tempfile.mkdtemp(prefix="gpupool-test-")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def base_env(native: Native, region_dir: Path | None, *, preload: bool = True,
             lib: Path | None = None, **gp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUPOOL_", "FAKE_", "CUDA_VISIBLE"))}
    env.pop("LD_PRELOAD", None)
    env["LD_LIBRARY_PATH"] = str(native.fake_dir)
    if preload:
        env["LD_PRELOAD"] = str(lib or native.lib)
    if region_dir is not None:
        env["GPUPOOL_SHARED_REGION"] = str(region_dir / "account")
    env.update(gp)
    return env


def run_probe(native: Native, env: dict[str, str], via: str, *cmds: str,
              timeout: float = 60, user: str | None = None) -> Run:
    argv = [str(native.probe(via)), via, *cmds]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return parse(p.stdout, p.stderr, p.returncode)


def start_probe(native: Native, env: dict[str, str], via: str, *cmds: str) -> subprocess.Popen:
    return subprocess.Popen([str(native.probe(via)), via, *cmds], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 30) -> None:
    import time

    end = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"probe exited early: {proc.communicate()}")
        if time.monotonic() > end:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.01)
