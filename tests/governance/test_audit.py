"""The audit log on a real hub: an entry for each recorded kind (quota and membership
changes, credentials created/deleted/used, workload start/stop/release/preemption),
filters (actor, action, project, time range), pages, bad filters, who may read it (REST
and the admin page)."""

from __future__ import annotations

import sys
import time
import urllib.error

import pytest
from hubclient import HubClient
from hubproc import ADMIN_PW, USER_PW

from .conftest import api
from .test_credentials import call, ensure_credentials, error, run_training

pytestmark = pytest.mark.slow
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def entries(hub, query: str, user: str = "admin") -> list[dict]:
    return call(hub, user, "GET", f"/audit?limit=1000&{query}", expect=200)["items"]


def wait_entry(hub, query: str, match, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in entries(hub, query) if match(e)]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no audit entry for {query}")


def test_quota_and_membership_changes(gov_hub):
    t0 = time.time()
    call(gov_hub, "admin", "PATCH", "/projects/vision", {"gpus": 2, "members": ["carol", "alice"]}, expect=200)
    call(gov_hub, "admin", "PATCH", "/projects/vision", {"gpus": 1, "members": ["carol"]}, expect=200)
    quota = entries(gov_hub, f"action=project.quota&project=vision&since={t0}")
    assert [e["details"]["gpus"] for e in quota] == [[2.0, 1.0], [1.0, 2.0]]  # newest first
    assert all(e["actor"] == "admin" and e["target"] == "vision" for e in quota)
    members = entries(gov_hub, f"action=project.members&since={t0}")
    assert [e["details"] for e in members] == [{"added": [], "removed": ["alice"]},
                                               {"added": ["alice"], "removed": []}]
    call(gov_hub, "admin", "POST", "/departments", {"name": "audited", "gpus": 0}, expect=201)
    call(gov_hub, "admin", "DELETE", "/departments/audited", expect=204)
    kinds = [e["action"] for e in entries(gov_hub, f"actor=admin&since={t0}")]
    assert {"department.created", "department.deleted"} <= set(kinds)
    # the starter organisation was recorded too, by "system"
    assert entries(gov_hub, "actor=system&action=project.created")


def test_credential_lifecycle_and_use(gov_hub):
    ensure_credentials(gov_hub)
    t0 = time.time()
    call(gov_hub, "erin", "POST", "/projects/nlp/credentials",
         {"name": "short-lived", "data": {"TOKEN": "audit-token-value"}}, expect=201)
    job = run_training(gov_hub, "alice", {"name": "audit-use", "credentials": ["short-lived"],
                                          "command": [sys.executable, "-c", "print('ok')"]})
    assert job["status"] == "Succeeded", job
    call(gov_hub, "erin", "DELETE", "/projects/nlp/credentials/short-lived", expect=204)
    got = entries(gov_hub, f"action=credential.&project=nlp&since={t0}")
    by = {(e["action"], e["details"].get("stage")): e for e in got if e["target"] == "nlp/short-lived"}
    assert by[("credential.created", None)]["actor"] == "erin"
    assert by[("credential.created", None)]["details"]["keys"] == ["TOKEN"]
    assert by[("credential.used", "attach")]["details"]["workload"] == "audit-use"
    assert by[("credential.used", "deliver")]["actor"] == "alice"
    assert by[("credential.deleted", None)]["actor"] == "erin"
    assert "audit-token-value" not in str(got)


def _gone(hub, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, w = api(hub, "admin", "GET", f"/workloads/{name}")
        if status == 404 or w["state"] in ("stopped", "failed", "succeeded"):
            return
        time.sleep(0.3)
    raise AssertionError(f"{name} still active")


def test_workload_start_stop_and_preemption(gov_hub):
    """Own department (quota 1): aud-lo (quota 0) runs 4 GPUs over quota until aud-hi asks
    for its guaranteed GPU and the scheduler reclaims."""
    t0 = time.time()
    call(gov_hub, "admin", "POST", "/departments", {"name": "aud-d", "gpus": 1}, expect=201)
    call(gov_hub, "admin", "POST", "/projects", {"name": "aud-lo", "department": "aud-d", "gpus": 0,
                                                 "members": ["alice"]}, expect=201)
    call(gov_hub, "admin", "POST", "/projects", {"name": "aud-hi", "department": "aud-d", "gpus": 1,
                                                 "members": ["bob"]}, expect=201)
    try:
        call(gov_hub, "alice", "POST", "/workloads", {"kind": "training", "project": "aud-lo", "name": "aud-big",
             "gpu_mode": "whole", "gpus": 4, "command": SLEEP}, expect=201)
        wait_entry(gov_hub, f"action=workload.start&since={t0}", lambda e: e["target"] == "aud-big")
        call(gov_hub, "bob", "POST", "/workloads", {"kind": "training", "project": "aud-hi", "name": "aud-own",
             "gpu_mode": "whole", "gpus": 1, "preemptible": False, "command": SLEEP}, expect=201)
        pre = wait_entry(gov_hub, f"action=workload.preempt&since={t0}", lambda e: e["target"] == "aud-big")
        assert pre["actor"] == "scheduler" and pre["project"] == "aud-lo"
        assert "reclaimed" in pre["details"]["message"]
        wait_entry(gov_hub, f"action=workload.start&since={t0}", lambda e: e["target"] == "aud-own")
    finally:
        for user, name in (("alice", "aud-big"), ("bob", "aud-own")):
            api(gov_hub, user, "DELETE", f"/workloads/{name}")
        for name in ("aud-big", "aud-own"):
            _gone(gov_hub, name)
        for path in ("/projects/aud-lo", "/projects/aud-hi", "/departments/aud-d"):
            api(gov_hub, "admin", "DELETE", path)
    stop = wait_entry(gov_hub, f"action=workload.stop&since={t0}", lambda e: e["target"] == "aud-own")
    assert stop["actor"] == "bob" and stop["project"] == "aud-hi"
    rel = wait_entry(gov_hub, f"action=workload.released&since={t0}", lambda e: e["target"] == "aud-own")
    assert rel["actor"] == "scheduler"
    deleted = entries(gov_hub, f"action=project.deleted&since={t0}")
    assert {e["target"] for e in deleted} == {"aud-lo", "aud-hi"}


def test_filters_time_range_and_pages(gov_hub):
    call(gov_hub, "admin", "PATCH", "/projects/serving", {"over_quota_weight": 2}, expect=200)
    t1 = time.time()
    call(gov_hub, "admin", "PATCH", "/projects/serving", {"over_quota_weight": 1}, expect=200)
    after = entries(gov_hub, f"project=serving&action=project.quota&since={t1}")
    assert [e["details"] for e in after] == [{"over_quota_weight": [2.0, 1.0]}]
    before = entries(gov_hub, f"project=serving&action=project.quota&until={t1}")
    assert before and all(e["ts"] <= t1 for e in before)
    assert before[0]["details"] == {"over_quota_weight": [1.0, 2.0]}
    first = call(gov_hub, "admin", "GET", "/audit?limit=2", expect=200)
    second = call(gov_hub, "admin", "GET", "/audit?limit=2&offset=2", expect=200)
    assert first["total"] >= 4 and first["limit"] == 2 and second["offset"] == 2
    assert len(first["items"]) == 2 and first["items"][1]["id"] > second["items"][0]["id"]
    assert all(e["actor"] == "alice" for e in entries(gov_hub, "actor=alice"))


@pytest.mark.parametrize("query, field", [
    ("limit=0", "limit"), ("limit=5000", "limit"), ("limit=x", "limit"), ("offset=-1", "offset"),
    ("since=yesterday", "since"), ("until=now", "until"), ("since=200&until=100", "until"),
    ("action=bogus", "action"),
])
def test_bad_filters(gov_hub, query, field):
    error(gov_hub, "admin", "GET", f"/audit?{query}", None, 400, field)


@pytest.mark.parametrize("user", ["alice", "bob", "vic", "val", "oscar"])
def test_non_admins_get_403(gov_hub, user):
    assert "admin" in error(gov_hub, user, "GET", "/audit", None, 403)


def test_department_admin_sees_their_departments(gov_hub):
    call(gov_hub, "admin", "PATCH", "/projects/serving", {"over_quota_weight": 4}, expect=200)
    call(gov_hub, "admin", "PATCH", "/projects/serving", {"over_quota_weight": 1}, expect=200)
    assert entries(gov_hub, "project=serving")
    for dept in ("research", "ops"):
        call(gov_hub, "admin", "PATCH", f"/departments/{dept}", {"limit": 10}, expect=200)
        call(gov_hub, "admin", "PATCH", f"/departments/{dept}", {"limit": None}, expect=200)
    seen = entries(gov_hub, "", user="erin")
    assert seen and {e["project"] for e in seen} <= {"nlp", "vision", ""}
    changed = {e["target"] for e in seen if e["action"] == "department.updated"}
    assert changed == {"research"}  # their department's changes, not ops'
    assert all(e["details"]["department"] == "research" for e in seen if e["action"].startswith("role."))


def _page(user: str, password: str, hub, path: str) -> tuple[int, str]:
    client = HubClient(hub.url).login(user, password)
    try:
        with client.opener.open(hub.url + "/services/gpupool/" + path) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_admin_page(gov_hub):
    call(gov_hub, "admin", "PATCH", "/projects/nlp", {"over_quota_weight": 3}, expect=200)
    call(gov_hub, "admin", "PATCH", "/projects/nlp", {"over_quota_weight": 1}, expect=200)
    status, html = _page("admin", ADMIN_PW, gov_hub, "audit?action=project.quota&project=nlp")
    assert status == 200 and html.count(">project.quota</td>") >= 2
    assert 'title="a project&#39;s quota' in html and "over_quota_weight" in html
    status, html = _page("admin", ADMIN_PW, gov_hub, "audit?since=abc")
    assert status == 200 and "since: must be a UNIX time" in html
    status, html = _page("alice", USER_PW, gov_hub, "audit")
    assert status == 403
    status, html = _page("erin", USER_PW, gov_hub, "audit")
    assert status == 200 and "serving" not in html.split('id="audit"')[1]


def test_role_changes(gov_hub):
    t0 = time.time()
    call(gov_hub, "admin", "PUT", "/users/oscar/roles", {"roles": [{"role": "viewer", "department": "ops"}]},
         expect=200)
    call(gov_hub, "admin", "PUT", "/users/oscar/roles", {"roles": []}, expect=200)
    got = entries(gov_hub, f"action=role.&since={t0}")
    assert [(e["action"], e["actor"], e["target"], e["details"]) for e in got] == [
        ("role.revoked", "admin", "oscar", {"role": "viewer", "department": "ops"}),
        ("role.granted", "admin", "oscar", {"role": "viewer", "department": "ops"})]
    # the org file's department admins were recorded at start, by "system"
    assert any(e["target"] == "erin" and e["actor"] == "system" for e in entries(gov_hub, "action=role.granted"))


def test_single_sign_on_membership_changes_are_audited(tmp_path):
    """auth.sync_user (each OIDC login) records the memberships the groups claim changed."""
    from hub_ext.config import Gpupool
    from hub_ext.db import audit as audit_log
    from hub_ext.org import projects as org
    from hub_ext.org.auth import sync_user
    from hub_ext.schema import make_sessionmaker

    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'g.sqlite'}")
    cfg = Gpupool(state_dir=str(tmp_path), oidc_group_projects={"ml": ["nlp"], "cv": ["vision"]})
    with Session() as s:
        org.create_department(s, {"name": "research", "gpus": 2})
        for p in ("nlp", "vision"):
            org.create_project(s, {"name": p, "department": "research", "gpus": 1})
        sync_user(s, cfg, "dana", {"nlp"}, set())
        sync_user(s, cfg, "dana", {"vision"}, set())
        s.commit()
        got = [(e["project"], e["details"]) for e in audit_log.query(s, action="project.members")["items"]]
    assert got == [("vision", {"added": ["dana"], "removed": [], "via": "oidc"}),
                   ("nlp", {"added": [], "removed": ["dana"], "via": "oidc"}),
                   ("nlp", {"added": ["dana"], "removed": [], "via": "oidc"})]
