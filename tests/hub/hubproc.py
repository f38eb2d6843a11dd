"""Start a gpupool hub (``gpupool up``) in a temporary folder on free ports, for tests
and benches; stop it (and everything it started) afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hub_ext.host import regions
from hub_ext.ports import free_ports  # noqa: F401 (the tests' ports come from here)

ROOT = Path(__file__).resolve().parents[2]
USER_PW = "gpupool-user"
ADMIN_PW = "gpupool-admin-password-change-me"
# a hub with two node pools: default (2 x H100 on node a) and fast (2 x B200 on node b)
TWO_POOLS_CONFIG = """c = get_config()  # noqa
c.Gpupool.use_nvml = False
c.Gpupool.declared_gpus = [
    {"node": "a", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 2},
    {"node": "b", "model": "NVIDIA B200", "memory_mib": 183359, "count": 2, "pool": "fast"},
]
"""
# The prefix of the OS accounts test hubs make: one of this test run's own (tests/conftest.py
# draws it), never the product's "gpupool-", so that a run never touches the accounts of a
# gpupool that serves users on the same machine, nor those of another run.
ACCOUNT_PREFIX = os.environ.get("GPUPOOL_TEST_ACCOUNT_PREFIX") or f"gpt{os.getpid() % 10**6:06d}-"


def account(user: str) -> str:
    """The OS account a test hub makes for hub user ``user``."""
    return ACCOUNT_PREFIX + user


class Hub:
    def __init__(self, workdir: Path, config: str = "", extra_env: dict | None = None,
                 user: str | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, hub_port, svc_port, api_port = free_ports(4)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "GPUPOOL_ACCOUNT_PREFIX": ACCOUNT_PREFIX,
                    "GPUPOOL_STATE_DIR": str(self.workdir / "state"),
                    "GPUPOOL_PORT": str(self.port), "GPUPOOL_HUB_PORT": str(hub_port),
                    "GPUPOOL_SERVICE_PORT": str(svc_port), "GPUPOOL_PROXY_API_PORT": str(api_port),
                    **(extra_env or {})}
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "hub.log"
        self.accounts_before: set[str] = set()
        self.user = user  # an OS account to run the hub as (personal mode); default: ours

    def start(self, timeout: float = 120) -> Hub:
        cfg = self.workdir / "gpupool_config.py"
        cfg.write_text(self.config or "c = get_config()  # noqa\n")
        gp = Path(sys.executable).parent / "gpupool"
        self.accounts_before = self.accounts_before or _accounts()
        self.proc = subprocess.Popen(
            [str(gp), "up", "--config", str(cfg)], cwd=self.workdir, env=self.env,
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
            **({"user": self.user, "group": self.user, "extra_groups": []} if self.user else {}),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                for pid in _running_in(self.workdir):  # the proxy it started outlives it
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGTERM)
                raise RuntimeError(f"hub exited: {self.log.read_text()[-3000:]}")
            try:  # the hub and its service, through the proxy (after a kill the old proxy may
                # still answer for a moment, for a hub that is gone)
                urllib.request.urlopen(self.url + "/hub/api", timeout=2)
                urllib.request.urlopen(self.url + "/services/gpupool/api/v1/openapi.json", timeout=2)
                return self
            except Exception:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"hub did not come up: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the hub alone (its workloads run on, as after a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the hub and everything it started, and remove the OS accounts it made."""
        try:
            self._stop_hub()
        finally:
            _end_workloads(self.workdir / "state" / "run")
            shutil.rmtree(regions.of_state(self.workdir / "state"), ignore_errors=True)
            prefix = self.env["GPUPOOL_ACCOUNT_PREFIX"]
            for name in _accounts() - self.accounts_before:
                if name.startswith(prefix):
                    remove_account(name)

    def _stop_hub(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        # servers and services started by the hub run in their own sessions: end ours
        for pidfile in (self.workdir / "state").glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        for pid in _running_in(self.workdir):  # a user server the hub did not stop in time
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass


def _accounts() -> set[str]:
    return {line.split(":", 1)[0] for line in Path("/etc/passwd").read_text().splitlines() if line}


def remove_account(name: str) -> None:
    """Remove a test account, its processes and its home (a later account of the same name
    must not find the old one's files)."""
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
        if subprocess.run(["pgrep", "-u", name], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)
    shutil.rmtree(entry.pw_dir, ignore_errors=True)


def _end_workloads(run_dir: Path) -> None:
    """Workloads outlive a stopped hub by design: end each one (its monitor then exits)."""
    for pidfile in run_dir.glob("*/child.pid"):
        try:
            pid = int(json.loads(pidfile.read_text())["pid"])
            os.killpg(pid, signal.SIGKILL)
        except (ValueError, KeyError, TypeError, OSError):
            pass


def _running_in(folder: Path) -> list[int]:
    """Processes whose working directory is inside ``folder`` (user servers start in the
    user's home under the hub's state folder; the test's folder is its own)."""
    out = []
    root = str(folder.resolve())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == root or cwd.startswith(root + os.sep):
                out.append(int(entry.name))
    return out
