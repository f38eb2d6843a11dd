"""Why a training's control request was asked when not by a user (a policy's idle timeout
or maximum runtime): the status reason the job shows once suspended.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trainings", sa.Column("request_reason", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("trainings") as batch:
        batch.drop_column("request_reason")
