"""Look-ups shared by a project's named items (credentials, data sources): rows keyed by
(project, name), a NotFound or FieldError that names the kind of item, lists in name order."""

from __future__ import annotations

from sqlalchemy import select

from ..org.projects import NotFound
from ..validation import FieldError


class Kind:
    """One kind of named item: its table, the noun its errors use and its answer's form."""

    def __init__(self, Row, noun: str, as_dict):
        self.Row, self.noun, self.as_dict = Row, noun, as_dict

    def row(self, s, project: str, name: str):
        found = s.get(self.Row, (project, name))
        if found is None:
            raise NotFound(f"{self.noun} {name!r} does not exist in project {project!r}")
        return found

    def rows(self, s, project: str) -> list:
        Row = self.Row
        return s.scalars(select(Row).where(Row.project == project).order_by(Row.name)).all()

    def get(self, s, project: str, name: str) -> dict:
        return self.as_dict(self.row(s, project, name))

    def list_for(self, s, project: str) -> list[dict]:
        return [self.as_dict(r) for r in self.rows(s, project)]

    def names_by_project(self, s, projects) -> dict[str, list[str]]:
        Row = self.Row
        out: dict[str, list[str]] = {p: [] for p in projects}
        q = select(Row.project, Row.name).where(Row.project.in_(list(projects))).order_by(Row.name)
        for project, name in s.execute(q):
            out[project].append(name)
        return out

    def named(self, s, project: str, name: str, field_name: str):
        """The item ``name`` a workload asks for; FieldError naming ``field_name`` and the
        project's items when the project has none of that name."""
        found = s.get(self.Row, (project, name))
        if found is None:
            have = [r.name for r in self.rows(s, project)]
            raise FieldError(field_name, f"project {project!r} has no {self.noun} {name!r}; it has: "
                             f"{', '.join(have) or '(none)'}")
        return found
