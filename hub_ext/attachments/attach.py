"""Credentials and data sources attached to one workload: the check at submit time, the
delivery when it starts, and the Kubernetes objects that carry them.

- ``check`` (submit): the names exist in the workload's project, no two environment
  credentials set the same variable, no two mount paths overlap. ``record_use`` writes a
  ``credential.used`` / ``datasource.used`` audit entry per attachment.
- ``Delivery`` (embedded mode, in the hub process): environment variables, files and
  ``data/NAME`` symlinks. A workload given its owner's account gets its files in
  ``~/.gpupool/secrets/WORKLOAD/CRED/KEY`` of that account: owned by it, mode 0400, in
  folders of mode 0700, so no other account reads them. Without an account (a workload
  that runs as the hub's own user) they go under STATE_DIR/secrets/WORKLOAD. ``cleanup``
  removes them.
- ``secret_manifest`` / ``pod_parts`` (Kubernetes): one Secret per workload holding the
  attached values (``CRED.KEY`` entries); containers reference it by ``secretKeyRef``
  (``env`` delivery) or a secret volume with mode 0400 (``files``), and mount each data
  source as a ``hostPath``, ``nfs`` or ``persistentVolumeClaim`` volume.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..db import audit
from ..host import launch
from ..host.accounts import Account
from ..requests.rules import FieldError
from . import credentials, datasources
from .credentials import Vault

CREDENTIALS_MOUNT = "/var/run/gpupool/credentials"  # pods: one folder per files credential


def env_name(prefix: str, name: str) -> str:
    return prefix + name.upper().replace("-", "_")


@dataclass(frozen=True)
class CredentialRef:
    name: str
    delivery: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class DataSourceRef:
    name: str
    kind: str
    spec: dict
    mount_path: str
    read_only: bool = True


@dataclass(frozen=True)
class Attachments:
    """What one workload attaches: names, keys and mounts (never a value)."""

    project: str = ""
    credentials: tuple[CredentialRef, ...] = ()
    datasources: tuple[DataSourceRef, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.credentials or self.datasources)

    def to_dict(self) -> dict:
        """Names, keys and mounts as JSON (what a published inference service carries)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Attachments:
        return cls(d.get("project", ""),
                   tuple(CredentialRef(c["name"], c["delivery"], tuple(c["keys"])) for c in d.get("credentials", ())),
                   tuple(DataSourceRef(x["name"], x["kind"], dict(x["spec"]), x["mount_path"], bool(x["read_only"]))
                         for x in d.get("datasources", ())))


def check(s, project: str, creds: list[str] | tuple = (), sources: list[str] | tuple = (),
          taken: dict[str, str] | None = None) -> Attachments:
    """The attachments of a workload in ``project``, checked (FieldError names the field:
    ``credentials`` or ``datasources``)."""
    c_rows = credentials.rows_for(s, project, list(creds)) if creds else []
    d_rows = datasources.rows_for(s, project, list(sources), taken) if sources else []
    return Attachments(
        project,
        tuple(CredentialRef(r.name, r.delivery, tuple(r.keys)) for r in c_rows),
        tuple(DataSourceRef(r.name, r.kind, dict(r.spec), r.mount_path, r.read_only) for r in d_rows),
    )


def record_use(s, actor: str, workload: str, att: Attachments, stage: str) -> None:
    """One audit entry per attached credential and data source; ``stage``: attach (the
    workload was submitted with it) or deliver (its values reached a starting process)."""
    for c in att.credentials:
        audit.record(s, actor, "credential.used", f"{att.project}/{c.name}",
                     {"workload": workload, "stage": stage, "delivery": c.delivery,
                      "keys": list(c.keys)}, att.project)
    for d in att.datasources:
        audit.record(s, actor, "datasource.used", f"{att.project}/{d.name}",
                     {"workload": workload, "stage": stage, "kind": d.kind}, att.project)


def values(s, vault: Vault, att: Attachments) -> dict[str, dict[str, str]]:
    """credential name -> {key: value}: only the delivery paths call this."""
    out = {}
    for c in att.credentials:
        row = s.get(credentials.CredentialRow, (att.project, c.name))
        if row is None:
            raise FieldError("credentials", f"credential {c.name!r} was deleted "
                                         f"from project {att.project!r}")
        out[c.name] = vault.open(row.sealed)
    return out


# -- embedded mode -------------------------------------------------------------------------
class Delivery:
    """Hands attachments to local processes (the hub process of embedded mode)."""

    def __init__(self, Session, vault: Vault, state_dir: str | Path):
        self.Session, self.vault = Session, vault
        self.root = Path(state_dir) / "secrets"
        self._accounts: dict[str, Account] = {}  # workload -> the account its files went to

    def env(self, workload: str, actor: str, project: str, creds, sources,
            workdir: str | Path | None = None, account: Account | None = None) -> dict[str, str]:
        """The environment of a starting workload; writes its credential files (the
        ``account``'s, when given) and data symlinks; records the use. FieldError when an
        attachment is gone."""
        if not creds and not sources:
            return {}
        with self.Session() as s:
            att = check(s, project, creds, sources)
            vals = values(s, self.vault, att)
            record_use(s, actor, workload, att, "deliver")
            s.commit()
        env: dict[str, str] = {}
        self.cleanup(workload, account)
        if account is not None:
            self._accounts[workload] = account
        for c in att.credentials:
            if c.delivery == "env":
                env.update(vals[c.name])
            elif account is not None:
                where = launch.write_private(account, ("secrets", workload, c.name), vals[c.name])
                env[env_name("GPUPOOL_CREDENTIALS_", c.name)] = str(where)
            else:
                env[env_name("GPUPOOL_CREDENTIALS_", c.name)] = str(self._write(workload, c.name, vals[c.name]))
        links = Path(workdir) / "data" if workdir else None
        for d in att.datasources:
            where = datasources.describe(d.kind, d.spec)
            env[env_name("GPUPOOL_DATA_", d.name)] = where
            if d.kind == "hostpath" and links is not None and account is not None:
                # in the account's tree: made without following a link it planted there
                launch.link_in_home(account, links, d.name, d.spec["path"])
            elif d.kind == "hostpath" and links is not None:
                links.mkdir(parents=True, exist_ok=True)
                link = links / d.name
                if link.is_symlink():
                    link.unlink()
                if not link.exists():  # never replace a user's own file or folder there
                    link.symlink_to(d.spec["path"], target_is_directory=True)
        if links is not None and att.datasources:
            env["GPUPOOL_DATA_DIR"] = str(links)
        return env

    def _write(self, workload: str, name: str, vals: dict[str, str]) -> Path:
        folder = self.root / workload / name
        for d in (self.root, self.root / workload, folder):
            d.mkdir(mode=0o700, exist_ok=True)
            d.chmod(0o700)
        for key, value in vals.items():
            fd = os.open(folder / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "w") as f:
                f.write(value)
        return folder

    def cleanup(self, workload: str, account: Account | None = None) -> None:
        """Remove a workload's credential files (it has stopped, or starts again); give
        its ``account`` after a hub restart (the hub remembers it until then)."""
        shutil.rmtree(self.root / workload, ignore_errors=True)
        account = account or self._accounts.pop(workload, None)
        if account is not None:
            with contextlib.suppress(OSError):  # a symlink the account put there: its own tree
                launch.remove_private(account, "secrets", workload)


# -- Kubernetes ----------------------------------------------------------------------------
def secret_name(workload: str) -> str:
    return f"{workload}-credentials"


def secret_manifest(name: str, namespace: str, vals: dict[str, dict[str, str]],
                    labels: dict | None = None) -> dict:
    """The Secret a workload's pods reference: entries ``CRED.KEY``."""
    data = {f"{cred}.{k}": base64.b64encode(v.encode()).decode()
            for cred, kv in sorted(vals.items()) for k, v in sorted(kv.items())}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpupool", **(labels or {})}},
            "data": data}


@dataclass
class PodParts:
    env: list[dict] = field(default_factory=list)
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)


def pod_parts(att: Attachments, secret: str) -> PodParts:
    """Container env, pod volumes and container mounts for ``att`` (secret: the Secret
    made by ``secret_manifest``)."""
    p = PodParts()
    for c in att.credentials:
        if c.delivery == "env":
            p.env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": f"{c.name}.{k}"}}}
                      for k in c.keys]
        else:
            vol, path = f"cred-{c.name}", f"{CREDENTIALS_MOUNT}/{c.name}"
            p.volumes.append({"name": vol, "secret": {
                "secretName": secret, "defaultMode": 0o400,
                "items": [{"key": f"{c.name}.{k}", "path": k} for k in c.keys]}})
            p.mounts.append({"name": vol, "mountPath": path, "readOnly": True})
            p.env.append({"name": env_name("GPUPOOL_CREDENTIALS_", c.name), "value": path})
    for d in att.datasources:
        vol = f"data-{d.name}"
        if d.kind == "hostpath":
            src = {"hostPath": {"path": d.spec["path"], "type": "Directory"}}
        elif d.kind == "nfs":
            src = {"nfs": {"server": d.spec["server"], "path": d.spec["path"], "readOnly": d.read_only}}
        else:
            src = {"persistentVolumeClaim": {"claimName": d.spec["claim"], "readOnly": d.read_only}}
        p.volumes.append({"name": vol, **src})
        p.mounts.append({"name": vol, "mountPath": d.mount_path, "readOnly": d.read_only})
        p.env.append({"name": env_name("GPUPOOL_DATA_", d.name), "value": d.mount_path})
    return p


def kube_spawner_settings(att: Attachments, secret: str) -> dict:
    """The same parts as KubeSpawner settings, for ``GpupoolKubeSpawner.apply_request``:
    merge ``environment`` (values are strings or ``{"valueFrom": ...}``, which KubeSpawner
    takes as they are), ``volumes`` and ``volume_mounts``; create the Secret with
    ``ensure_secret`` before ``KubeSpawner.start``."""
    p = pod_parts(att, secret)
    env = {e["name"]: (e["value"] if "value" in e else {"valueFrom": e["valueFrom"]}) for e in p.env}
    return {"environment": env, "volumes": p.volumes, "volume_mounts": p.mounts}


async def ensure_secret(core_v1, secret: dict) -> None:
    """Create or replace ``secret`` with a kubernetes_asyncio CoreV1Api (KubeSpawner.api)."""
    from kubernetes_asyncio.client.rest import ApiException

    ns, name = secret["metadata"]["namespace"], secret["metadata"]["name"]
    try:
        await core_v1.create_namespaced_secret(ns, secret)
    except ApiException as e:
        if e.status != 409:
            raise
        await core_v1.replace_namespaced_secret(name, ns, secret)


__all__ = ["CREDENTIALS_MOUNT", "Attachments", "CredentialRef", "DataSourceRef", "Delivery",
           "PodParts", "check", "ensure_secret", "env_name", "kube_spawner_settings", "pod_parts",
           "record_use", "secret_manifest", "secret_name", "values"]
