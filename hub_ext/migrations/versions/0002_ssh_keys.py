"""The SSH public keys users upload for the SSH gateway (``PUT /me/ssh-keys``).

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
        "ssh_keys",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("keys", sa.JSON, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ssh_keys")
