"""What else keeps a project from being deleted: a feature whose rows belong to a project
registers a check here when its table is defined (inference services: hub_ext.serving.db),
so the organisation store reads no feature's table. ``delete_project`` refuses while any
check names a row."""

from __future__ import annotations

from collections.abc import Callable

# check(session, project) -> (what the rows are, their names in order); no names: none left
Check = Callable[[object, str], tuple[str, list[str]]]
_checks: list[Check] = []


def project_holds(check: Check) -> Check:
    """Register ``check`` (a decorator)."""
    _checks.append(check)
    return check


def holding(s, project: str) -> list[tuple[str, list[str]]]:
    """Each registered check's rows of ``project`` that keep it, where there are any."""
    return [(what, names) for what, names in (check(s, project) for check in _checks) if names]


__all__ = ["Check", "holding", "project_holds"]
