"""The organisation on Kubernetes: the Department/Project objects (gpupool.io/v1alpha1) are
the truth for departments, projects and their quotas; the hub's database holds a copy.

- ``publish`` writes one change to the API server (the REST API calls it before it writes
  the copy), and turns the CRDs' validation errors (HTTP 422) into ``FieldError`` naming the
  REST field.
- ``OrgSync`` lists and watches the objects and makes the database's departments and projects
  equal to them, whoever wrote them (the hub, kubectl, a GitOps tool).

Members and role assignments are not in the objects: they stay in the database (decision
record 0023). The quota of ``scheduler.model.DEFAULT_POOL`` is the REST API's top-level
fields, every other pool's its ``pools`` (``spec.quotas.<pool>``: gpus, overQuotaWeight,
limit, cpu, memoryGib), CPU and memory quotas included: gpupool-scheduler reads them there.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

import aiohttp
from sqlalchemy import delete, select

from gpupool.errors import GpupoolError
from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.model import DEFAULT_POOL

from ..db.events import add_event
from ..db.tables import DepartmentRow, MemberRow, ProjectRow, bump_version
from ..org.projects import Conflict
from ..org.roles import Forbidden
from ..validation import FieldError
from .mirror import Mirror

GROUP = "/apis/gpupool.io/v1alpha1"
PATHS = {"department": f"{GROUP}/departments", "project": f"{GROUP}/projects"}
KINDS = {"department": "Department", "project": "Project"}
# CRD field -> REST field
_FIELDS = {"gpus": "gpus", "overQuotaWeight": "over_quota_weight", "limit": "limit",
           "cpu": "cpu_quota", "memoryGib": "memory_quota_gib", "department": "department", "name": "name"}
_POOL_PATH = re.compile(r"spec\.quotas(?:\.([^.\[]+)|\[([^\]]+)\])")
_clients: dict[str, KubeClient] = {}


class Unavailable(GpupoolError):
    """The API server could not take a write (the REST API answers 503)."""


def kubeconfig_path(kubeconfig: str) -> str:
    """The hub's kubeconfig: ``Gpupool.kubeconfig``, else $KUBECONFIG; empty: the pod's
    service account."""
    return kubeconfig or os.environ.get("KUBECONFIG", "")


async def client(kubeconfig: str) -> KubeClient:
    """One client per process, from ``kubeconfig_path(kubeconfig)``."""
    path = kubeconfig_path(kubeconfig)
    if path not in _clients:
        _clients[path] = await KubeClient.from_kubeconfig(path or None)
    return _clients[path]


# -- the objects' shape ------------------------------------------------------------------
def _crd_quota(q: dict) -> dict[str, Any]:
    # None: a merge patch removes the key
    return {"gpus": q["gpus"], "overQuotaWeight": q["over_quota_weight"], "limit": q["limit"],
            "cpu": q.get("cpu_quota"), "memoryGib": q.get("memory_quota_gib")}


def spec_of(kind: str, item: dict, removed: tuple[str, ...] = ()) -> dict:
    """The spec written for an org dict (org.get_department / org.get_project); ``removed``:
    pools whose quota the change took away (null in a merge patch)."""
    quotas: dict[str, Any] = {DEFAULT_POOL: _crd_quota(item)}
    quotas.update({pool: _crd_quota(q) for pool, q in (item.get("pools") or {}).items()})
    quotas.update({pool: None for pool in removed if pool not in quotas})
    spec: dict[str, Any] = {"quotas": quotas}
    if kind == "project":
        spec["department"] = item["department"]
    return spec


def _number(v: Any) -> float | None:
    return None if v is None else float(v)


def _rest_quota(q: dict) -> dict:
    return {"gpus": float(q.get("gpus", 0)), "over_quota_weight": float(q.get("overQuotaWeight", 1)),
            "limit": _number(q.get("limit")), "cpu_quota": _number(q.get("cpu")),
            "memory_quota_gib": _number(q.get("memoryGib"))}


def _quotas(obj: dict) -> dict:
    return (obj.get("spec") or {}).get("quotas") or {}


def quota_of(obj: dict) -> dict:
    """gpus, over_quota_weight, limit, cpu_quota and memory_quota_gib of the object's
    DEFAULT_POOL quota (0 GPUs without)."""
    return _rest_quota(_quotas(obj).get(DEFAULT_POOL) or {})


def pools_of(obj: dict) -> dict:
    """The object's other pools' quotas as the REST API's ``pools``."""
    return {pool: _rest_quota(q) for pool, q in sorted(_quotas(obj).items())
            if pool != DEFAULT_POOL and isinstance(q, dict)}


def field_error(e: ApiError) -> FieldError:
    """The API server's refusal as the REST API's 400: the first cause's field, named as the
    REST API names it (``spec.quotas.default.limit`` -> ``limit``,
    ``spec.quotas.fast.limit`` -> ``pools.fast.limit``)."""
    causes = ((e.body.get("details") or {}).get("causes")) or [{}]
    cause = causes[0]
    path = str(cause.get("field") or "")
    last = path.rsplit(".", 1)[-1].split("[", 1)[0]
    name = _FIELDS.get(last, path or "body")
    m = _POOL_PATH.match(path)  # spec.quotas.fast.limit, or spec.quotas[fast].limit (CEL rules)
    pool = m and (m.group(1) or m.group(2).strip("'\""))
    if pool and pool != DEFAULT_POOL:
        name = f"pools.{pool}" + (f".{name}" if path[m.end():] and last in _FIELDS else "")
    return FieldError(name, str(cause.get("message") or e.message))


# -- writes ------------------------------------------------------------------------------
async def publish(kc: KubeClient, kind: str, name: str, item: dict | None,
                  removed: tuple[str, ...] = ()) -> None:
    """Make the object ``name`` say ``item`` (None: delete it); ``removed``: node pools whose
    quota the change took away (spec_of). The API server's refusals as
    the REST API's: FieldError (its 422 or 400), Forbidden (403), Conflict (409); Unavailable
    for any other failure (nothing was written)."""
    path = PATHS[kind]
    try:
        if item is None:
            try:
                await kc.delete(f"{path}/{name}")
            except ApiError as e:
                if e.status != 404:
                    raise
            return
        spec = spec_of(kind, item, removed)
        try:
            await kc.patch(f"{path}/{name}", {"spec": spec})
        except ApiError as e:
            if e.status != 404:
                raise
            spec["quotas"] = {pool: {k: v for k, v in q.items() if v is not None}
                              for pool, q in spec["quotas"].items() if q is not None}
            await kc.post(path, {"apiVersion": "gpupool.io/v1alpha1", "kind": KINDS[kind],
                                 "metadata": {"name": name}, "spec": spec})
    except ApiError as e:
        if e.status in (400, 422):
            raise field_error(e) from None
        if e.status == 403:  # the ClusterRole may leave the organisation to Git
            raise Forbidden(f"the cluster refuses to change {kind} {name}: {e.message}") from None
        if e.status == 409:
            raise Conflict("name", f"{kind} {name!r} changed in the cluster meanwhile: {e.message}") from None
        raise Unavailable(f"the Kubernetes API server refused to write {kind} {name}: {e}") from None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise Unavailable(f"the Kubernetes API server cannot be reached: {e}") from None


# -- the copy in the database ------------------------------------------------------------
def _differs(row, q: dict) -> bool:
    """Whether the row's quotas differ from ``q`` (a row's pool_quotas may be NULL: none)."""
    return any((row.pool_quotas or {} if k == "pool_quotas" else getattr(row, k)) != v for k, v in q.items())


def _stored_and_wanted(s, Row, name: str, obj: dict) -> tuple:
    """The row ``name`` (None: none yet) and the quota fields its object asks for."""
    row = s.get(Row, name)
    return row, {**quota_of(obj), "pool_quotas": pools_of(obj)}


def _set(row, fields: dict) -> None:
    for k, v in fields.items():
        setattr(row, k, v)


def reconcile(s, departments: dict[str, dict], projects: dict[str, dict]) -> bool:
    """Make the database's departments and projects equal to the objects (name -> object).
    A project whose department has no object yet waits for it. True when anything changed."""
    changed = False
    for name, obj in departments.items():
        row, q = _stored_and_wanted(s, DepartmentRow, name, obj)
        if row is None:
            s.add(DepartmentRow(name=name, **q))
            add_event(s, "org", f"department {name} created in the cluster")
        elif _differs(row, q):
            _set(row, q)
        else:
            continue
        changed = True
    s.flush()
    for name, obj in projects.items():
        dept = str((obj.get("spec") or {}).get("department", ""))
        if dept not in departments:
            continue
        row, q = _stored_and_wanted(s, ProjectRow, name, obj)
        if row is None:
            s.add(ProjectRow(name=name, department=dept, **q))
            add_event(s, "org", f"project {name} created in the cluster with {q['gpus']:g} GPUs",
                      project=name)
        elif row.department != dept or _differs(row, q):
            if row.gpus != q["gpus"]:
                add_event(s, "quota", f"project {name} quota {row.gpus:g} -> {q['gpus']:g} GPUs "
                          "in the cluster", project=name)
            _set(row, {**q, "department": dept})
        else:
            continue
        changed = True
    s.flush()
    for (name,) in s.execute(select(ProjectRow.name)).all():
        p = projects.get(name)
        if p is None or str((p.get("spec") or {}).get("department", "")) not in departments:
            s.execute(delete(MemberRow).where(MemberRow.project == name))
            s.execute(delete(ProjectRow).where(ProjectRow.name == name))
            add_event(s, "org", f"project {name} deleted in the cluster", project=name)
            changed = True
    for (name,) in s.execute(select(DepartmentRow.name)).all():
        if name not in departments:
            s.execute(delete(DepartmentRow).where(DepartmentRow.name == name))
            add_event(s, "org", f"department {name} deleted in the cluster")
            changed = True
    if changed:
        bump_version(s)
    return changed


class OrgSync(Mirror):
    """Lists and watches Departments and Projects; after each event the database copy is
    made equal to what the API server holds."""

    def __init__(self, kc: KubeClient, Session, retry_s: float = 2.0):
        super().__init__(kc, Session, PATHS, retry_s)

    def apply(self) -> None:
        with self.Session() as s:
            if reconcile(s, self.objects["department"], self.objects["project"]):
                s.commit()
