"""Policies per department and project: the defaults and limits of what a request may ask
for, the templates, environments, node pools and GPU models allowed, and the maximum runtime
and the idle timeout per kind.

A policy is a flat JSON object of the keys in ``FIELDS``; a key left out is not set. A
project's policy narrows its department's and can never widen it (``check_narrows``); the
rules apply the merge of both (``effective``), each value carrying the policy that set it so
a refusal names it: ``gpu_fraction: project nlp's policy allows at most 0.5, got 0.75``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select

from .. import validation
from ..db import audit
from ..db.tables import DepartmentRow, PolicyRow, ProjectRow
from ..validation import FieldError
from .projects import NotFound

KINDS = ("workspace", "training", "inference")
# Request field -> (lowest, highest, whole numbers, unit): what its policy's max and
# default may be.
RESOURCES = {
    "gpu_fraction": (0.05, 1.0, False, " GPU"),
    "gpu_memory_gib": (0.5, validation.MAX_GPU_MEMORY_GIB, False, " GiB"),
    "gpus": (1, validation.MAX_GPUS, True, " GPUs"),
    "cpu": (0.1, 1024.0, False, " CPUs"),
    "memory_gib": (0.25, 65536.0, False, " GiB"),
}
MAX_SECONDS = 366 * 86400
LISTS = ("templates", "environments", "node_pools", "gpu_models")
NUMBERS = {
    **{f"{r}_max": RESOURCES[r] for r in RESOURCES},
    **{f"{r}_default": RESOURCES[r] for r in RESOURCES},
    **{f"max_runtime_{k}_s": (1, MAX_SECONDS, True, " s") for k in KINDS},
    # workspaces and trainings: the culler (service/culler.py); services: the autoscaler
    # scales them to zero (inference/autoscaler.py, IdleLimit)
    **{f"idle_timeout_{k}_s": (1, MAX_SECONDS, True, " s") for k in KINDS},
}
FIELDS = (*NUMBERS, *LISTS)
MAX_LIST = 64


def parse(data) -> dict:
    """A policy body checked field by field (FieldError names the first bad one)."""
    validation.check_fields(data, set(FIELDS))
    out: dict = {}
    for key, raw in data.items():
        if raw is None:
            continue
        if key in LISTS:
            kind = "name" if key in ("templates", "environments", "node_pools") else None
            if kind:
                out[key] = validation.names(raw, key, "name", MAX_LIST)
            else:  # GPU models are product names ("NVIDIA H100 80GB HBM3")
                if not isinstance(raw, list) or len(raw) > MAX_LIST:
                    raise FieldError(key, f"must be a list of at most {MAX_LIST} GPU model names")
                out[key] = [validation.text(m, key, 128, empty=False) for m in raw]
        else:
            lo, hi, integer, unit = NUMBERS[key]
            out[key] = validation.number(raw, key, lo, hi, integer, unit)
    for r in RESOURCES:
        d, m = out.get(f"{r}_default"), out.get(f"{r}_max")
        if d is not None and m is not None and d > m:
            raise FieldError(f"{r}_default", f"must be at most {r}_max ({m:g}), got {d:g}")
    return out


@dataclass(frozen=True)
class Effective:
    """The merge of a department's and a project's policies: per key, (value, whose)."""

    values: dict = field(default_factory=dict)

    def get(self, key: str):
        v = self.values.get(key)
        return None if v is None else v[0]

    def whose(self, key: str) -> str:
        return self.values[key][1]

    def max(self, resource: str):
        return self.get(f"{resource}_max")

    def default(self, resource: str):
        return self.get(f"{resource}_default")

    def allowed(self, key: str) -> list | None:
        return self.get(key)

    def check_max(self, field_name: str, resource: str, value: float) -> None:
        most = self.max(resource)
        if most is not None and value > most + 1e-9:
            raise FieldError(field_name, f"{self.whose(f'{resource}_max')} allows at most "
                             f"{most:g}, got {value:g}")

    def check_in(self, field_name: str, key: str, value: str) -> None:
        allowed = self.allowed(key)
        if allowed is not None and value not in allowed:
            raise FieldError(field_name, f"{self.whose(key)} allows only "
                             f"{', '.join(allowed) or '(none)'}, got {validation.show(value)}")

    def runtime_s(self, kind: str) -> int | None:
        return self.get(f"max_runtime_{kind}_s")

    def idle_s(self, kind: str) -> int | None:
        return self.get(f"idle_timeout_{kind}_s")

    def to_dict(self) -> dict:
        return {k: {"value": v, "policy": w} for k, (v, w) in self.values.items()}


def _label(scope: str, name: str) -> str:
    return f"{scope} {name}'s policy"


def _narrower(key: str, mine, theirs) -> bool:
    if key in LISTS:
        return set(mine) <= set(theirs)
    if key.endswith("_default"):
        return True  # a default is checked against the merged max
    return mine <= theirs


def effective(dept: str | None, dept_policy: dict, project: str | None,
              project_policy: dict) -> Effective:
    """A project's own value where it narrows its department's, the department's otherwise
    (a department narrowed after the project was set still binds it)."""
    values: dict = {k: (v, _label("department", dept or "")) for k, v in dept_policy.items()}
    for k, v in project_policy.items():
        if k not in values or _narrower(k, v, values[k][0]):
            values[k] = (v, _label("project", project or ""))
    for r in RESOURCES:  # a default above the merged max is no default
        d, m = values.get(f"{r}_default"), values.get(f"{r}_max")
        if d is not None and m is not None and d[0] > m[0]:
            values[f"{r}_default"] = (m[0], m[1])
    return Effective(values)


def check_narrows(dept: str, dept_policy: dict, project_policy: dict) -> None:
    """A project's policy may only narrow its department's: 400 naming the field."""
    for k, v in project_policy.items():
        if k not in dept_policy or k.endswith("_default"):
            continue
        if not _narrower(k, v, dept_policy[k]):
            theirs = dept_policy[k]
            shown = ", ".join(theirs) if k in LISTS else f"at most {theirs:g}"
            got = ", ".join(v) if k in LISTS else f"{v:g}"
            raise FieldError(k, f"{_label('department', dept)} allows {shown}; a project's "
                             f"policy can only narrow it, got {got}")


# -- storage --------------------------------------------------------------------------------
def _row(s, scope: str, name: str) -> PolicyRow | None:
    return s.get(PolicyRow, (scope, name))


def stored(s, scope: str, name: str) -> dict:
    row = _row(s, scope, name)
    return dict(row.spec) if row is not None else {}


def for_project(s, project: str) -> Effective:
    p = s.get(ProjectRow, project)
    if p is None:
        return Effective()
    return effective(p.department, stored(s, "department", p.department), project,
                     stored(s, "project", project))


def all_effective(s, projects) -> dict[str, Effective]:
    rows = {(r.scope, r.name): r.spec for r in s.scalars(select(PolicyRow))}
    depts = {p.name: p.department for p in s.scalars(select(ProjectRow))}
    out = {}
    for p in projects:
        d = depts.get(p)
        out[p] = effective(d, dict(rows.get(("department", d), {})), p,
                           dict(rows.get(("project", p), {})))
    return out


def show(s, scope: str, name: str) -> dict:
    _exists(s, scope, name)
    out = {"scope": scope, "name": name, "policy": stored(s, scope, name)}
    if scope == "project":
        out["effective"] = for_project(s, name).to_dict()
    return out


def _exists(s, scope: str, name: str) -> None:
    model = DepartmentRow if scope == "department" else ProjectRow
    if s.get(model, name) is None:
        raise NotFound(f"{scope} {name!r} does not exist")


def put(s, scope: str, name: str, data, actor: str) -> dict:
    """Replace a policy (an empty body clears it); audited as policy.updated."""
    _exists(s, scope, name)
    spec = parse(data)
    if scope == "project":
        dept = s.get(ProjectRow, name).department
        check_narrows(dept, stored(s, "department", dept), spec)
        for r in RESOURCES:
            d = spec.get(f"{r}_default")
            most = effective(dept, stored(s, "department", dept), name, spec).max(r)
            if d is not None and most is not None and d > most:
                raise FieldError(f"{r}_default", f"must be at most the policy's {r}_max "
                                 f"({most:g}), got {d:g}")
    before = stored(s, scope, name)
    row = _row(s, scope, name)
    if row is None:
        s.add(PolicyRow(scope=scope, name=name, spec=spec))
    else:
        row.spec = spec
    project = name if scope == "project" else ""
    audit.record(s, actor, "policy.updated", f"{scope}/{name}",
                 {"before": before, "after": spec}, project)
    return {"scope": scope, "name": name, "policy": spec}


def delete_for(s, scope: str, name: str) -> None:
    """Drop the policy of a department or project that is deleted."""
    row = _row(s, scope, name)
    if row is not None:
        s.delete(row)
