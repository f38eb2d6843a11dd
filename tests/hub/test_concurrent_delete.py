"""A training the job runner removes while a request is changing it (a second DELETE, a
suspend) is a 404 saying so, never a 500: the runner deletes the row once it has carried out
a delete, so the request's write matches no row. DELETE /workloads/NAME ends the same way as
when it came first: 204, the workload is gone. The service's real tornado application
with its test login; the runner's delete is made from another session at the moment the
request has read the row."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import delete
from tornado.httpclient import AsyncHTTPClient

from hub_ext.api import base
from hub_ext.config import Gpupool
from hub_ext.db.tables import WorkloadRow
from hub_ext.org import projects as org
from hub_ext.org.roles import ADMIN_SCOPE
from hub_ext.schema import make_sessionmaker
from hub_ext.service.app import make_app
from hub_ext.training.db import TrainingRow
from tests.served import served

PREFIX = "/services/gpupool/"


def _service(tmp_path):
    """The service's real tornado application on a fresh database with one project, nlp,
    and a test login as a platform admin; and its sessions."""
    db = f"sqlite:///{tmp_path / 'gpupool.sqlite'}"
    Session = make_sessionmaker(db)
    with Session() as s:
        org.create_department(s, {"name": "lab", "gpus": 1})
        org.create_project(s, {"name": "nlp", "department": "lab", "members": ["admin"]})
        s.commit()
    cfg = Gpupool(state_dir=str(tmp_path / "state"), db_url=db)
    app = make_app(cfg, PREFIX, Session, user_for_tests={"name": "admin", "scopes": [ADMIN_SCOPE]})
    return Session, app


@pytest.mark.parametrize("method,path,code", [
    ("DELETE", "trainings/job", 404),
    ("POST", "trainings/job/suspend", 404),
    ("DELETE", "workloads/job", 204),
])
def test_a_training_removed_while_a_request_changes_it_is_never_a_500(tmp_path, monkeypatch,
                                                                       method, path, code):
    Session, app = _service(tmp_path)
    checked = base.BaseHandler.require

    def require(self, action, *args, **kwargs):
        checked(self, action, *args, **kwargs)
        if action == "manage_workload":  # the row has been read: the runner deletes it now
            with Session() as runner:
                runner.execute(delete(TrainingRow).where(TrainingRow.name == "job"))
                runner.execute(delete(WorkloadRow).where(WorkloadRow.name == "job"))
                runner.commit()

    async def run():
        http = AsyncHTTPClient()
        async with served(app) as root:
            url = f"{root}{PREFIX}api/v1/"
            made = await http.fetch(url + "trainings", method="POST", raise_error=False, body=json.dumps(
                {"name": "job", "project": "nlp", "command": ["true"], "gpu": 0}))
            assert made.code == 201, made.body
            monkeypatch.setattr(base.BaseHandler, "require", require)
            r = await http.fetch(url + path, method=method, raise_error=False,
                                 allow_nonstandard_methods=True, body=b"" if method == "POST" else None,
                                 headers={"Content-Type": "multipart/form-data"})
            after = await http.fetch(url + "trainings/job", raise_error=False)
        return r, after

    r, after = asyncio.run(run())
    assert r.code == code, r.body
    if code == 404:
        assert "removed by another request" in json.loads(r.body)["error"]["message"]
    assert after.code == 404  # the runner's delete stands


def test_a_suspend_or_resume_after_a_delete_is_a_409_and_the_delete_stands(tmp_path):
    """One request slot per job, read by the runner: a suspend that came after the delete
    and before the runner took it would replace the delete, and the deleted job would stay
    (Suspended). Refused instead; a second delete is accepted again."""
    Session, app = _service(tmp_path)

    async def run():
        http = AsyncHTTPClient()
        codes = []
        async with served(app) as root:
            url = f"{root}{PREFIX}api/v1/trainings"
            made = await http.fetch(url, method="POST", raise_error=False, body=json.dumps(
                {"name": "job", "project": "nlp", "command": ["true"], "gpu": 0}))
            assert made.code == 201, made.body
            for method, path in (("DELETE", ""), ("POST", "/suspend"), ("POST", "/resume"), ("DELETE", "")):
                r = await http.fetch(f"{url}/job{path}", method=method, raise_error=False,
                                     body=b"" if method == "POST" else None)
                codes.append((r.code, json.loads(r.body)["error"]["message"] if r.code >= 400 else ""))
        return codes

    codes = asyncio.run(run())
    assert [c for c, _ in codes] == [202, 409, 409, 202]
    assert "cannot suspend a job that is being deleted" in codes[1][1]
    with Session() as s:
        assert s.get(TrainingRow, "job").request == "delete"
