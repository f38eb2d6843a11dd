"""Every exception class gpupool defines derives from ``gpupool.errors.GpupoolError`` and
still from the built-in class its callers catch."""

from __future__ import annotations

import ast
import builtins
import importlib

import pytest

from gpupool.errors import GpupoolError
from tests.test_import_graph import PACKAGES, ROOT, modules


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every top-level class deriving, through any classes of the
    packages, from a built-in exception (found by name, without importing the modules)."""
    classes = []
    for name, path in modules(ROOT, PACKAGES).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes.append((name, node.name, [ast.unparse(b).rpartition(".")[2] for b in node.bases]))
    errors = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    errors.add("GpupoolError")
    found: set[tuple[str, str]] = set()
    while True:
        more = {(m, c) for m, c, bases in classes if set(bases) & errors} - found
        if not more:
            return sorted(found - {("gpupool.errors", "GpupoolError")})
        found |= more
        errors |= {c for _, c in more}


CLASSES = exception_classes()


def test_the_errors_are_found():
    names = {c for _, c in CLASSES}
    assert {"ValidationError", "FieldError", "Forbidden", "NotFound", "CheckpointError", "Gone"} <= names


@pytest.mark.parametrize(("module", "cls"), CLASSES, ids=[f"{m}.{c}" for m, c in CLASSES])
def test_derives_from_gpupool_error(module, cls):
    err = getattr(importlib.import_module(module), cls)
    assert issubclass(err, GpupoolError), f"{module}.{cls} does not derive from GpupoolError"


def test_built_in_bases_kept():
    from gpupool.checkpoint import CheckpointError
    from hub_ext.org.projects import Conflict, NotFound
    from hub_ext.org.roles import Forbidden
    from hub_ext.validation import FieldError
    from inference.proxy import NotSent
    from scheduler.model import ValidationError

    for err, builtin in ((ValidationError, ValueError), (FieldError, ValueError), (Conflict, ValueError),
                         (NotFound, LookupError), (Forbidden, PermissionError), (NotSent, ConnectionError),
                         (CheckpointError, RuntimeError)):
        assert issubclass(err, builtin), err
    e = ValidationError("gpus", "must be at most 1000000")
    assert (e.field, str(e)) == ("gpus", "gpus: must be at most 1000000")
    with pytest.raises(GpupoolError):
        raise FieldError("name", "must match [a-z]")
