"""Baseline: the tables of release 0172b19.

A database made by that release has no ``alembic_version`` table and may lack the tables
its features created on first use (role_assignments, trainings, inference_services) and
the nullable columns earlier releases added at start. So this revision creates each table
that is missing, adds each missing nullable column and each missing index, and leaves
every row in place; on an empty database it simply creates everything.

The tables are written out here, not imported from the models, so that later model
changes (each with its own revision) do not change what this revision does.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

S = sa.String
md = sa.MetaData()


def _t(name: str, *cols) -> sa.Table:
    return sa.Table(name, md, *cols)


def _c(name: str, type_, primary_key: bool = False, nullable: bool = False, index: bool = False,
       fk: str | None = None, ondelete: str | None = None) -> sa.Column:
    args = [sa.ForeignKey(fk, ondelete=ondelete)] if fk else []
    return sa.Column(name, type_, *args, primary_key=primary_key, nullable=nullable, index=index)


TABLES = [
    _t("departments", _c("name", S(63), True), _c("gpus", sa.Float), _c("over_quota_weight", sa.Float),
       _c("limit", sa.Float, nullable=True)),
    _t("projects", _c("name", S(63), True), _c("department", S(63), index=True, fk="departments.name"),
       _c("gpus", sa.Float), _c("over_quota_weight", sa.Float), _c("limit", sa.Float, nullable=True)),
    _t("members", _c("project", S(63), True, fk="projects.name", ondelete="CASCADE"),
       _c("user", S(255), True, index=True)),
    _t("nodes", _c("name", S(255), True), _c("pool", S(63)), _c("gpus", sa.JSON), _c("cpu_milli", sa.Integer),
       _c("memory_mib", sa.Integer), _c("source", S(16))),
    _t("workloads", _c("name", S(255), True), _c("owner", S(255), index=True), _c("project", S(63), index=True),
       _c("kind", S(16)), _c("spec", sa.JSON), _c("state", S(16), index=True), _c("placement", sa.JSON),
       _c("over_quota", sa.Boolean), _c("reason", sa.Text), _c("queue_position", sa.Integer),
       _c("submit_time", sa.Float), _c("start_time", sa.Float, nullable=True),
       _c("pid", sa.Integer, nullable=True), _c("server", S(255))),
    _t("events", _c("id", sa.Integer, True), _c("ts", sa.Float, index=True), _c("kind", S(32)),
       _c("workload", S(255), index=True), _c("project", S(63), index=True), _c("message", sa.Text),
       _c("user", S(255), nullable=True, index=True), _c("department", S(63), nullable=True),
       _c("gpus", sa.Float, nullable=True), _c("placement", sa.JSON, nullable=True)),
    _t("samples", _c("ts", sa.Float, True), _c("capacity_milli", sa.Integer), _c("allocated_milli", sa.Integer),
       _c("utilization_pct", sa.Float, nullable=True)),
    _t("gpu_samples", _c("ts", sa.Float, True), _c("node", S(255), True), _c("gpu_index", sa.Integer, True),
       _c("utilization_pct", sa.Float)),
    _t("meta", _c("key", S(63), True), _c("value", sa.Text)),
    _t("role_assignments", _c("user", S(255), True, index=True), _c("role", S(32), True),
       _c("department", S(63), True), _c("source", S(16))),
    _t("audit_log", _c("id", sa.Integer, True), _c("ts", sa.Float, index=True), _c("actor", S(255), index=True),
       _c("action", S(63), index=True), _c("project", S(63), index=True), _c("target", S(255)),
       _c("details", sa.JSON)),
    _t("credentials", _c("project", S(63), True, fk="projects.name", ondelete="CASCADE"),
       _c("name", S(50), True), _c("delivery", S(8)), _c("keys", sa.JSON), _c("sealed", sa.Text),
       _c("description", sa.Text), _c("created_by", S(255)), _c("created", sa.Float), _c("updated", sa.Float)),
    _t("data_sources", _c("project", S(63), True, fk="projects.name", ondelete="CASCADE"),
       _c("name", S(50), True), _c("kind", S(16)), _c("spec", sa.JSON), _c("mount_path", sa.Text),
       _c("read_only", sa.Boolean), _c("description", sa.Text), _c("created_by", S(255)),
       _c("created", sa.Float)),
    _t("trainings", _c("name", S(63), True), _c("owner", S(255), index=True), _c("project", S(63), index=True),
       _c("spec", sa.JSON), _c("status", S(16), index=True), _c("reason", sa.Text), _c("request", S(16)),
       _c("attempt", sa.Integer), _c("failures", sa.Integer), _c("preemptions", sa.Integer),
       _c("created", sa.Float), _c("updated", sa.Float), _c("transitions", sa.JSON)),
    _t("inference_services", _c("name", S(63), True), _c("owner", S(255), index=True),
       _c("project", S(63), index=True), _c("spec", sa.JSON), _c("created", sa.Float), _c("status", sa.JSON)),
]


def upgrade() -> None:
    bind = op.get_bind()
    have = sa.inspect(bind)
    for table in md.sorted_tables:
        if not have.has_table(table.name):
            table.create(bind)
            continue
        present = {c["name"] for c in have.get_columns(table.name)}
        for col in table.columns:
            if col.name in present:
                continue
            if not col.nullable:  # no release made such a table without this column
                raise RuntimeError(f"table {table.name} lacks the required column {col.name}")
            op.add_column(table.name, sa.Column(col.name, col.type, nullable=True))
        indexes = {i["name"] for i in have.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)


def downgrade() -> None:
    for table in reversed(md.sorted_tables):
        op.drop_table(table.name)
