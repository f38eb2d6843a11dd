"""Alembic's environment for gpupool's database.

``hub_ext.schema.make_sessionmaker`` runs it with the open connection in
``config.attributes["connection"]``; the command line (``alembic -c ...``) is not used at run
time, so there is no offline mode and no logging set-up here.
"""

from __future__ import annotations

from alembic import context

from hub_ext.schema import metadata

connection = context.config.attributes["connection"]
# render_as_batch: SQLite alters a table by copying it, which a later revision needs for
# anything beyond ADD COLUMN.
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
