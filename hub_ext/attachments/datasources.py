"""Project data sources: storage that admins describe once per project and users attach
to their workloads.

Kinds and where they work:

- ``hostpath`` {path}: embedded mode exposes it (symlink ``data/NAME`` in the workload's
  folder and ``GPUPOOL_DATA_<NAME>``); on Kubernetes a ``hostPath`` volume.
- ``nfs`` {server, path}: on Kubernetes an ``nfs`` volume. Embedded mode runs without root
  and mounts nothing: it checks and describes the export (``GPUPOOL_DATA_<NAME>`` holds
  ``nfs://server/path``) and the workload (or the machine's fstab) must mount it.
- ``pvc`` {claim}: Kubernetes only (a ``persistentVolumeClaim`` volume); embedded mode
  describes it the same way.

``mount_path`` is where the volume appears in a pod (Kubernetes); ``read_only`` applies to
the volume. Every rule is in ``check``; conflicts between the sources one workload
attaches are in ``rows_for``. Errors: ``FieldError`` (400) naming the field, ``NotFound``,
``Conflict``.
"""

from __future__ import annotations

import re
import time

from sqlalchemy import JSON, Boolean, Float, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .. import validation
from ..db import audit
from ..db.tables import Base, ProjectRow
from ..org.projects import Conflict, NotFound
from ..validation import FieldError
from . import items as project_items

KINDS = {"hostpath": ("path",), "nfs": ("server", "path"), "pvc": ("claim",)}
FIELDS = ("name", "kind", "path", "server", "claim", "mount_path", "read_only", "description")
# Where a data source may not be mounted (the system, and where gpupool puts its own files).
RESERVED_MOUNTS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run",
                   "/sbin", "/sys", "/usr", "/var/run/gpupool", "/usr/local/lib/gpupool")
CLAIM_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
HOST_RE = re.compile(r"\[[0-9a-fA-F:.]{2,45}\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


class DataSourceRow(Base):
    __tablename__ = "data_sources"
    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(50), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict] = mapped_column(JSON, default=dict)  # path | server+path | claim
    mount_path: Mapped[str] = mapped_column(Text)
    read_only: Mapped[bool] = mapped_column(Boolean, default=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created: Mapped[float] = mapped_column(Float, default=time.time)


def check_path(raw, field_name: str) -> str:
    """An absolute path with no '..', returned normalised (validation.path)."""
    return validation.path(raw, field_name)


def _inside(a: str, b: str) -> bool:
    """a is b or below it."""
    return a == b or a.startswith(b.rstrip("/") + "/")


def check_mount_path(raw, field_name: str = "mount_path") -> str:
    path = check_path(raw, field_name)
    for r in RESERVED_MOUNTS:
        if path == r or (r != "/" and _inside(path, r)):
            raise FieldError(field_name, f"{path} is reserved (system or gpupool folders: "
                             f"{', '.join(RESERVED_MOUNTS)}); choose e.g. /data/NAME")
    return path


def check(data: dict) -> dict:
    """A data source from its JSON: the row's fields, or FieldError naming the field."""
    validation.check_fields(data, FIELDS)
    name = validation.name(data.get("name"), "name", "item")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise FieldError("kind", f"must be one of {', '.join(KINDS)}, got {validation.show(kind)}")
    for k in FIELDS[2:5]:
        if k in data and k not in KINDS[kind]:
            raise FieldError(k, f"is not a field of a {kind} data source (it takes "
                             f"{', '.join(KINDS[kind])})")
    spec: dict = {}
    if kind in ("hostpath", "nfs"):
        if "path" not in data:
            raise FieldError("path", f"a {kind} data source needs a path")
        spec["path"] = check_path(data["path"], "path")
    if kind == "nfs":
        server = data.get("server")
        if not isinstance(server, str) or not HOST_RE.fullmatch(server):
            raise FieldError("server", f"must be a host name or IP address, got {validation.show(server)}")
        spec["server"] = server
    if kind == "pvc":
        claim = data.get("claim")
        if not isinstance(claim, str) or len(claim) > 253 or not CLAIM_RE.fullmatch(claim):
            raise FieldError("claim", "must be a PersistentVolumeClaim name: lowercase letters, "
                             f"digits, '-' and '.', at most 253, got {validation.show(claim)}")
        spec["claim"] = claim
    mount = check_mount_path(data.get("mount_path", f"/data/{name}"))
    read_only = data.get("read_only", True)
    if not isinstance(read_only, bool):
        raise FieldError("read_only", f"must be true or false, got {validation.show(read_only)}")
    description = validation.text(data.get("description", ""), "description",
                                  validation.MAX_DESCRIPTION, multiline=True)
    return {"name": name, "kind": kind, "spec": spec, "mount_path": mount,
            "read_only": read_only, "description": description}


def describe(kind: str, spec: dict) -> str:
    """One line: where the data lives (a URL-like form, also the embedded env value)."""
    if kind == "hostpath":
        return spec["path"]
    if kind == "nfs":
        return f"nfs://{spec['server']}{spec['path']}"
    return f"pvc://{spec['claim']}"


def datasource_dict(d: DataSourceRow) -> dict:
    return {"name": d.name, "project": d.project, "kind": d.kind, **d.spec,
            "source": describe(d.kind, d.spec), "mount_path": d.mount_path,
            "read_only": d.read_only, "description": d.description,
            "created_by": d.created_by, "created": d.created}


ITEMS = project_items.Kind(DataSourceRow, "data source", datasource_dict)
get, list_for, names_by_project = ITEMS.get, ITEMS.list_for, ITEMS.names_by_project


def create(s, project: str, data: dict, actor: str) -> dict:
    if s.get(ProjectRow, project) is None:
        raise NotFound(f"project {project!r} does not exist")
    fields = check(data)
    if s.get(DataSourceRow, (project, fields["name"])) is not None:
        raise Conflict("name", f"data source {fields['name']!r} already exists in project "
                       f"{project!r}")
    row = DataSourceRow(project=project, created_by=actor, created=time.time(), **fields)
    s.add(row)
    audit.record(s, actor, "datasource.created", f"{project}/{row.name}",
                 {"kind": row.kind, "source": describe(row.kind, row.spec),
                  "mount_path": row.mount_path}, project)
    s.flush()
    return datasource_dict(row)


def delete(s, project: str, name: str, actor: str) -> None:
    row = ITEMS.row(s, project, name)
    s.delete(row)
    audit.record(s, actor, "datasource.deleted", f"{project}/{name}", {"kind": row.kind}, project)


def rows_for(s, project: str, names: list[str], taken: dict[str, str] | None = None,
             field_name: str = "datasources") -> list[DataSourceRow]:
    """The data sources ``names`` of ``project`` for one workload. FieldError for a name the
    project does not have, or two mount paths where one is inside the other (``taken``:
    paths the workload already uses, path -> what)."""
    used = dict(taken or {})
    rows = []
    for n in names:
        row = ITEMS.named(s, project, n, field_name)
        for path, what in used.items():
            if _inside(row.mount_path, path) or _inside(path, row.mount_path):
                raise FieldError(field_name, f"mount path {row.mount_path} of data source {n!r} "
                                 f"conflicts with {path} ({what})")
        used[row.mount_path] = f"data source {n!r}"
        rows.append(row)
    return rows


__all__ = ["KINDS", "DataSourceRow", "check", "check_mount_path", "check_path", "create",
           "datasource_dict", "delete", "describe", "get", "list_for", "names_by_project",
           "rows_for"]
