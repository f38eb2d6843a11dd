"""The hub keeps scheduling and frees GPUs whatever is stored or fails: a bad value already in
the database leaves out its own queue and the scheduler keeps placing everyone else; a
workload that cannot start, or is stopped, or whose project is deleted, never keeps its GPUs."""

from __future__ import annotations

import http.client
import json
import sqlite3
import sys
import time

import pytest
from hubclient import HubClient, call
from hubproc import ADMIN_PW, USER_PW, Hub
from openapi_check import validate

from tests.waits import wait_for

pytestmark = pytest.mark.slow

API = "/services/gpupool/api/v1"
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture(scope="module")
def hhub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("hostile"),
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n").start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "carol")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    h.db = h.workdir / "state" / "gpupool.sqlite"
    yield h
    h.stop()


def api(hub, user, method, path, body=None, expect=None):
    status, data = call(hub.url, hub.tokens[user], method, path, body)
    validate(method, path, status, data)
    if expect is not None:
        assert status == expect, (status, data)
    return data


def sql(hub, statement: str, *args) -> None:
    """A hand edit of the hub's database, then the version bump any later write makes."""
    with sqlite3.connect(hub.db, timeout=30) as db:
        db.execute(statement, args)
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'version'")




def submit(hub, user, name, project, gpus=1, command=SLEEP):
    return api(hub, user, "POST", "/workloads", {
        "name": name, "kind": "training", "project": project, "gpu_mode": "whole", "gpus": gpus,
        "command": command}, expect=201)


def workload(hub, name, user="admin"):
    return api(hub, user, "GET", f"/workloads/{name}", expect=200)


def in_state(hub, name, *states):
    return wait_for(lambda: (w := workload(hub, name))["state"] in states and w,
                    f"{name} in {states}; it is {workload(hub, name)}")


def stop(hub, name):
    api(hub, "admin", "DELETE", f"/workloads/{name}", expect=204)
    def ended():  # one read: the row may go between two
        code, w = call(hub.url, hub.tokens["admin"], "GET", f"/workloads/{name}")
        return code == 404 or (code == 200 and w["state"] in ("stopped", "failed"))
    wait_for(ended, f"{name} stopped")


def cycles_failed(hub) -> int:
    return hub.log.read_text(errors="replace").count("scheduler cycle failed")


@pytest.mark.parametrize("column, value", [
    ("limit", 1e307),  # accepted by PATCH once; every cycle then overflowed
    ("gpus", 1e309),  # infinity (SQLite cannot keep a NaN: NOT NULL refuses it)
    ("gpus", -2.0),
    ("over_quota_weight", "lots"),  # SQLite keeps text in a REAL column
], ids=["limit-1e307", "infinite-quota", "negative-quota", "text-weight"])
def test_a_stored_bad_project_value_isolates_that_project_only(hhub, column, value):
    failed_before = cycles_failed(hhub)
    sql(hhub, f'UPDATE projects SET "{column}" = ? WHERE name = ?', value, "vision")
    try:
        submit(hhub, "alice", "iso-v", "vision")
        submit(hhub, "alice", "iso-n", "nlp")
        in_state(hhub, "iso-n", "running")
        w = wait_for(lambda: (w := workload(hhub, "iso-v"))["reason"] and w, "a reason for iso-v")
        assert w["state"] == "pending" and w["gpu_allocated"] == 0
        assert w["reason"].startswith("project vision is left out of scheduling: "), w
        assert column in w["reason"]
        events = api(hhub, "admin", "GET", "/events?kind=isolated&project=vision", expect=200)["items"]
        assert events and events[0]["message"] == w["reason"]
    finally:
        sql(hhub, "UPDATE projects SET gpus = 2, over_quota_weight = 1, \"limit\" = NULL WHERE name = 'vision'")
    in_state(hhub, "iso-v", "running")  # put right, the project is scheduled again
    assert api(hhub, "admin", "GET", "/events?kind=restored&project=vision", expect=200)["items"]
    for name in ("iso-v", "iso-n"):
        stop(hhub, name)
    assert cycles_failed(hhub) == failed_before


def test_a_stored_bad_department_value_isolates_its_projects_only(hhub):
    sql(hhub, "UPDATE departments SET gpus = ? WHERE name = 'ops'", 1e309)  # inf
    try:
        submit(hhub, "admin", "iso-s", "serving")
        submit(hhub, "alice", "iso-n2", "nlp")
        in_state(hhub, "iso-n2", "running")
        w = wait_for(lambda: (w := workload(hhub, "iso-s"))["reason"] and w, "a reason for iso-s")
        assert w["state"] == "pending"
        assert w["reason"].startswith("department ops is left out of scheduling: "), w
    finally:
        sql(hhub, "UPDATE departments SET gpus = 1 WHERE name = 'ops'")
    in_state(hhub, "iso-s", "running")
    for name in ("iso-s", "iso-n2"):
        stop(hhub, name)


def test_a_workload_whose_command_cannot_start_fails_and_frees_its_gpus(hhub):
    w = submit(hhub, "alice", "no-such-program", "nlp", gpus=2, command=["/nonexistent/train"])
    assert w["state"] == "pending"
    w = in_state(hhub, "no-such-program", "failed", "running")
    assert w["state"] == "failed" and w["gpu_allocated"] == 0, w
    assert "could not start" in w["reason"] and "/nonexistent/train" in w["reason"]
    time.sleep(2)  # a few cycles later it is still failed, holding nothing
    w = workload(hhub, "no-such-program")
    assert w["state"] == "failed" and w["placement"] == []
    assert api(hhub, "admin", "GET", "/projects/nlp", expect=200)["allocated_gpus"] == 0
    # Its 2 GPUs went back at once: another member's 3-GPU job fits under nlp's limit of 3.
    submit(hhub, "alice", "after-phantom", "nlp", gpus=3)
    in_state(hhub, "after-phantom", "running")
    stop(hhub, "after-phantom")
    api(hhub, "alice", "DELETE", "/workloads/no-such-program", expect=204)


def test_delete_ends_stopped_and_frees_the_gpus(hhub):
    submit(hhub, "alice", "to-stop", "nlp", gpus=2)
    in_state(hhub, "to-stop", "running")
    api(hhub, "alice", "DELETE", "/workloads/to-stop", expect=204)
    w = in_state(hhub, "to-stop", "stopped")
    assert w["gpu_allocated"] == 0 and w["placement"] == []
    assert api(hhub, "admin", "GET", "/projects/nlp", expect=200)["allocated_gpus"] == 0


@pytest.mark.parametrize("phase", ["running", "just-submitted"])
def test_delete_of_a_training_job_through_the_workloads_api_ends_it(hhub, phase):
    """A job of the trainings API, running or just submitted: DELETE /workloads/NAME ends it
    as DELETE /trainings/NAME does; nothing of it runs on or holds GPUs."""
    name = f"job-{phase}"
    job = {"name": name, "project": "nlp", "gpu": 1, "command": SLEEP, "grace_period_s": 5}
    api(hhub, "alice", "POST", "/trainings", job, expect=201)
    if phase == "running":
        in_state(hhub, name, "running")
    api(hhub, "alice", "DELETE", f"/workloads/{name}", expect=204)
    for path in (f"/workloads/{name}", f"/trainings/{name}"):
        wait_for(lambda path=path: call(hhub.url, hhub.tokens["alice"], "GET", path)[0] == 404,
                 f"{path} gone", timeout=20)
    assert api(hhub, "admin", "GET", "/projects/nlp", expect=200)["allocated_gpus"] == 0


def test_deleting_a_project_is_refused_while_its_work_runs(hhub):
    api(hhub, "admin", "POST", "/departments", {"name": "temp", "gpus": 1}, expect=201)
    api(hhub, "admin", "POST", "/projects", {"name": "doomed", "department": "temp", "gpus": 1,
                                              "members": ["alice"]}, expect=201)
    submit(hhub, "alice", "in-doomed", "doomed")
    in_state(hhub, "in-doomed", "running")
    status, body = call(hhub.url, hhub.tokens["admin"], "DELETE", "/projects/doomed")
    validate("DELETE", "/projects/doomed", status, body)
    assert status == 409, body
    assert "in-doomed (running)" in body["error"]["message"], body
    stop(hhub, "in-doomed")
    # An inference service scaled to zero runs nothing, but a request would start it.
    api(hhub, "alice", "POST", "/inferences", {"name": "doomed-svc", "project": "doomed", "gpu": 0.25,
                                                "command": SLEEP}, expect=201)
    status, body = call(hhub.url, hhub.tokens["admin"], "DELETE", "/projects/doomed")
    assert status == 409 and "doomed-svc" in body["error"]["message"], body
    api(hhub, "alice", "DELETE", "/inferences/doomed-svc", expect=204)
    api(hhub, "admin", "DELETE", "/projects/doomed", expect=204)
    api(hhub, "admin", "DELETE", "/departments/temp", expect=204)
    assert workload(hhub, "in-doomed")["gpu_allocated"] == 0


@pytest.mark.parametrize("method", ["QUERY", "TRACE"])  # the proxy itself refuses others
def test_a_method_the_service_does_not_know_does_not_break_the_next_request(hhub, method):
    """The service answers it before reading the body and closes that connection; the
    hub's proxy must not send the next request, another user's, down it (a 503)."""
    headers = {"Authorization": f"token {hhub.tokens['alice']}", "Content-Type": "application/json"}
    other = {"Authorization": f"token {hhub.tokens['carol']}"}
    statuses = []
    for _ in range(20):
        odd = http.client.HTTPConnection("127.0.0.1", hhub.port, timeout=30)
        nxt = http.client.HTTPConnection("127.0.0.1", hhub.port, timeout=30)
        nxt.connect()  # ready, so that its request follows the odd one at once
        odd.request(method, API + "/me", body=b"{}", headers=headers)
        r = odd.getresponse()
        assert r.status == 405 and json.loads(r.read())["error"]["status"] == 405
        nxt.request("GET", API + "/me", headers=other)
        statuses.append(nxt.getresponse().status)
        odd.close()
        nxt.close()
    assert statuses == [200] * 20


@pytest.mark.parametrize("path", ["/workloads", "/trainings"])
def test_submitting_for_another_user_with_an_object_as_project_is_refused(hhub, path):
    body = {"name": "obj-project", "owner": "carol", "project": {}, "command": ["true"],
            **({"kind": "training"} if path == "/workloads" else {})}
    status, data = call(hhub.url, hhub.tokens["alice"], "POST", path, body)
    validate("POST", path, status, data)
    assert status == 403 and "another user" in data["error"]["message"], data
    status, data = call(hhub.url, hhub.tokens["admin"], "POST", path, body)
    validate("POST", path, status, data)
    assert status == 400 and data["error"]["field"] == "project", data


def test_work_asked_to_stop_before_a_hub_restart_is_stopped_after_it(tmp_path):
    from traitlets.config import Config

    from hub_ext.config import Gpupool
    from hub_ext.db.tables import WorkloadRow
    from hub_ext.runtime import Runtime
    from hub_ext.schema import make_sessionmaker

    cfg = Gpupool(config=Config({"Gpupool": {"state_dir": str(tmp_path)}}))
    Session = make_sessionmaker(cfg.db_url)
    placement = [{"node": "local", "gpu_indices": [0], "gpu_milli": 1000}]
    with Session() as s:
        s.add(WorkloadRow(name="halfway", owner="alice", project="nlp", kind="training", spec={},
                          state="stopping", placement=placement, pid=2**22 + 1))
        s.commit()
    Runtime(cfg).embedded.recover_processes()  # what a restarted hub does first: no process runs it
    with Session() as s:
        w = s.get(WorkloadRow, "halfway")
        assert (w.state, w.placement, w.pid) == ("stopped", [], None)
