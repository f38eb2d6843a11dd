"""Policies per department and project (hub_ext.policy).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policies",
        sa.Column("scope", sa.String(16), primary_key=True, nullable=False),
        sa.Column("name", sa.String(63), primary_key=True, nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("policies")
