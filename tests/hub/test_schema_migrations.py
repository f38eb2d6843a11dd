"""The database schema has one way in: the Alembic revisions under hub_ext/migrations.

``data/schema-0172b19.sql`` is ``sqlite3 .dump`` of a database made by release 0172b19's own
code (its ``make_sessionmaker`` and ``ensure_table`` calls) with a few rows: upgrading it to
head keeps the rows and gives exactly the tables, columns, indexes and foreign keys of a
database upgraded from empty; and head matches the models, so a model change without a
revision fails here.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from hub_ext.db.tables import (
    DepartmentRow,
    EventRow,
    MemberRow,
    MetaRow,
    ProjectRow,
    WorkloadRow,
    make_engine,
)
from hub_ext.org import roles
from hub_ext.schema import alembic_config, make_sessionmaker, metadata
from hub_ext.training.db import TrainingRow

ROOT = Path(__file__).resolve().parents[2]
DUMP = Path(__file__).with_name("data") / "schema-0172b19.sql"
OPTIONAL = ("role_assignments", "trainings", "inference_services")  # made on first use by 0172b19


def head() -> str:
    (rev,) = ScriptDirectory.from_config(alembic_config()).get_heads()
    return rev


def load_dump(path: Path, *extra_sql: str) -> str:
    with sqlite3.connect(path) as conn:
        conn.executescript(DUMP.read_text())
        for sql in extra_sql:
            conn.execute(sql)
    return f"sqlite:///{path}"


def shape(url: str) -> dict:
    """Every table's columns (name, type, nullable, primary key), indexes and foreign keys."""
    insp = sa.inspect(make_engine(url))
    out = {}
    for t in insp.get_table_names():
        out[t] = {
            "columns": sorted((c["name"], str(c["type"]), c["nullable"], c["primary_key"])
                              for c in insp.get_columns(t)),
            "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                              for i in insp.get_indexes(t)),
            "foreign_keys": sorted((tuple(f["constrained_columns"]), f["referred_table"],
                                    tuple(f["referred_columns"]), str(f.get("options")))
                                   for f in insp.get_foreign_keys(t)),
        }
    return out


def version(url: str) -> list[str]:
    with make_engine(url).connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT version_num FROM alembic_version")]


def test_a_database_of_release_0172b19_upgrades_to_head_with_its_rows(tmp_path):
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    make_sessionmaker(fresh)
    url = load_dump(tmp_path / "old.sqlite")
    Session = make_sessionmaker(url)

    assert version(url) == version(fresh) == [head()]
    assert shape(url) == shape(fresh)
    assert set(shape(fresh)) == set(metadata.tables) | {"alembic_version"}
    with Session() as s:
        assert s.get(DepartmentRow, "research").gpus == 4.0
        assert s.get(ProjectRow, "nlp").department == "research"
        assert s.get(MemberRow, ("nlp", "alice")) is not None
        w = s.get(WorkloadRow, "alice-ws")
        assert (w.owner, w.state, w.spec) == ("alice", "stopped", {"gpus": 1})
        ev = s.scalars(sa.select(EventRow)).one()
        assert (ev.kind, ev.user, ev.department, ev.gpus) == ("submitted", "alice", "research", 1.0)
        assert s.get(MetaRow, "version").value == "3"
        assert s.get(roles.RoleRow, ("bob", "viewer", "research")).source == "api"
        assert s.get(TrainingRow, "bert").status == "Succeeded"


def test_missing_optional_tables_and_columns_are_added_and_rows_kept(tmp_path):
    """0172b19 made role_assignments, trainings and inference_services on first use, and
    earlier releases lacked nullable event columns: a database without them upgrades too."""
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    make_sessionmaker(fresh)
    url = load_dump(tmp_path / "old.sqlite", *(f"DROP TABLE {t}" for t in OPTIONAL),
                    "ALTER TABLE events DROP COLUMN placement", "ALTER TABLE events DROP COLUMN gpus",
                    "DROP INDEX ix_workloads_state")
    assert not set(OPTIONAL) & set(sa.inspect(make_engine(url)).get_table_names())

    Session = make_sessionmaker(url)
    assert shape(url) == shape(fresh)
    with Session() as s:
        ev = s.scalars(sa.select(EventRow)).one()
        assert (ev.message, ev.user, ev.gpus, ev.placement) == ("alice submitted alice-ws", "alice", None, None)
        s.add(roles.RoleRow(user="carol", role="viewer", department="*"))
        s.commit()


def test_head_matches_the_models():
    """Alembic's autogenerate finds nothing to do on a database at head: every model change
    comes with its revision."""
    engine = make_sessionmaker("sqlite://").kw["bind"]
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []

        # ... and the comparison does see a model that has moved on without a revision.
        moved = sa.MetaData()
        for t in metadata.sorted_tables:
            t.to_metadata(moved)
        moved.tables["nodes"].append_column(sa.Column("added", sa.Integer, nullable=True))
        diffs = compare_metadata(MigrationContext.configure(conn), moved)
        assert [(d[0], d[2], d[3].name) for d in diffs] == [("add_column", "nodes", "added")]


def test_the_hub_and_its_service_upgrade_one_database_at_once(tmp_path):
    """Two processes open the same new file together: one upgrades, the other waits on the
    lock and finds it at head; both start."""
    url = f"sqlite:///{tmp_path / 'gpupool.sqlite'}"
    code = f"from hub_ext.schema import make_sessionmaker; make_sessionmaker({url!r}); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [(p.returncode, out.strip()) for p, (out, _) in zip(procs, results)] == [(0, "ok")] * 3, results
    assert version(url) == [head()]
