"""Inference services on Kubernetes: the hub publishes them, the chart's activator serves them.

One ConfigMap per service in the release namespace, ``gpupool-inference-NAME``, labelled
``gpupool.io/inference-spec: NAME``: ``data["spec.json"]`` is the service's spec
(``ServiceSpec.to_dict()``) and ``data["idle_limit.json"]`` its project's policy's idle
limit (``{seconds, policy}`` or null), written only by the hub from its rows and policies;
the annotation ``gpupool.io/inference-status`` is the service's state (``Service.status()``),
written only by the activator, which owns the replicas: it starts, scales (to zero and back)
and deletes them. The hub copies the state back into its rows for describe, the CLI and the
admin panel.

Both sides follow the ConfigMaps by a watch (``cluster.mirror.Mirror``): a change wakes them at
once, and every ``every_s`` they compare their own side (the hub's rows, the activator's
services) with the copy, without asking the API server.
"""

from __future__ import annotations

import asyncio
import json
import logging

from sqlalchemy import select

from inference.autoscaler import IdleLimit
from inference.controller import Controller
from scheduler.kubernetes.client import ApiError, KubeClient

from ..cluster.mirror import Mirror
from .db import InferenceRow
from .idle import idle_limits, store_status
from .spec import parse_spec

log = logging.getLogger("gpupool.inference")
LABEL = "gpupool.io/inference-spec"
STATUS = "gpupool.io/inference-status"
SPEC_KEY = "spec.json"
IDLE_KEY = "idle_limit.json"


def configmap_name(service: str) -> str:
    return f"gpupool-inference-{service}"


def manifest(spec: dict, namespace: str, idle_limit: IdleLimit | None = None) -> dict:
    name = spec["name"]
    limit = None if idle_limit is None else {"seconds": idle_limit.seconds, "policy": idle_limit.policy}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(name), "namespace": namespace,
                         "labels": {LABEL: name, "app.kubernetes.io/managed-by": "gpupool"}},
            "data": {SPEC_KEY: json.dumps(spec, sort_keys=True), IDLE_KEY: json.dumps(limit)}}


def spec_of(cm: dict) -> dict:
    return json.loads(cm.get("data", {}).get(SPEC_KEY, "{}"))


def idle_limit_of(cm: dict) -> IdleLimit | None:
    raw = json.loads(cm.get("data", {}).get(IDLE_KEY, "null"))
    return None if raw is None else IdleLimit(float(raw["seconds"]), str(raw["policy"]))


def status_of(cm: dict) -> dict:
    raw = cm["metadata"].get("annotations", {}).get(STATUS)
    return json.loads(raw) if raw else {}


class _Following:
    """A side that follows the published ConfigMaps: ``sync`` at each change of one, and
    every ``every_s``."""

    def __init__(self, kc: KubeClient, namespace: str, Session=None):
        self.kc, self.namespace = kc, namespace
        self.path = f"/api/v1/namespaces/{namespace}/configmaps"
        self.mirror = Mirror(kc, Session, {"configmaps": self.path}, selectors={"configmaps": LABEL})

    def published(self) -> dict[str, dict]:
        """The services' ConfigMaps as last seen, by service name."""
        return {cm["metadata"]["labels"][LABEL]: cm for cm in self.mirror.objects["configmaps"].values()}

    async def sync(self) -> None:
        raise NotImplementedError

    async def follow(self, every_s: float) -> None:
        self.mirror.start()
        try:
            while True:
                seen = self.mirror.version
                if self.mirror.ready:
                    try:
                        await self.sync()
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("following the published inference services failed")
                await self.mirror.wait_past(seen, every_s)
        finally:
            await self.mirror.stop()


class Publisher(_Following):
    """The hub's side: its rows become ConfigMaps; the activator's state comes back to the rows."""

    def __init__(self, kc: KubeClient, namespace: str, Session):
        super().__init__(kc, namespace, Session)
        self.Session = Session

    async def sync(self) -> None:
        with self.Session() as s:
            rows = s.scalars(select(InferenceRow)).all()
            specs = {r.name: r.spec for r in rows}
            limits = idle_limits(s, rows)
        cms = self.published()
        for name in set(cms) - set(specs):
            try:
                await self.kc.delete(f"{self.path}/{configmap_name(name)}")
            except ApiError as e:
                if e.status != 404:
                    raise
        for name, spec in specs.items():
            want = manifest(spec, self.namespace, limits[name])
            if name not in cms:  # one made just now, not yet in the copy, is left as it is
                await self.kc.ensure(self.path, want)
            elif cms[name].get("data") != want["data"]:
                await self.kc.patch(f"{self.path}/{configmap_name(name)}", {"data": want["data"]})
        with self.Session() as s:
            for name, cm in cms.items():
                st = status_of(cm)
                row = s.get(InferenceRow, name)
                if st and row is not None and {k: v for k, v in (row.status or {}).items() if k != "updated"} != st:
                    store_status(s, row, st)
            s.commit()


class Follower(_Following):
    """The activator's side: published services join ``controller`` (and leave it when their
    ConfigMap goes); their state is written back on the ConfigMap when it changes.
    ``fixed``: services of the activator's own configuration, never removed here."""

    def __init__(self, kc: KubeClient, namespace: str, controller: Controller, fixed: set[str]):
        super().__init__(kc, namespace)
        self.controller, self.fixed = controller, fixed
        self.followed: set[str] = set()

    async def sync(self) -> None:
        cms = self.published()
        for name in self.followed - set(cms):
            self.followed.discard(name)
            await self.controller.remove(name)
        for name, cm in cms.items():
            if name in self.fixed:
                continue
            try:
                self.controller.put(parse_spec(spec_of(cm)), idle_limit_of(cm))
            except Exception as e:  # a spec this version cannot read: say why, skip it
                log.warning("inference service %s: %s", name, e)
                continue
            self.followed.add(name)
            st = self.controller.services[name].status()
            st.pop("requests_total", None)
            if st != status_of(cm):
                await self.kc.patch(f"{self.path}/{configmap_name(name)}",
                                    {"metadata": {"annotations": {STATUS: json.dumps(st, sort_keys=True)}}})


__all__ = ["LABEL", "STATUS", "Follower", "Publisher", "configmap_name", "idle_limit_of", "manifest", "spec_of",
           "status_of"]
