"""Policies per department and project (hub_ext.policy), and CPU and memory quotas of
departments and projects (nullable columns: none set).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policies",
        sa.Column("scope", sa.String(16), primary_key=True, nullable=False),
        sa.Column("name", sa.String(63), primary_key=True, nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
    )
    for table in ("departments", "projects"):
        op.add_column(table, sa.Column("cpu_quota", sa.Float(), nullable=True))
        op.add_column(table, sa.Column("memory_quota_gib", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("departments", "projects"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("memory_quota_gib")
            batch.drop_column("cpu_quota")
    op.drop_table("policies")
