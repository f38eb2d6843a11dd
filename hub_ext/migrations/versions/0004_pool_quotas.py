"""Quotas of departments and projects per node pool other than the default one (a JSON
object: pool -> gpus, over_quota_weight, limit, cpu_quota, memory_quota_gib); the default
pool's quota stays in the rows' own columns.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("departments", "projects"):
        op.add_column(table, sa.Column("pool_quotas", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    for table in ("departments", "projects"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("pool_quotas")
