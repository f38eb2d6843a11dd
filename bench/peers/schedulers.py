"""Starting and stopping each scheduler under test against the bench's cluster.

Every scheduler runs as processes of its own, with its own defaults except for ports and
leader election (one replica here). ``settings`` says what each was started with; it goes
into the bench's output beside the version.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workload import CEILING, GPUPOOL, KAI, NS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scheduler.kubernetes.client import ApiError, KubeClient  # noqa: E402
from scheduler.kubernetes.testcluster import ClusterInfo  # noqa: E402

BIND_CONCURRENCY = 48  # gpupool-scheduler's Bindings in flight, as in bench/k8s_throughput.py
KAI_BINDER_RECONCILES = 100  # KAI's scale-test setting (hack/setup-scale-test-env.sh)
RESERVATION_NS = "kai-resource-reservation"
GPU_INDEX = "run.ai/reserve_for_gpu_index"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kai_dir() -> Path:
    """Build (or reuse) KAI-Scheduler with scripts/build-peers; its cache folder."""
    proc = subprocess.run([str(REPO / "scripts" / "build-peers")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/build-peers failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.split()[-1])


def gpupool_version() -> str:
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    return f"gpupool {rev or 'unknown'}"


@dataclass
class Running:
    """One scheduler's processes (and, for KAI, the reservation-pod helper task)."""

    name: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    helper: asyncio.Task | None = None

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def stop(self) -> None:
        if self.helper:
            self.helper.cancel()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.to_thread(p.wait, 30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _spawn(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def settings(name: str) -> dict:
    """What each scheduler is started with, as written in the output."""
    if name == GPUPOOL:
        return {"version": gpupool_version(), "args": f"--bind-concurrency {BIND_CONCURRENCY}"}
    if name == KAI:
        return {"version": "KAI-Scheduler v0.13.0",
                "args": "scheduler, binder and podgrouper with their defaults (the default "
                        "scheduler config: allocate, consolidation, reclaim, preempt, "
                        "stalegangeviction; qps 50, burst 300); binder --fake-gpu-nodes "
                        f"--max-concurrent-reconciles={KAI_BINDER_RECONCILES} (its scale-test "
                        "setting)"}
    if name == CEILING:
        return {"version": gpupool_version(), "args": "bench/k8s_throughput.py --bare-binder: "
                f"each pod to the next free GPU, {BIND_CONCURRENCY} Bindings in flight"}
    return {"version": "kube-scheduler v1.35.4", "args": "defaults (client QPS 50)"}


async def start(name: str, info: ClusterInfo, log_dir: Path, nodes: list[str],
                gpus_per_node: int, grouper: bool = True, grouper_only: bool = False) -> Running:
    """Start ``name``. For KAI, ``grouper_only`` starts just its podgrouper (which makes a
    PodGroup for each pod) and ``grouper=False`` everything else."""
    run = Running(name)
    if name == CEILING:
        job = log_dir / "bare-binder.json"
        job.write_text(json.dumps({
            "nodes": nodes, "host": info.host, "token": info.token, "ca_file": str(info.ca_file),
            "concurrency": BIND_CONCURRENCY, "namespace": NS, "scheduler": CEILING}))
        run.procs.append(_spawn([
            sys.executable, str(REPO / "bench" / "k8s_throughput.py"), "--bare-binder", str(job),
            "--gpus-per-node", str(gpus_per_node)], log_dir / "bare-binder.log"))
    elif name == GPUPOOL:
        run.procs.append(_spawn([
            sys.executable, "-m", "scheduler.kubernetes", "--kubeconfig", str(info.kubeconfig),
            "--lease-name", "gpupool-peers", "--bind-concurrency", str(BIND_CONCURRENCY)],
            log_dir / "gpupool-scheduler.log", {**os.environ, "PYTHONPATH": str(REPO)}))
    elif name == KAI:
        bins = kai_dir() / "bin"
        # KAI's commands read $KUBECONFIG (the scheduler has no --kubeconfig flag)
        env = {**os.environ, "KUBECONFIG": str(info.kubeconfig)}
        if grouper:
            run.procs.append(_spawn([
                str(bins / "kai-podgrouper"),
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{free_port()}"],
                log_dir / "kai-podgrouper.log", env))
        if not grouper_only:
            run.procs.append(_spawn([
                str(bins / "kai-binder"), "--fake-gpu-nodes",
                f"--max-concurrent-reconciles={KAI_BINDER_RECONCILES}",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{free_port()}"],
                log_dir / "kai-binder.log", env))
            run.procs.append(_spawn([
                str(bins / "kai-scheduler"), f"--listen-address=127.0.0.1:{free_port()}",
                f"--plugin-server-port={free_port()}", f"--profiler-port={free_port()}"],
                log_dir / "kai-scheduler.log", env))
            run.helper = asyncio.create_task(reservation_helper(info))
    else:
        run.procs.append(_spawn([
            str(info.kubernetes_bin / "kube-scheduler"), f"--kubeconfig={info.kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            f"--authentication-kubeconfig={info.kubeconfig}",
            f"--authorization-kubeconfig={info.kubeconfig}", "--profiling=false"],
            log_dir / "kube-scheduler.log"))
    await asyncio.sleep(0.5)
    for p in run.procs:
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited at start ({p.args[0]}); see {log_dir}")
    return run


async def reservation_helper(info: ClusterInfo) -> None:
    """What KAI's fake-GPU mode does on a node without GPUs: give each GPU reservation pod
    (bound by KAI's binder to a node) a GPU of that node, so that the binder can finish
    binding the fractional pods that share it."""
    taken: dict[str, set[int]] = {}
    async with KubeClient(info.host, info.token, str(info.ca_file)) as kc:
        path = f"/api/v1/namespaces/{RESERVATION_NS}/pods"
        while True:
            try:
                items, rv = await kc.list_all(path)
                for pod in items:
                    await _give_gpu(kc, pod, taken)
                async for ev in kc.watch(path, rv):
                    if ev["type"] == "BOOKMARK":
                        continue
                    if ev["type"] == "DELETED":
                        idx = (ev["object"]["metadata"].get("annotations") or {}).get(GPU_INDEX)
                        node = ev["object"]["spec"].get("nodeName")
                        if idx and node:
                            taken.get(node, set()).discard(int(idx.rsplit("-", 1)[-1]))
                    else:
                        await _give_gpu(kc, ev["object"], taken)
            except ApiError:
                await asyncio.sleep(0.2)


async def _give_gpu(kc: KubeClient, pod: dict, taken: dict[str, set[int]]) -> None:
    meta = pod["metadata"]
    node = pod["spec"].get("nodeName")
    if not node or (meta.get("annotations") or {}).get(GPU_INDEX):
        return
    used = taken.setdefault(node, set())
    idx = next(i for i in range(1024) if i not in used)
    used.add(idx)
    await kc.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                   {"metadata": {"annotations": {GPU_INDEX: f"GPU-{node}-{idx}"}}})


__all__ = ["Running", "settings", "start"]
