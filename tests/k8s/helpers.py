"""Builders and waits for the tests against the local cluster (no mocks: real objects)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.kubernetes.testcluster import REPO, ClusterInfo, client_for

GROUP = "/apis/gpupool.io/v1alpha1"
WAIT_S = 300  # generous: a slow shared machine must not fail a correct scheduler


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------- builders
@dataclass
class PodBuilder:
    """``make_pod("a").ns("t1").project("nlp").fraction(0.5).obj()``"""

    _name: str
    _ns: str = "default"
    _ann: dict[str, str] = field(default_factory=dict)
    _gpus: int = 0
    _grace: int | None = None
    _scheduler: str = "gpupool"
    _env_from: list[dict] = field(default_factory=list)

    def ns(self, ns: str) -> PodBuilder:
        self._ns = ns
        return self

    def project(self, p: str) -> PodBuilder:
        self._ann["gpupool.io/project"] = p
        return self

    def gpus(self, n: int) -> PodBuilder:
        self._gpus = n
        return self

    def fraction(self, f: float | str) -> PodBuilder:
        self._ann["gpupool.io/gpu-fraction"] = str(f)
        self._env_from = [{"configMapRef": {"name": f"{self._name}-gpupool"}}]
        return self

    def kind(self, k: str) -> PodBuilder:
        self._ann["gpupool.io/kind"] = k
        return self

    def gang(self, name: str, size: int) -> PodBuilder:
        self._ann["gpupool.io/gang"] = name
        self._ann["gpupool.io/gang-size"] = str(size)
        return self

    def grace(self, s: int) -> PodBuilder:
        self._grace = s
        return self

    def pool(self, p: str) -> PodBuilder:
        self._ann["gpupool.io/node-pool"] = p
        return self

    def annotate(self, k: str, v: str) -> PodBuilder:
        self._ann[k] = v
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self._scheduler = name
        return self

    def obj(self) -> dict[str, Any]:
        c: dict[str, Any] = {"name": "main", "image": "busybox",
                             "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}
        if self._gpus:
            c["resources"]["limits"] = {"nvidia.com/gpu": str(self._gpus)}
        if self._env_from:
            c["envFrom"] = self._env_from
        spec: dict[str, Any] = {"schedulerName": self._scheduler, "containers": [c]}
        if self._grace is not None:
            spec["terminationGracePeriodSeconds"] = self._grace
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self._name, "namespace": self._ns,
                             "annotations": dict(self._ann)},
                "spec": spec}


def count_reads(kc: KubeClient, wanted) -> list[str]:
    """Every GET made through ``kc`` of a path for which ``wanted(path)`` holds, as they
    happen: what a follower asks the API server."""
    reads: list[str] = []
    real = kc.get

    async def get(path: str, **params):
        if wanted(path):
            reads.append(path)
        return await real(path, **params)
    kc.get = get  # type: ignore[method-assign]
    return reads


def make_pod(name: str) -> PodBuilder:
    return PodBuilder(name)


async def create_org(kc: KubeClient, dept: str, dept_gpus: float, projects: dict[str, dict],
                     pool: str = "default") -> None:
    """A Department and its Projects; ``projects`` maps name -> quota dict."""
    await kc.post(f"{GROUP}/departments", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "Department", "metadata": {"name": dept},
        "spec": {"quotas": {pool: {"gpus": dept_gpus}}},
    })  # fmt: skip
    for name, quota in projects.items():
        await kc.post(f"{GROUP}/projects", {
            "apiVersion": "gpupool.io/v1alpha1", "kind": "Project", "metadata": {"name": name},
            "spec": {"department": dept, "quotas": {pool: quota}},
        })  # fmt: skip


async def delete_org(kc: KubeClient, dept: str, projects) -> None:
    for name in projects:
        try:
            await kc.delete(f"{GROUP}/projects/{name}")
        except ApiError:
            pass
    try:
        await kc.delete(f"{GROUP}/departments/{dept}")
    except ApiError:
        pass


async def create_namespace(kc: KubeClient, ns: str) -> None:
    try:
        await kc.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    except ApiError as e:
        if e.status != 409:
            raise


async def default_service_account(kc: KubeClient, ns: str) -> None:
    """Wait for ``ns``'s default service account: kube-controller-manager makes it just
    after the namespace, and pods need it."""
    async def made():
        try:
            return await kc.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
        except ApiError as e:
            if e.status != 404:
                raise
            return None

    await wait_until(made, f"the default service account of {ns}", timeout=60)


async def delete_pods(kc: KubeClient, ns: str) -> None:
    """Delete every pod of the namespace now and wait until they are gone."""
    await kc.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    await wait_until(lambda: _no_pods(kc, ns), "pods deleted")


async def _no_pods(kc: KubeClient, ns: str) -> bool:
    return not (await kc.get(f"/api/v1/namespaces/{ns}/pods", limit=1))["items"]


async def list_pods(kc: KubeClient, ns: str) -> list[dict]:
    items, _ = await kc.list_all(f"/api/v1/namespaces/{ns}/pods")
    return items


def bound(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["spec"].get("nodeName")]


def scheduled_false(pod: dict) -> dict | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return c
    return None


async def events_for(kc: KubeClient, ns: str, name: str) -> list[dict]:
    doc = await kc.get(f"/api/v1/namespaces/{ns}/events",
                       fieldSelector=f"involvedObject.name={name}")
    return doc["items"]


async def wait_until(pred, what: str, timeout: float = WAIT_S, interval: float = 0.25):
    """Poll ``await pred()`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = await pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------- the scheduler
@dataclass
class SchedulerProcess:
    """``gpupool-scheduler`` as a real process (so tests can kill it)."""

    info: ClusterInfo
    log_dir: Path
    lease_name: str = "gpupool-scheduler"
    proc: subprocess.Popen | None = None
    starts: int = 0
    args: tuple[str, ...] = ()  # more command-line options

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"gpupool-scheduler-{self.starts}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "scheduler.kubernetes", "--kubeconfig", str(self.info.kubeconfig),
               "--lease-name", self.lease_name, "--lease-duration", "3", "--lease-renew", "0.5",
               "-v", *self.args]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        log.close()

    def kill(self) -> None:
        """SIGKILL: no clean-up, the Lease stays taken until it expires."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.log_dir.glob("gpupool-scheduler-*.log")))


def kube(info: ClusterInfo, **kw) -> KubeClient:
    return client_for(info, **kw)
