"""The training REST API on the service's real tornado application (login replaced by a
header), with the job runner of the hub process picking up what the API writes. Every
response is checked against the OpenAPI document."""

import asyncio
import json
import sys

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from hub_ext.api import base
from hub_ext.config import Gpupool
from hub_ext.service.app import make_app
from tests.hub.openapi_check import validate

from .harness import Cluster

PREFIX = "/services/gpupool/"


@pytest.fixture
def fake_login(monkeypatch):
    def current_user(self):
        name = self.request.headers.get("X-User") or \
            self.request.headers.get("Authorization", "").removeprefix("token ")
        if not name:
            return None
        scopes = [base.ADMIN] if name == "admin" else [base.USE]
        return {"name": name, "scopes": scopes}

    monkeypatch.setattr(base.BaseHandler, "get_current_user", current_user)


class Api:
    def __init__(self, port):
        self.url = f"http://127.0.0.1:{port}{PREFIX}api/v1"

    async def __call__(self, method, path, body=None, user="alice", expect=None):
        kw = {"method": method, "headers": {"X-User": user}, "raise_error": False}
        if body is not None:
            kw["body"] = body if isinstance(body, bytes) else json.dumps(body)
        elif method == "POST":
            kw["body"] = ""
        r = await AsyncHTTPClient().fetch(self.url + path, **kw)
        data = json.loads(r.body) if r.body else None
        validate(method, path, r.code, data)
        if expect is not None:
            assert r.code == expect, (r.code, data)
        return r.code, data


def serve(c: Cluster):
    cfg = Gpupool(state_dir=str(c.tmp / "state"), db_url=f"sqlite:///{c.tmp / 'gpupool.sqlite'}")
    app = make_app(cfg, PREFIX, c.Session)
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    return server, Api(sockets[0].getsockname()[1])


def test_submit_describe_logs_suspend_resume_delete(tmp_path, fake_login):
    job = {"name": "hello", "project": "research", "gpu": 0.5, "workers": 2,
           "command": [sys.executable, "-c", ("import os, time; print('rank', os.environ['RANK'], "
                       "os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'], flush=True); time.sleep(60)")],
           "grace_period_s": 5}

    async def run():
        async with Cluster(tmp_path, gpus=2) as c:
            server, api = serve(c)
            try:
                code, t = await api("POST", "/trainings", job, expect=201)
                assert t["status"] == "Pending" and t["workers"] == 2
                await api("POST", "/trainings", job, expect=409)
                await c.wait_for("hello", "Running")
                _, items = await api("GET", "/trainings?project=research", expect=200)
                assert [i["name"] for i in items["items"]] == ["hello"]
                _, items = await api("GET", "/trainings", user="dave", expect=200)
                assert items["items"] == []
                # another project's job: denied with the reason (403), not hidden as a 404
                _, err = await api("GET", "/trainings/hello", user="dave", expect=403)
                assert "not a member" in err["error"]["message"], err
                for _ in range(100):
                    _, logs = await api("GET", "/trainings/hello/logs?rank=1", expect=200)
                    if any(ln.startswith("rank") for ln in logs["lines"]):
                        break
                    await asyncio.sleep(0.05)
                assert any(ln.startswith("rank 1 2 ") for ln in logs["lines"]), logs
                await api("GET", "/trainings/hello/logs?rank=2", expect=400)
                await api("POST", "/trainings/hello/resume", expect=409)
                await api("POST", "/trainings/hello/suspend", user="bob", expect=403)
                await api("POST", "/trainings/hello/suspend", expect=202)
                await c.wait_for("hello", "Suspended")
                await api("POST", "/trainings/hello/resume", expect=202)
                await c.wait_for("hello", "Running")
                _, d = await api("GET", "/trainings/hello", expect=200)
                kinds = [e["kind"] for e in d["events"]]
                assert "suspended" in kinds and "resumed" in kinds
                assert [s["status"] for s in d["transitions"]][:2] == ["Pending", "Running"]
                await api("DELETE", "/trainings/hello", expect=202)
                for _ in range(200):
                    if c.job("hello") is None:
                        break
                    await asyncio.sleep(0.05)
                assert c.job("hello") is None
                await api("GET", "/trainings/hello", expect=404)
            finally:
                server.stop()

    asyncio.run(run())


@pytest.mark.parametrize("body, field", [
    ({"project": "research", "command": ["x"]}, "name"),
    ({"name": "Bad_Name", "command": ["x"]}, "name"),
    ({"name": "j", "command": []}, "command"),
    ({"name": "j", "command": ["x"], "project": "nope"}, "project"),
    ({"name": "j", "command": ["x"], "gpu": 0.33}, "gpu"),
    ({"name": "j", "command": ["x"], "gpu": 5}, "gpu"),
    ({"name": "j", "command": ["x"], "gpu": 1.5}, "gpu"),
    ({"name": "j", "command": ["x"], "gpu_memory": "lots"}, "gpu_memory"),
    ({"name": "j", "command": ["x"], "gpu_memory": "900GiB"}, "gpu_memory"),
    ({"name": "j", "command": ["x"], "gpu_memory": "20GiB", "gpu": 1}, "gpu"),
    ({"name": "j", "command": ["x"], "workers": 0}, "workers"),
    ({"name": "j", "command": ["x"], "workers": 2.5}, "workers"),
    ({"name": "j", "command": ["x"], "grace_period_s": -1}, "grace_period_s"),
    ({"name": "j", "command": ["x"], "restart_policy": "Always"}, "restart_policy"),
    ({"name": "j", "command": ["x"], "backoff_limit": 1000}, "backoff_limit"),
    ({"name": "j", "command": ["x"], "checkpoint_dir": "relative/dir"}, "checkpoint_dir"),
    ({"name": "j", "command": ["x"], "preemptible": "maybe"}, "preemptible"),
    ({"name": "j", "command": ["x"], "env": {"1BAD": "x"}}, "env"),
    ({"name": "j", "command": ["x"], "colour": "red"}, "colour"),
    (b"{not json", "body"),
])
def test_bad_input_is_400_naming_the_field(tmp_path, fake_login, body, field):
    async def run():
        async with Cluster(tmp_path, gpus=2) as c:
            server, api = serve(c)
            try:
                _, data = await api("POST", "/trainings", body, expect=400)
                return data
            finally:
                server.stop()

    data = asyncio.run(run())
    assert data["error"]["field"] == field, data
    assert "Traceback" not in data["error"]["message"]


def test_cli_training_commands(tmp_path, fake_login, capsys):
    from hub_ext import cli

    async def run():
        async with Cluster(tmp_path, gpus=1) as c:
            server, api = serve(c)
            base_url = api.url.split("/services/")[0]

            def gp(*argv):
                return cli.main(["--url", base_url, "--token", "alice", "training", *argv])

            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, gp, "submit", "cli-job", "--project", "research", "--gpu", "0.5",
                                           "--grace-period", "5", "-e", "GREETING=hi", "--",
                                           sys.executable, "-c", "import os; print(os.environ['GREETING'])")
                await c.wait_for("cli-job", "Succeeded")
                await loop.run_in_executor(None, gp, "list")
                await loop.run_in_executor(None, gp, "describe", "cli-job")
                await loop.run_in_executor(None, gp, "logs", "cli-job")
                with pytest.raises(SystemExit) as bad:
                    await loop.run_in_executor(None, gp, "submit", "cli-bad", "--workers", "0", "--", "true")
                await loop.run_in_executor(None, gp, "delete", "cli-job")
                return str(bad.value)
            finally:
                server.stop()

    bad = asyncio.run(run())
    out = capsys.readouterr().out
    assert "cli-job: Pending in project research (0.5 GPU)" in out
    assert "Succeeded" in out and "Transitions:" in out and "hi" in out.splitlines()
    assert bad.startswith("gpupool: workers: must be from 1 to 64") and "HTTP 400" in bad
