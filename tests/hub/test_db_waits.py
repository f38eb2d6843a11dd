"""A project write waiting for the database blocks no other request: the service runs it
off its event loop, SQLite's busy timeout makes it wait for another writer instead of
failing with "database is locked", and WAL lets reads go on meanwhile. The service's real
tornado application with its test login; another connection holds the write lock."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from tornado.httpclient import AsyncHTTPClient

from hub_ext.config import Gpupool
from hub_ext.org import projects as org
from hub_ext.org.roles import ADMIN_SCOPE
from hub_ext.schema import make_sessionmaker
from hub_ext.service.app import make_app
from tests.served import served

PREFIX = "/services/gpupool/"
MEMBERS = [f"user{i:04d}" for i in range(5000)]


def test_a_project_write_waiting_for_the_database_blocks_no_other_request(tmp_path, monkeypatch):
    db = tmp_path / "gpupool.sqlite"
    Session = make_sessionmaker(f"sqlite:///{db}")
    with Session() as s:
        org.create_department(s, {"name": "lab", "gpus": 1})
        org.create_project(s, {"name": "big", "department": "lab", "members": ["alice"]})
        s.commit()
    cfg = Gpupool(state_dir=str(tmp_path / "state"), db_url=f"sqlite:///{db}")
    app = make_app(cfg, PREFIX, Session, user_for_tests={"name": "admin", "scopes": [ADMIN_SCOPE]})

    async def run():
        http = AsyncHTTPClient()
        async with served(app) as root:
            url = f"{root}{PREFIX}api/v1"
            holder = sqlite3.connect(db, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            try:
                patch = asyncio.ensure_future(http.fetch(
                    url + "/projects/big", method="PATCH", body=json.dumps({"members": MEMBERS}),
                    raise_error=False, request_timeout=60))
                while not app.settings.get("_patch_started"):  # until the write is under way
                    if patch.done():
                        break
                    await asyncio.sleep(0.05)
                me = await http.fetch(url + "/me", raise_error=False, request_timeout=20)
                waiting = not patch.done()
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            done = await patch
        return me, waiting, done

    started = org.update_project

    def update_project(s, name, data, actor=""):
        app.settings["_patch_started"] = True
        return started(s, name, data, actor)

    monkeypatch.setattr(org, "update_project", update_project)
    me, waiting, done = asyncio.run(run())
    assert me.code == 200 and json.loads(me.body)["name"] == "admin"
    assert waiting  # answered while the project write still waited for the lock
    assert done.code == 200, done.body
    assert len(json.loads(done.body)["members"]) == len(MEMBERS)
