"""The /inferences REST API on the service's real tornado application (login replaced by
a header, as in tests/training), checked against the OpenAPI document; and the hub side
that follows the table: services appear in the controller and describe shows why a
replica waits."""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from hub_ext.api import base
from hub_ext.config import Gpupool
from hub_ext.host.accounts import Accounts, default_mode
from hub_ext.host.process import Launcher
from hub_ext.org import projects as org
from hub_ext.requests.store import DbStore
from hub_ext.schema import make_sessionmaker
from hub_ext.service.app import make_app
from hub_ext.serving.embedded import EmbeddedBackend
from hub_ext.serving.hub import HubInference
from scheduler.embedded.adapter import EmbeddedScheduler
from scheduler.model import GPU, Node
from tests.hub.openapi_check import validate

from .harness import MODEL_SERVER, until
from .harness import PREFIX as ACCOUNT_PREFIX

PREFIX = "/services/gpupool/"


@pytest.fixture
def fake_login(monkeypatch):
    def current_user(self):
        name = self.request.headers.get("X-User")
        if not name:
            return None
        return {"name": name, "scopes": [base.ADMIN] if name == "admin" else [base.USE]}

    monkeypatch.setattr(base.BaseHandler, "get_current_user", current_user)


def org_db(tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'gpupool.sqlite'}")
    with Session() as s:
        org.create_department(s, {"name": "lab", "gpus": 1})
        org.create_project(s, {"name": "serve", "department": "lab", "gpus": 0.5,
                               "members": ["alice"]})
        org.create_project(s, {"name": "other", "department": "lab", "gpus": 0.5,
                               "members": ["bob"]})
        s.commit()
    return Session


def test_submit_list_describe_delete_and_errors(tmp_path, fake_login, monkeypatch):
    """No activator runs here: a submission answers with an empty state at once."""
    from hub_ext.api import inference as api

    monkeypatch.setattr(api, "PICKUP_S", 0.0)
    Session = org_db(tmp_path)
    cfg = Gpupool(state_dir=str(tmp_path / "state"), db_url=f"sqlite:///{tmp_path / 'gpupool.sqlite'}")

    async def main():
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(make_app(cfg, PREFIX, Session))
        server.add_sockets(sockets)
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}api/v1"

        async def call(method, path, body=None, user="alice"):
            kw = {"method": method, "headers": {"X-User": user}, "raise_error": False}
            if body is not None:
                kw["body"] = json.dumps(body)
            r = await AsyncHTTPClient().fetch(url + path, **kw)
            data = json.loads(r.body) if r.body else None
            validate(method, path, r.code, data)
            return r.code, data

        spec = {"name": "llm", "project": "serve", "command": ["python", "serve.py"],
                "gpu": 0.25, "max_replicas": 2, "target": 5}
        code, svc = await call("POST", "/inferences", spec)
        assert code == 201 and svc["url"].endswith("/llm/") and svc["owner"] == "alice"
        assert svc["status"] == {}
        assert (await call("POST", "/inferences", spec))[0] == 409
        code, err = await call("POST", "/inferences", {**spec, "name": "x", "max_replicas": 500})
        assert code == 400 and err["error"]["field"] == "max_replicas"
        assert "from 1 to 100" in err["error"]["message"]
        code, err = await call("POST", "/inferences", {**spec, "name": "y", "project": "other"})
        assert code == 403 and "not a member" in err["error"]["message"]  # bob's project
        code, err = await call("POST", "/inferences", {**spec, "name": "y", "project": "nope"})
        assert code == 400 and err["error"]["field"] == "project"
        code, listing = await call("GET", "/inferences")
        assert [s["name"] for s in listing["items"]] == ["llm"]
        assert (await call("GET", "/inferences", user="bob"))[1]["items"] == []
        assert (await call("GET", "/inferences/llm", user="bob"))[0] == 403
        code, one = await call("GET", "/inferences/llm")
        assert code == 200 and one["spec"]["max_replicas"] == 2
        assert (await call("DELETE", "/inferences/llm", user="bob"))[0] == 403
        assert (await call("DELETE", "/inferences/llm"))[0] == 204
        assert (await call("GET", "/inferences/llm"))[0] == 404
        server.stop()

    asyncio.run(main())


def test_hub_follows_the_table_and_describe_shows_why_a_replica_waits(tmp_path):
    Session = org_db(tmp_path)

    async def main():
        nodes = [Node("local", [GPU(0, "H100", 81920)])]
        store = DbStore(Session)
        sched = EmbeddedScheduler(store, nodes, period_s=0.05)
        sched.start()
        cfg = Gpupool(state_dir=str(tmp_path / "state"))
        replicas = EmbeddedBackend(sched, launcher=Launcher(tmp_path / "state" / "run"),
                                   accounts=Accounts(mode=default_mode(), prefix=ACCOUNT_PREFIX),
                                   state_dir=tmp_path / "state" / "inference", rows=store,
                                   preload=cfg.preload_library)
        rt = SimpleNamespace(cfg=cfg, Session=Session, backend=SimpleNamespace(replicas=lambda: replicas))
        hub = HubInference(rt, port=0, token="t")
        from hub_ext.serving.db import InferenceRow

        with Session() as s:  # what POST /inferences writes: a whole GPU over a 0.5 quota
            s.add(InferenceRow(name="big", owner="alice", project="serve", status={}, spec={
                "name": "big", "project": "serve", "gpu": 1, "min_replicas": 1,
                "command": [sys.executable, MODEL_SERVER]}))
            s.commit()
        await hub.sync()
        svc = hub.controller.services["big"]
        await until(lambda: svc.replicas and "quota" in svc.replicas[0].reason, what="a reason")
        await hub.sync()
        with Session() as s:
            status = s.get(InferenceRow, "big").status
        assert status["replica_list"][0]["state"] == "pending"
        assert "quota" in status["replica_list"][0]["reason"]
        with Session() as s:  # DELETE /inferences/big
            s.delete(s.get(InferenceRow, "big"))
            s.commit()
        await hub.sync()
        assert "big" not in hub.controller.services
        assert not [n for n in sched.snapshot.workloads if n.startswith("big-")]
        await sched.stop()

    asyncio.run(main())


def test_a_project_with_inference_services_is_not_deleted(tmp_path):
    """The organisation store refuses while a project has services (the check inference
    registers with it), and deletes the project once they are gone."""
    from hub_ext.serving.db import InferenceRow

    Session = org_db(tmp_path)
    with Session() as s:
        s.add(InferenceRow(name="chat", owner="alice", project="serve", status={}, spec={}))
        s.commit()
        with pytest.raises(org.Conflict, match=r"project 'serve' has 1 inference services: chat; delete"):
            org.delete_project(s, "serve")
        s.rollback()
        s.delete(s.get(InferenceRow, "chat"))
        org.delete_project(s, "serve")
        s.commit()
        assert "serve" not in [p["name"] for p in org.list_projects(s)]
