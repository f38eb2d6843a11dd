"""Admin panel pages rendered by the service's real tornado application (its test login):
the queue keeps placements apart and finished work out of Running, the Usage page shows
each running fraction's own GPU activity, and a member's 403 page names the role."""

from __future__ import annotations

import asyncio
import os
import struct
import time
import uuid

from tornado.httpclient import AsyncHTTPClient

from hub_ext.config import Gpupool
from hub_ext.db.tables import WorkloadRow
from hub_ext.host import regions
from hub_ext.org import projects as org
from hub_ext.org.roles import ADMIN_SCOPE, USE_SCOPE
from hub_ext.schema import make_sessionmaker
from hub_ext.service.app import make_app
from scheduler.contract import REGION_MAGIC as MAGIC
from tests.served import served

PREFIX = "/services/gpupool/"
TAG = uuid.uuid4().hex[:8]
TWO = [{"node": "local", "gpu_indices": [2], "gpu_milli": 1000},
       {"node": "local", "gpu_indices": [3], "gpu_milli": 1000}]
QUARTER = [{"node": "local", "gpu_indices": [0], "gpu_milli": 250}]


def _setup(tmp_path):
    db = tmp_path / "gpupool.sqlite"
    Session = make_sessionmaker(f"sqlite:///{db}")
    now = time.time()
    with Session() as s:
        org.create_department(s, {"name": "lab", "gpus": 4})
        org.create_project(s, {"name": "nlp", "department": "lab", "gpus": 4, "members": ["carol"]})
        for name, state, placement in ((f"train-{TAG}", "running", TWO), (f"done-{TAG}", "succeeded", []),
                                       (f"busy-{TAG}", "running", QUARTER), (f"idle-{TAG}", "running", QUARTER)):
            s.add(WorkloadRow(name=name, owner="carol", project="nlp", kind="training", state=state,
                              placement=placement, submit_time=now - 7200, start_time=now - 7200))
        s.commit()
    return Gpupool(state_dir=str(tmp_path / "state"), db_url=f"sqlite:///{db}"), Session


def _get(cfg, Session, user: dict, *paths: str) -> list:
    async def run():
        async with served(make_app(cfg, PREFIX, Session, user_for_tests=user)) as root:
            return [await AsyncHTTPClient().fetch(f"{root}{PREFIX}{p}", raise_error=False) for p in paths]

    return asyncio.run(run())


def _table(html: str, tid: str) -> str:
    start = html.index(f'<table id="{tid}"')
    return html[start:html.index("</table>", start)]


def test_queue_keeps_placements_apart_and_finished_work_out_of_running(tmp_path):
    cfg, Session = _setup(tmp_path)
    (r,) = _get(cfg, Session, {"name": "admin", "scopes": [ADMIN_SCOPE]}, "queue")
    html = r.body.decode()
    running, finished = _table(html, "running"), _table(html, "finished")
    assert "local GPU 2 × 1; local GPU 3 × 1" in running
    assert f"done-{TAG}" not in running and f"done-{TAG}" in finished and "succeeded" in finished


def test_usage_shows_each_fractions_own_activity(tmp_path):
    cfg, Session = _setup(tmp_path)
    busy = regions.of_state(cfg.state_dir) / f"busy-{TAG}"
    regions.create(busy, os.geteuid(), os.getegid())
    with open(busy, "wb") as f:  # what the library writes: 40 launches, 3 allocations, just now
        f.write(struct.pack("<IIQQQ", MAGIC, 0, 40, 3, int(time.time() * 1000)))
    try:
        (r,) = _get(cfg, Session, {"name": "admin", "scopes": [ADMIN_SCOPE]}, "usage")
    finally:
        os.unlink(busy)
        busy.parent.rmdir()
    table = _table(r.body.decode(), "fraction-activity")
    rows = {row.split("<td>")[1].split("</td>")[0]: row for row in table.split("<tr")[2:]}
    assert set(rows) == {f"busy-{TAG}", f"idle-{TAG}"}  # the whole-GPU training is not listed
    assert ">40<" in rows[f"busy-{TAG}"] and "(idle)" not in rows[f"busy-{TAG}"]
    assert "never" in rows[f"idle-{TAG}"] and "(idle)" in rows[f"idle-{TAG}"]


def test_a_member_gets_a_403_page_naming_the_role_and_no_link_to_it(tmp_path):
    cfg, Session = _setup(tmp_path)
    usage, audit, queue = _get(cfg, Session, {"name": "carol", "scopes": [USE_SCOPE]}, "usage", "audit", "queue")
    assert usage.code == 403 and audit.code == 403
    assert "a platform admin (custom:gpupool:admin)" in usage.body.decode()
    assert "a department admin or a platform admin" in audit.body.decode()
    nav = queue.body.decode().split("</header>")[0]
    assert "Queue" in nav and ">Usage<" not in nav and ">Audit<" not in nav
