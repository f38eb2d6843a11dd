"""Inference services on Kubernetes: the hub publishes them, the chart's activator serves them.

One ConfigMap per service in the release namespace, ``gpupool-inference-NAME``, labelled
``gpupool.io/inference-spec: NAME``: ``data["spec.json"]`` is the service's spec
(``ServiceSpec.to_dict()``) and ``data["idle_limit.json"]`` its project's policy's idle
limit (``{seconds, policy}`` or null), and ``data["attachments.json"]`` its credentials'
and data sources by name, key and mount (``attach.Attachments``, never a value), written
only by the hub from its rows and policies. The credentials' values are in the Secret
``NAME-credentials`` the hub writes beside it (again when a value changes), which the
replicas reference (``kubernetes.replica_pod``), so the activator never reads the vault;
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
import hashlib
import json
import logging

from sqlalchemy import select

from inference.autoscaler import IdleLimit
from inference.controller import Controller
from scheduler.kubernetes.client import ApiError, KubeClient

from ..attachments import attach
from ..cluster.mirror import Mirror
from ..requests.rules import FieldError
from .db import InferenceRow
from .idle import idle_limits, store_status
from .spec import parse_spec

log = logging.getLogger("gpupool.inference")
LABEL = "gpupool.io/inference-spec"
STATUS = "gpupool.io/inference-status"
SPEC_KEY = "spec.json"
IDLE_KEY = "idle_limit.json"
ATTACH_KEY = "attachments.json"


def configmap_name(service: str) -> str:
    return f"gpupool-inference-{service}"


def manifest(spec: dict, namespace: str, idle_limit: IdleLimit | None = None,
             attachments: attach.Attachments | None = None) -> dict:
    name = spec["name"]
    limit = None if idle_limit is None else {"seconds": idle_limit.seconds, "policy": idle_limit.policy}
    data = {SPEC_KEY: json.dumps(spec, sort_keys=True), IDLE_KEY: json.dumps(limit)}
    if attachments:
        data[ATTACH_KEY] = json.dumps(attachments.to_dict(), sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(name), "namespace": namespace,
                         "labels": {LABEL: name, "app.kubernetes.io/managed-by": "gpupool"}},
            "data": data}


def spec_of(cm: dict) -> dict:
    return json.loads(cm.get("data", {}).get(SPEC_KEY, "{}"))


def idle_limit_of(cm: dict) -> IdleLimit | None:
    raw = json.loads(cm.get("data", {}).get(IDLE_KEY, "null"))
    return None if raw is None else IdleLimit(float(raw["seconds"]), str(raw["policy"]))


def attachments_of(cm: dict) -> attach.Attachments | None:
    raw = cm.get("data", {}).get(ATTACH_KEY)
    return attach.Attachments.from_dict(json.loads(raw)) if raw else None


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

    async def first_sync(self) -> None:
        """One ``sync`` once the copy is listed (before ``follow``)."""
        self.mirror.start()
        while not self.mirror.ready:
            await self.mirror.wait_past(self.mirror.version, 0.5)
        await self.sync()

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
    """The hub's side: its rows become ConfigMaps and their credentials Secrets; the
    activator's state comes back to the rows. ``vault``: opens the credentials' values."""

    def __init__(self, kc: KubeClient, namespace: str, Session, vault=None):
        super().__init__(kc, namespace, Session)
        self.Session, self.vault = Session, vault
        self.secrets = f"/api/v1/namespaces/{namespace}/secrets"
        self._written: dict[str, str] = {}  # service -> digest of the values last written

    async def _attach(self, name: str, spec: dict) -> attach.Attachments | None:
        """The service's attachments, its Secret written when its values changed (the use
        audited then); a credential or data source deleted since: published without it is
        wrong, so the service keeps its last Secret and the error is logged."""
        if not spec.get("credentials") and not spec.get("datasources"):
            return None
        with self.Session() as s:
            att = attach.check(s, spec["project"], spec.get("credentials") or [], spec.get("datasources") or [])
            values = attach.values(s, self.vault, att) if att.credentials and self.vault is not None else {}
            digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
            if values and self._written.get(name) != digest:
                await self.kc.apply(self.secrets, attach.secret_manifest(
                    attach.secret_name(name), self.namespace, values, {LABEL: name}))
                attach.record_use(s, spec.get("owner") or "", name, att, "deliver")
                s.commit()
                self._written[name] = digest
        return att

    async def sync(self) -> None:
        with self.Session() as s:
            rows = s.scalars(select(InferenceRow)).all()
            specs = {r.name: r.spec for r in rows}
            limits = idle_limits(s, rows)
        cms = self.published()
        for name in set(cms) - set(specs):
            for path in (f"{self.path}/{configmap_name(name)}", f"{self.secrets}/{attach.secret_name(name)}"):
                try:
                    await self.kc.delete(path)
                except ApiError as e:
                    if e.status != 404:
                        raise
            self._written.pop(name, None)
        for name, spec in specs.items():
            try:
                att = await self._attach(name, spec)
            except FieldError as e:
                log.warning("inference service %s: %s", name, e)
                continue
            want = manifest(spec, self.namespace, limits[name], att)
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

    def attachments(self, spec) -> tuple[attach.Attachments | None, dict]:
        """``KubernetesBackend``'s ``attachments``: a published service's, from its ConfigMap; the
        values are in the Secret the hub wrote, so none are given here."""
        cm = self.published().get(spec.name)
        return (attachments_of(cm) if cm is not None else None), {}

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


__all__ = ["LABEL", "STATUS", "Follower", "Publisher", "attachments_of", "configmap_name", "idle_limit_of",
           "manifest", "spec_of", "status_of"]
