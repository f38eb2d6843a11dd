"""The chart's programs run as local processes against the local cluster, each with a
token of the chart's own ServiceAccount (so what they manage to do, the chart's RBAC
allows): the hub from the chart's hub ConfigMap, gpupool-scheduler with the Deployment's
arguments, the activator from the chart's activator ConfigMap."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.hub.hubproc import free_ports

from .chartlib import REPO


class Proc:
    def __init__(self, name: str, cmd: list[str], workdir: Path, env: dict[str, str]):
        self.name, self.cmd, self.workdir = name, cmd, workdir
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=self.workdir, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def notable(self, n: int = 30000) -> str:
        """The log's last ``n`` characters without successful GET requests: what a failed
        test polled for would otherwise push the hub's warnings out of the tail."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(line for line in lines if not re.search(r" (200|302) GET ", line))[-n:]

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def scheduler(workdir: Path, kubeconfig: Path, args: list[str]) -> Proc:
    return Proc("gpupool-scheduler", [sys.executable, "-m", "scheduler.kubernetes", *args,
                                      "--kubeconfig", str(kubeconfig), "-v"], workdir, {})


def activator(workdir: Path, kubeconfig: Path, files: dict[str, str], namespace: str,
              hub_url: str, token: str) -> Proc:
    """The chart's activator.py; it asks the hub at ``hub_url`` (the gpupool service's URL)
    who holds a caller's token, with its service ``token``."""
    for k, v in files.items():
        (workdir / k).write_text(v)
    (port,) = free_ports(1)
    p = Proc("activator", [sys.executable, str(workdir / "activator.py"), "--services",
                           str(workdir / "services.json"), "--port", str(port), "--host", "127.0.0.1",
                           "--namespace", namespace, "--kubeconfig", str(kubeconfig),
                           "--hub-url", hub_url],
             workdir, {"GPUPOOL_ACTIVATOR_TOKEN": token})
    p.port = port
    return p


class ChartHub(Proc):
    """JupyterHub with the chart's jupyterhub_config.py, gpupool_config.py and org.yaml
    (from the installed ConfigMap), on free local ports; KubeSpawner reaches the cluster
    through ``kubeconfig``."""

    def __init__(self, workdir: Path, files: dict[str, str], kubeconfig: Path,
                 passwords: dict[str, str], deployment_env: dict[str, str] | None = None,
                 port: int | None = None):
        """``deployment_env``: the chart Deployment's own variables (its authenticator's),
        in place of the shared password's."""
        conf = workdir / "etc"
        conf.mkdir(parents=True, exist_ok=True)
        for k, v in files.items():
            (conf / k).write_text(v)
        self.port, hub_port, svc_port, api_port, serve_port = free_ports(5)
        self.port = port or self.port  # a provider's callback names it before the start
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "GPUPOOL_CONFIG": str(conf / "gpupool_config.py"),
            "GPUPOOL_ORG_FILE": str(conf / "org.yaml"),
            "GPUPOOL_STATE_DIR": str(workdir / "state"),
            "GPUPOOL_IP": "127.0.0.1", "GPUPOOL_PORT": str(self.port),
            "GPUPOOL_HUB_PORT": str(hub_port), "GPUPOOL_SERVICE_PORT": str(svc_port),
            "GPUPOOL_PROXY_API_PORT": str(api_port), "GPUPOOL_SERVE_PORT": str(serve_port),
            "GPUPOOL_HUB_CONNECT_IP": "127.0.0.1", "GPUPOOL_AUTH": "shared-password",
            "GPUPOOL_USER_PASSWORD": passwords.get("user-password", ""),
            "GPUPOOL_ADMIN_PASSWORD": passwords.get("admin-password", ""),
            "KUBECONFIG": str(kubeconfig),
            "GPUPOOL_SSH_PORT": "0",  # as the chart's Deployment sets it (hub.ssh.port, default 0)
            **(deployment_env or {}),
        }  # fmt: skip
        jh = Path(sys.executable).parent / "jupyterhub"
        super().__init__("hub", [str(jh), "-f", str(conf / "jupyterhub_config.py")], workdir, env)

    def wait_up(self, timeout: float = 180) -> ChartHub:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"hub exited:\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/hub/api/", timeout=2)
                return self
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(f"hub did not come up:\n{self.tail()}")
