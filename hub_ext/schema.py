"""Every table of gpupool's database, and the one place a database is opened and its
schema brought up to date.

The table modules declare their rows on ``db.Base``; importing them here (and nowhere in
``db``) registers each table, so ``db`` depends on no feature. Tables are made and changed
only by the Alembic revisions in ``hub_ext/migrations/versions`` (see
docs/decisions/0017-alembic-migrations.md); a test checks that the newest revision matches
these models.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.orm import sessionmaker

from .attachments import credentials, datasources  # noqa: F401  (their tables)
from .db import audit  # noqa: F401  (its table)
from .db.tables import Base, make_engine
from .org import roles, sshkeys  # noqa: F401  (their tables)
from .serving import db as inference_db  # noqa: F401  (inference_services)
from .training import db as training_db  # noqa: F401  (trainings)

metadata = Base.metadata
MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(connection=None) -> Config:
    """Alembic's configuration without an ini file: the scripts shipped in the package,
    run on ``connection``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _migration_lock(url: str):
    """The hub and its service open the same SQLite file at start: one upgrades while the
    other waits on a lock file beside the database, then finds it at head."""
    db = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if db in ("", ":memory:"):  # in-memory SQLite (one process) or a server database
        yield
        return
    with open(f"{db}.migrate-lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def upgrade(engine) -> None:
    """Bring the database on ``engine`` to the newest revision (a database from an earlier
    release keeps all its rows)."""
    with _migration_lock(engine.url.render_as_string(hide_password=False)), engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")


def make_sessionmaker(url: str) -> sessionmaker:
    """A session factory on ``url``, its schema upgraded to the newest revision."""
    engine = make_engine(url)
    upgrade(engine)
    return sessionmaker(engine, expire_on_commit=False)


__all__ = ["MIGRATIONS", "alembic_config", "make_sessionmaker", "metadata", "upgrade"]
