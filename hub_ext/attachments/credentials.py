"""Project credentials: named sets of key/value secrets (an object-store access key and
secret, a registry password) that admins define and users attach to their workloads.

Write-only: ``credential_dict`` (what every API, page and log sees) holds the name, the
key names, the delivery and timestamps, never a value. Values are encrypted at rest with
``cryptography``'s Fernet (AES-128-CBC + HMAC-SHA256) under a key kept in a file created
with mode 0600 (``Vault``); only ``Vault.open`` returns them, and only the delivery code
(``attach.py``) calls it, when a workload starts.

Delivery (``delivery`` field): ``env`` puts each key in the workload's environment under
its own name; ``files`` writes each key to a file named after it, in a folder whose path
is in ``GPUPOOL_CREDENTIALS_<NAME>``.

Errors: ``FieldError`` (400) naming the field; ``org.NotFound`` (404); ``org.Conflict`` (409).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import JSON, Float, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .. import validation
from ..db import audit
from ..db.tables import Base, ProjectRow
from ..org.projects import Conflict, NotFound
from ..validation import FieldError
from . import items as project_items

DELIVERIES = ("env", "files")
# Environment names gpupool or the runtime set themselves: a credential must not shadow them.
RESERVED_ENV = {"PATH", "HOME", "USER", "SHELL", "PYTHONPATH", "PORT", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"}
RESERVED_PREFIXES = ("GPUPOOL_", "JUPYTERHUB_", "JPY_", "CUDA_", "NVIDIA_", "LD_", "TORCHELASTIC_")
MAX_KEYS, MAX_VALUE_BYTES = 32, 64 * 1024
FIELDS = ("name", "delivery", "data", "description")


class CredentialRow(Base):
    __tablename__ = "credentials"
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    delivery: Mapped[str] = mapped_column(String(8), default="env")
    keys: Mapped[list] = mapped_column(JSON, default=list)  # key names only
    sealed: Mapped[str] = mapped_column(Text)  # Fernet token of the JSON {key: value}
    description: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created: Mapped[float] = mapped_column(Float, default=time.time)
    updated: Mapped[float] = mapped_column(Float, default=time.time)


class Vault:
    """Seals and opens credential values with a Fernet key read from ``key_file``; the
    first process that needs it creates it (mode 0600, O_EXCL so that the hub and the
    service, starting together, agree on one key)."""

    def __init__(self, key_file: str | Path):
        self.key_file = Path(key_file)
        self._fernet: Fernet | None = None

    def _f(self) -> Fernet:
        if self._fernet is None:
            self.key_file.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(Fernet.generate_key())
            key = b""
            for _ in range(50):  # the other process may be between create and write
                key = self.key_file.read_bytes().strip()
                if key:
                    break
                time.sleep(0.02)
            self._fernet = Fernet(key)
        return self._fernet

    def seal(self, values: dict[str, str]) -> str:
        return self._f().encrypt(json.dumps(values).encode()).decode()

    def open(self, sealed: str) -> dict[str, str]:
        try:
            return json.loads(self._f().decrypt(sealed.encode()))
        except InvalidToken:
            raise RuntimeError(f"a credential cannot be decrypted with the key in {self.key_file} "
                               "(was the key file replaced?)") from None


def vault_for(cfg) -> Vault:
    return Vault(getattr(cfg, "credentials_key_file", "") or Path(cfg.state_dir) / "credentials.key")


def credential_dict(c: CredentialRow) -> dict:
    """Everything that may be shown about a credential: no value, ever."""
    return {"name": c.name, "project": c.project, "delivery": c.delivery, "keys": list(c.keys),
            "description": c.description, "created_by": c.created_by,
            "created": c.created, "updated": c.updated}


ITEMS = project_items.Kind(CredentialRow, "credential", credential_dict)
get, list_for, names_by_project = ITEMS.get, ITEMS.list_for, ITEMS.names_by_project


def check_key(key, delivery: str, field_name: str = "data") -> str:
    if delivery == "env":
        if not validation.is_name(key, "env_key"):
            raise FieldError(field_name, f"key {validation.show(key)} must be an environment variable name "
                             "(letters, digits, '_', not starting with a digit, at most 128)")
        if key in RESERVED_ENV or key.startswith(RESERVED_PREFIXES):
            raise FieldError(field_name, f"key {key!r} is set by gpupool itself; reserved: "
                             f"{', '.join(sorted(RESERVED_ENV))} and names starting with "
                             f"{', '.join(RESERVED_PREFIXES)}")
    elif not validation.is_name(key, "file_key"):
        raise FieldError(field_name, f"key {validation.show(key)} must be a file name (letters, digits, '.', "
                         "'_', '-', not starting with '.' or '-', at most 128)")
    return key


def _check(project: str, data: dict) -> tuple[str, str, dict[str, str], str]:
    validation.check_fields(data, FIELDS)
    name = validation.name(data.get("name"), "name", "item")
    delivery = data.get("delivery", "env")
    if delivery not in DELIVERIES:
        raise FieldError("delivery", f"must be one of {', '.join(DELIVERIES)}, "
                         f"got {validation.show(delivery)}")
    values = data.get("data")
    if not isinstance(values, dict) or not 1 <= len(values) <= MAX_KEYS:
        raise FieldError("data", f"must be an object of 1 to {MAX_KEYS} key: value strings")
    for k, v in values.items():
        check_key(k, delivery)
        # the messages name the key, never echo the value
        if not isinstance(v, str):
            raise FieldError("data", f"the value of {k!r} must be a string")
        if validation.has_surrogate(v):  # a secret may hold any other character
            raise FieldError("data", f"the value of {k!r} must not contain a lone surrogate")
        if delivery == "env" and "\0" in v:  # an environment string ends at its first NUL
            raise FieldError("data", f"the value of {k!r} must not contain a NUL character "
                             "with delivery 'env' (use delivery 'files' for binary values)")
        if len(v.encode()) > MAX_VALUE_BYTES:
            raise FieldError("data", f"the value of {k!r} must be at most {MAX_VALUE_BYTES} bytes")
    description = validation.text(data.get("description", ""), "description",
                                  validation.MAX_DESCRIPTION, multiline=True)
    return name, delivery, dict(values), description


def _project(s, project: str) -> None:
    if s.get(ProjectRow, project) is None:
        raise NotFound(f"project {project!r} does not exist")


def create(s, vault: Vault, project: str, data: dict, actor: str) -> dict:
    _project(s, project)
    name, delivery, values, description = _check(project, data)
    if s.get(CredentialRow, (project, name)) is not None:
        raise Conflict("name", f"credential {name!r} already exists in project {project!r}; "
                       "delete it first to replace it")
    now = time.time()
    row = CredentialRow(project=project, name=name, delivery=delivery, keys=sorted(values),
                        sealed=vault.seal(values), description=description, created_by=actor,
                        created=now, updated=now)
    s.add(row)
    audit.record(s, actor, "credential.created", f"{project}/{name}",
                 {"keys": sorted(values), "delivery": delivery}, project)
    s.flush()
    return credential_dict(row)


def delete(s, project: str, name: str, actor: str) -> None:
    row = ITEMS.row(s, project, name)
    s.delete(row)
    audit.record(s, actor, "credential.deleted", f"{project}/{name}", {"keys": list(row.keys)},
                 project)


def rows_for(s, project: str, names: list[str], field_name: str = "credentials") -> list[CredentialRow]:
    """The credentials ``names`` of ``project`` for a workload; FieldError for a name the
    project does not have or two environment credentials setting the same variable."""
    rows, seen = [], {}
    for n in names:
        row = ITEMS.named(s, project, n, field_name)
        if row.delivery == "env":
            for k in row.keys:
                if k in seen:
                    raise FieldError(field_name, f"credentials {seen[k]!r} and {n!r} both set "
                                     f"the environment variable {k}")
                seen[k] = n
        rows.append(row)
    return rows


__all__ = ["DELIVERIES", "CredentialRow", "Vault", "check_key", "create", "credential_dict",
           "delete", "get", "list_for", "names_by_project", "rows_for", "vault_for"]
