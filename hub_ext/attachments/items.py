"""Look-ups shared by a project's named items (credentials, data sources): rows keyed by
(project, name), a NotFound that names the kind of item, lists in name order."""

from __future__ import annotations

from sqlalchemy import select

from ..org.projects import NotFound


def row(s, Row, noun: str, project: str, name: str):
    found = s.get(Row, (project, name))
    if found is None:
        raise NotFound(f"{noun} {name!r} does not exist in project {project!r}")
    return found


def rows(s, Row, project: str) -> list:
    return s.scalars(select(Row).where(Row.project == project).order_by(Row.name)).all()


def names_by_project(s, Row, projects) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {p: [] for p in projects}
    q = select(Row.project, Row.name).where(Row.project.in_(list(projects))).order_by(Row.name)
    for project, name in s.execute(q):
        out[project].append(name)
    return out
