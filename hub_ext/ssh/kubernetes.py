"""Sessions of the SSH gateway on Kubernetes: the workspace's pod, reached through the API
server's ``pods/exec`` and ``pods/portforward`` subresources (websocket, channel protocol
``v4.channel.k8s.io``), with the hub's own ServiceAccount and nothing more than the Role the
chart gives it in the release namespace (create/get on those two subresources).

A session is the pod's own container, so it has the pod's account, limits, GPU share and
environment by construction. SFTP runs the container's ``sftp-server`` when the image has
one; a shell runs the container's ``/bin/sh`` (bash when present).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

import asyncssh
from aiohttp import WSMsgType, WSServerHandshakeError
from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from gpupool.errors import GpupoolError
from scheduler.contract import A

log = logging.getLogger("gpupool.ssh")
_WORKER = re.compile(r"(.+)-w(\d+)$")  # a training worker: JOB-wRANK
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
SHELL = "command -v bash >/dev/null && exec bash -i || exec sh -i"
SFTP = ("for s in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/sftp-server; "
        "do [ -x $s ] && exec $s; done; echo 'this image has no sftp-server' >&2; exit 127")


class Refused(GpupoolError):
    """The API server refused a request (``status``: 403 when RBAC does not allow it)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class KubernetesBackend:
    def __init__(self, namespace: str, configuration: client.Configuration | None = None,
                 headers: dict[str, str] | None = None):
        self.namespace, self.configuration, self.headers = namespace, configuration, dict(headers or {})
        self._containers: dict[str, str] = {}  # pod -> the container sessions enter

    @classmethod
    async def from_environment(cls, namespace: str, kubeconfig: str = "") -> KubernetesBackend:
        """The hub's own way to the API server: ``kubeconfig`` (Gpupool.kubeconfig or
        $KUBECONFIG, cluster.org.kubeconfig_path) when set, else the pod's service account."""
        cfg = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg,
                                          persist_config=False)
            return cls(namespace, cfg)
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=cfg, persist_config=False)
        return cls(namespace, cfg)

    def _api(self, ws: bool = False):
        api = (WsApiClient if ws else client.ApiClient)(configuration=self.configuration)
        for k, v in self.headers.items():
            api.set_default_header(k, v)
        return api

    async def workload(self, user: str, name: str) -> str | None:
        """The running pod USER may reach as NAME: their server NAME (KubeSpawner's
        annotations; '' is the default one), or a pod of a workload USER owns (the
        ``gpupool.io/owner`` annotation): a workspace by its workload name (``ws-USER``),
        an inference replica or a command workload by its name, a training worker as
        ``JOB-wRANK`` (pod ``JOB-RANK``)."""
        async with self._api() as api:
            pods = await client.CoreV1Api(api).list_namespaced_pod(self.namespace)
        worker = _WORKER.match(name)
        found: list = []
        for p in pods.items:
            ann = p.metadata.annotations or {}
            if p.status.phase != "Running" or p.metadata.deletion_timestamp:
                continue
            if (ann.get("hub.jupyter.org/username"), ann.get("hub.jupyter.org/servername", "")) == (user, name):
                found.append((2, p))
            elif name and ann.get(A.OWNER) == user and (
                    ann.get(A.WORKLOAD) == name
                    or (worker and ann.get(A.WORKLOAD) == worker[1] and p.metadata.name == f"{worker[1]}-{worker[2]}")):
                found.append((1, p))
        if not found:
            return None
        _, pod = max(found, key=lambda f: (f[0], f[1].metadata.creation_timestamp))
        self._containers[pod.metadata.name] = pod.spec.containers[0].name  # the workload's own
        return pod.metadata.name

    def _container(self, pod: str) -> dict[str, str]:
        """The container of ``pod`` to enter (a pod may carry sidecars beside it)."""
        return {"container": self._containers[pod]} if pod in self._containers else {}

    @contextlib.asynccontextmanager
    async def _exec(self, pod: str, argv: list[str], tty: bool):
        async with self._api(ws=True) as api:
            try:
                ctx = await client.CoreV1Api(api).connect_get_namespaced_pod_exec(
                    pod, self.namespace, command=argv, stdin=True, stdout=True, stderr=not tty, tty=tty,
                    _preload_content=False, **self._container(pod))
                async with ctx as ws:
                    yield ws
            except WSServerHandshakeError as e:
                raise Refused(e.status, e.message) from None

    async def session(self, process: asyncssh.SSHServerProcess, pod: str) -> int:
        if process.subsystem == "sftp":
            argv = ["/bin/sh", "-c", SFTP]
        elif process.command is not None:
            argv = ["/bin/sh", "-c", process.command]
        else:
            argv = ["/bin/sh", "-c", SHELL]
        tty = bool(process.term_type) and process.subsystem is None
        async with self._exec(pod, argv, tty) as ws:
            if tty:
                cols, rows, _, _ = process.term_size
                await ws.send_bytes(bytes([RESIZE]) + json.dumps({"Width": cols, "Height": rows}).encode())
            return await _bridge(process, ws)

    @contextlib.asynccontextmanager
    async def _portforward(self, pod: str, port: int):
        async with self._api(ws=True) as api:
            try:
                ctx = await client.CoreV1Api(api).connect_get_namespaced_pod_portforward(
                    pod, self.namespace, ports=str(port), _preload_content=False)
                async with ctx as ws:
                    yield ws
            except WSServerHandshakeError as e:
                raise Refused(e.status, e.message) from None

    def may_forward(self, pod: str, host: str, port: int) -> bool:
        """The pod's own loopback: what port-forward reaches is the pod's network namespace."""
        return host.lower() in ("localhost", "127.0.0.1", "::1") and 0 < port < 65536

    def tcp_session(self, pod: str, host: str, port: int):
        async def open_session() -> asyncssh.SSHTCPSession:
            session = _Forward()
            session.task = asyncio.ensure_future(session.run(self._portforward(pod, port)))
            return session

        return open_session()


class _Forward(asyncssh.SSHTCPSession):
    """One forwarded connection over a port-forward websocket: channel 0 carries the data,
    channel 1 errors; the first frame of each names the port (two bytes)."""

    def __init__(self):
        self.chan = None
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task: asyncio.Future | None = None

    def connection_made(self, chan):
        self.chan = chan

    def data_received(self, data, datatype):
        self.outbox.put_nowait(bytes([0]) + data)

    def connection_lost(self, exc):
        self.outbox.put_nowait(None)

    async def run(self, opening) -> None:
        try:
            async with opening as ws:
                async def send():
                    while (frame := await self.outbox.get()) is not None:
                        await ws.send_bytes(frame)
                    await ws.close()

                sender = asyncio.ensure_future(send())
                seen: set[int] = set()
                async for msg in ws:
                    if msg.type != WSMsgType.BINARY or not msg.data:
                        continue
                    channel, data = msg.data[0], msg.data[1:]
                    if channel not in seen:  # the port number
                        seen.add(channel)
                        data = data[2:]
                    if channel == 0 and data and self.chan is not None:
                        self.chan.write(data)
                    elif channel == 1 and data:
                        log.info("ssh port-forward: %s", data.decode(errors="replace"))
                        break
                sender.cancel()
        except Refused as e:
            log.info("ssh port-forward refused by the API server: %s", e)
        finally:
            if self.chan is not None:
                self.chan.close()


async def _bridge(process: asyncssh.SSHServerProcess, ws) -> int:
    async def upstream():
        while True:
            data = await process.stdin.read(65536)
            if not data:
                await ws.send_bytes(bytes([STDIN]))  # no half-close in the protocol: an empty frame
                return
            await ws.send_bytes(bytes([STDIN]) + data)

    pump = asyncio.ensure_future(upstream())
    code = 0
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            channel, data = msg.data[0], msg.data[1:]
            if channel == STDOUT:
                process.stdout.write(data)
            elif channel == STDERR:
                process.stderr.write(data)
            elif channel == ERROR and data:
                status = json.loads(data)
                if status.get("status") != "Success":
                    causes = (status.get("details") or {}).get("causes") or []
                    code = next((int(c["message"]) for c in causes if c.get("reason") == "ExitCode"), 1)
    finally:
        pump.cancel()
    return code


__all__ = ["KubernetesBackend", "Refused"]
