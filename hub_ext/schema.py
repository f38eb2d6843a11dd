"""Every table of gpupool's database, and the one place a database is opened.

The table modules declare their rows on ``db.Base``; importing them here (and nowhere in
``db``) registers each table before ``create_all``, so ``db`` depends on no feature.
"""

from __future__ import annotations

from sqlalchemy.orm import sessionmaker

from . import audit, credentials, datasources, roles  # noqa: F401  (their tables)
from .db import Base, add_new_columns, make_engine
from .inference import db as inference_db  # noqa: F401  (inference_services)
from .training import db as training_db  # noqa: F401  (trainings)


def make_sessionmaker(url: str) -> sessionmaker:
    """A session factory on ``url`` with every table present (a database from an earlier
    release keeps its rows and gains the nullable columns added since)."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    add_new_columns(engine)
    return sessionmaker(engine, expire_on_commit=False)


__all__ = ["make_sessionmaker"]
