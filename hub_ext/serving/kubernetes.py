"""Replicas as pods placed by gpupool-scheduler (``schedulerName: gpupool``).

``replica_pod`` is a plain function (tested by comparing dicts): kind ``inference`` and
the project in annotations, the GPU ask as the workload contract writes it
(``scheduler.contract.gpu_parts``: a share with the scheduler's ConfigMap and the
interception library mounted, whole GPUs as ``nvidia.com/gpu``), a readiness probe on ``ready_path``. The backend
follows the replica pods by one list and watch (``cluster.mirror.Mirror``, listed again on a
410) and looks at a replica's pod at each change of one: ``PodScheduled=False`` gives the
replica its pending reason (the core's), a binding makes it starting, ``Ready`` makes it
routable at ``podIP:port``. Stop = delete.

Replica pods outlive the activator: ``release`` stops following one and leaves its pod
running, and at the next start ``adopt_all`` follows again every replica pod of a service
it serves whose pod still runs that service's spec; the others are deleted. ``owner``: the
pods' owner reference (the chart's activator ConfigMap), so that they go with the release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from hub_ext.attachments.attach import Attachments, pod_parts, secret_manifest, secret_name
from hub_ext.images import WORKLOAD_IMAGE, WORKLOAD_POD_SPEC
from inference.service import Replica, RState, Service
from scheduler import contract
from scheduler.kubernetes.client import ApiError, KubeClient

from ..cluster.mirror import Mirror
from .spec import ServiceSpec

log = logging.getLogger("gpupool.inference")
LABEL = contract.L.INFERENCE


def replica_pod(spec: ServiceSpec, name: str, namespace: str,
                attachments: Attachments | None = None, preload: contract.Preload = contract.PRELOAD,
                default_image: str = WORKLOAD_IMAGE, owner: dict | None = None) -> dict:
    """``attachments``: the service's credentials (by reference to the Secret
    ``SERVICE-credentials``, ``credentials_secret``) and data sources; ``default_image``: the
    image when the spec names none."""
    container: dict = {
        "name": "server", "image": spec.image or default_image,
        "command": list(spec.command),
        "env": [{"name": "PORT", "value": str(spec.port)},
                *({"name": k, "value": v} for k, v in sorted(spec.env.items()))],
        "ports": [{"name": "http", "containerPort": spec.port}],
        "readinessProbe": {"httpGet": {"path": spec.ready_path, "port": spec.port},
                           "periodSeconds": 1},
    }
    ann = contract.request_annotations(spec.project, "inference")
    gpu = contract.gpu_parts(name, spec.gpu, preload=preload)
    ann.update(gpu.annotations)
    ann.update(contract.workload_annotations(name, spec.owner))
    container["env"] += [{"name": k, "value": v} for k, v in gpu.env.items()]
    if gpu.limits:
        container["resources"] = {"limits": dict(gpu.limits)}
    if gpu.shared:
        container["envFrom"] = gpu.env_from
    pod_spec: dict = {**WORKLOAD_POD_SPEC, "schedulerName": contract.SCHEDULER_NAME,
                      "containers": [container],
                      "restartPolicy": "Always", "terminationGracePeriodSeconds": 30}
    mounts, volumes = list(gpu.mounts), list(gpu.volumes)
    if attachments:
        parts = pod_parts(attachments, secret_name(spec.name))
        container["env"] += parts.env
        mounts += parts.mounts
        volumes += parts.volumes
    if mounts:
        container["volumeMounts"], pod_spec["volumes"] = mounts, volumes
    meta: dict = {"name": name, "namespace": namespace, "annotations": ann,
                  "labels": {LABEL: spec.name, contract.L.MANAGED_BY: "gpupool"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def runs_spec(pod: dict, spec: ServiceSpec, default_image: str = WORKLOAD_IMAGE) -> bool:
    """Whether a replica pod runs ``spec``'s image, command and GPU (an older spec's pod is
    replaced, not adopted)."""
    c, ann = pod["spec"]["containers"][0], pod["metadata"].get("annotations", {})
    want = replica_pod(spec, pod["metadata"]["name"], "", default_image=default_image)
    w = want["spec"]["containers"][0]
    return (all((c.get(k) or None) == (w.get(k) or None) for k in ("image", "command", "resources"))
            and all(ann.get(k) == v for k, v in want["metadata"]["annotations"].items()))


def credentials_secret(spec: ServiceSpec, namespace: str, values: dict[str, dict[str, str]]) -> dict:
    """The Secret every replica of ``spec`` references (hub_ext.attach.values)."""
    return secret_manifest(secret_name(spec.name), namespace, values, {LABEL: spec.name})


class KubernetesBackend:
    def __init__(self, kc: KubeClient, namespace: str, poll_s: float = 0.5, attachments=None,
                 default_image: str = WORKLOAD_IMAGE, owner: dict | None = None):
        # poll_s: the longest a replica waits without a change of any replica pod before it
        # looks again at the watch's copy (no request: the copy is the watch's)
        self.kc, self.namespace, self.poll_s = kc, namespace, poll_s
        self.default_image, self.owner = default_image, owner
        # attachments(spec) -> (Attachments, values): resolves a service's credentials and
        # data sources (hub_ext.attach.check + values); None: services attach nothing
        self.attachments = attachments
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.pods = Mirror(kc, None, {"pods": self.path}, selectors={"pods": LABEL})

    def start(self, service: Service, replica: Replica) -> None:
        self.pods.start()
        replica.handle = asyncio.ensure_future(self._run(service, replica))

    async def stop(self, service: Service, replica: Replica) -> None:
        if replica.handle is not None:
            replica.handle.cancel()
        with contextlib.suppress(ApiError):
            await self.kc.delete(f"{self.path}/{replica.name}")

    def release(self, service: Service, replica: Replica) -> None:
        """Stop following the replica; its pod keeps running for the next activator."""
        if replica.handle is not None:
            replica.handle.cancel()

    def adopt(self, svc: Service, r: Replica, pod: dict) -> bool:
        """Follow ``pod``, a replica an earlier activator started: False when it has ended,
        is going, or runs another spec than ``svc``'s."""
        phase = pod.get("status", {}).get("phase")
        if (pod["metadata"].get("deletionTimestamp") or phase in ("Failed", "Succeeded")
                or not runs_spec(pod, svc.spec, self.default_image)):
            return False
        self.pods.start()
        r.reason = "adopted after an activator restart"
        r.handle = asyncio.ensure_future(self._follow(svc, r, pod["metadata"]["uid"]))
        return True

    async def adopt_all(self, controller) -> tuple[int, int]:
        """At the start, before the controller's first reconcile (``Controller(held=True)``):
        the replica pods of the services ``controller`` has are adopted; the others (of a
        service gone meanwhile, ended, or of an older spec) are deleted. (adopted, found)."""
        pods = (await self.kc.get(self.path, labelSelector=LABEL))["items"]
        drop = []
        kept = 0
        for pod in pods:  # no await in between: the services' first reconcile counts them all
            name, service = pod["metadata"]["name"], pod["metadata"]["labels"].get(LABEL, "")
            svc = controller.services.get(service)
            if svc is not None and controller.adopt(svc.spec, name, pod,
                                                    svc.autoscaler.policy.idle_limit):
                kept += 1
            elif not pod["metadata"].get("deletionTimestamp"):
                drop.append(name)
        for name in drop:
            await self._delete(name)
        return kept, len(pods)

    async def close(self) -> None:
        """Stop following the pods (the controller has stopped every replica)."""
        await self.pods.stop()

    async def _run(self, svc: Service, r: Replica) -> None:
        try:
            att = None
            if self.attachments is not None and (svc.spec.credentials or svc.spec.datasources):
                att, values = self.attachments(svc.spec)
                if values:
                    await self.kc.apply(f"/api/v1/namespaces/{self.namespace}/secrets",
                                        credentials_secret(svc.spec, self.namespace, values))
            made = await self.kc.post(self.path, replica_pod(svc.spec, r.name, self.namespace, att,
                                                             default_image=self.default_image,
                                                             owner=self.owner))
        except (ApiError, ValueError) as e:
            svc.replica_gone(r, RState.FAILED, f"pod not created: {e}")
            svc.on_activate(svc)
            return
        await self._follow(svc, r, made["metadata"]["uid"])

    async def _follow(self, svc: Service, r: Replica, uid: str) -> None:
        seen_it = False
        while True:
            version = self.pods.version
            pod = self.pods.objects["pods"].get(f"{self.namespace}/{r.name}")
            if pod is not None and pod["metadata"].get("uid") == uid:
                seen_it = True
                if self._observe(svc, r, pod):
                    return
            elif seen_it and self.pods.ready:  # in the copy once, gone from it since
                svc.replica_gone(r, RState.FAILED, "pod deleted")
                svc.on_activate(svc)
                return
            await self.pods.wait_past(version, self.poll_s)

    def _observe(self, svc: Service, r: Replica, pod: dict) -> bool:
        """Move the replica on from its pod; True when it ended."""
        ann = pod["metadata"].get("annotations", {})
        if not pod["spec"].get("nodeName"):
            r.reason = contract.waiting_reason(pod) or r.reason
            return False
        if r.state == RState.PENDING:
            r.state, r.reason = RState.STARTING, "model server starting"
            r.where = (f"{pod['spec']['nodeName']} GPU {ann.get('gpupool.io/gpu-indices', '?')}"
                       f" ({int(ann.get('gpupool.io/gpu-milli', '0')) / 1000:g} each)")
        phase = pod.get("status", {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            svc.replica_gone(r, RState.FAILED, f"pod {phase.lower()}")
            svc.on_activate(svc)
            asyncio.ensure_future(self._delete(r.name))
            return True
        ready = contract.pod_condition(pod, "Ready")
        ip = pod.get("status", {}).get("podIP")
        if r.state == RState.STARTING and ready and ready.get("status") == "True" and ip:
            svc.replica_ready(r, ip, svc.spec.port)
        return False

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            await self.kc.delete(f"{self.path}/{name}")


__all__ = ["KubernetesBackend", "credentials_secret", "replica_pod", "runs_spec"]
