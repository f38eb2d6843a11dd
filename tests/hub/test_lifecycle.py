"""A workspace's lifecycle ends cleanly, on a real hub: stopping one that still waits in the
queue (through gpupool's REST API, JupyterHub's own API and the CLI) cancels it, gives back
its queue slot at once and records a "cancelled" event; a request that can never run is
refused at submit, through REST and the CLI, with the words the spawn form shows."""

from __future__ import annotations

import time

import pytest
from hubclient import call
from test_workspaces import cli

pytestmark = pytest.mark.slow


def api(hub, user, method, path, body=None, expect=None):
    status, out = call(hub.url, hub.tokens[user], method, path, body)
    if expect is not None:
        assert status == expect, (status, out)
    return status, out


@pytest.fixture(scope="module")
def lc_org(hub):
    """Department lc-d (quota 1, limit 2) with projects lc (quota 1) and lc-lim (quota 0,
    limit 1); bob and carol are members of both."""
    api(hub, "admin", "POST", "/departments", {"name": "lc-d", "gpus": 1, "limit": 2}, expect=201)
    for name, quota, limit in (("lc", 1, None), ("lc-lim", 0, 1)):
        api(hub, "admin", "POST", "/projects", {"name": name, "department": "lc-d", "gpus": quota, "limit": limit,
                                                "members": ["bob", "carol"]}, expect=201)
    nodes = api(hub, "admin", "GET", "/nodes", expect=200)[1]["items"]
    yield {"node_gpus": max(len(n["gpus"]) for n in nodes), "cluster_gpus": sum(len(n["gpus"]) for n in nodes)}
    for name in ("lc", "lc-lim"):
        api(hub, "admin", "DELETE", f"/projects/{name}")
    api(hub, "admin", "DELETE", "/departments/lc-d")


def workload(hub, name):
    return api(hub, "admin", "GET", f"/workloads/{name}")


def wait_state(hub, name, *states, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, w = workload(hub, name)
        if status == 200 and w["state"] in states:
            return w
        time.sleep(0.3)
    raise AssertionError(f"{name} not {states}: {workload(hub, name)}")


def cancelled_events(hub, name):
    items = api(hub, "admin", "GET", f"/events?workload={name}&limit=50", expect=200)[1]["items"]
    return [e for e in items if e["workload"] == name and e["kind"] == "cancelled"]


def queue_for_carol(hub):
    """carol's workspace (server lc) in project lc waits: bob's holds lc's only guaranteed GPU."""
    api(hub, "carol", "POST", "/workloads", {"kind": "workspace", "project": "lc", "gpu_mode": "whole",
                                             "gpus": 1, "server_name": "lc"}, expect=202)
    w = wait_state(hub, "ws-carol-lc", "pending")
    assert "project lc is at its quota" in w["reason"], w
    assert w["queue_position"] == 1


def assert_cancelled(hub, before: int) -> int:
    """ws-carol-lc's queue slot is gone at once (no row, nothing pending in lc) with one more
    "cancelled" event; JupyterHub holds no server for it either. Returns the events' count."""
    assert workload(hub, "ws-carol-lc")[0] == 404
    pending = api(hub, "admin", "GET", "/workloads?project=lc&state=pending", expect=200)[1]["items"]
    assert pending == []
    events = cancelled_events(hub, "ws-carol-lc")
    assert len(events) == before + 1 and "stopped while it waited in the queue" in events[0]["message"], events
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        user = call(hub.url, hub.tokens["admin"], "GET", "/hub/api/users/carol", api=False)[1]
        if "lc" not in (user.get("servers") or {}):
            return before + 1
        time.sleep(0.2)
    raise AssertionError(f"JupyterHub still holds carol's server lc: {user}")


def test_stopping_a_queued_workspace_cancels_it(hub, lc_org):
    api(hub, "bob", "POST", "/workloads", {"kind": "workspace", "project": "lc", "gpu_mode": "whole",
                                           "gpus": 1, "server_name": "lc"}, expect=202)
    wait_state(hub, "ws-bob-lc", "running")
    seen = len(cancelled_events(hub, "ws-carol-lc"))
    try:
        # gpupool's REST API: the DELETE answers once the slot is back
        queue_for_carol(hub)
        api(hub, "carol", "DELETE", "/workloads/ws-carol-lc", expect=204)
        seen = assert_cancelled(hub, seen)
        # JupyterHub's own API
        queue_for_carol(hub)
        status, _ = call(hub.url, hub.tokens["carol"], "DELETE", "/hub/api/users/carol/servers/lc", api=False)
        assert status in (202, 204)
        seen = assert_cancelled(hub, seen)
        # the CLI says what happened
        queue_for_carol(hub)
        r = cli(hub, "carol", "workspace", "stop", "ws-carol-lc")
        assert r.returncode == 0 and "ws-carol-lc: cancelled (it was waiting in the queue)" in r.stdout, r.stderr
        seen = assert_cancelled(hub, seen)
        # nothing of the cancelled requests lingers: carol's next one is placed as soon as
        # bob's GPU is back
        queue_for_carol(hub)
        api(hub, "bob", "DELETE", "/workloads/ws-bob-lc", expect=204)
        wait_state(hub, "ws-carol-lc", "running", timeout=120)
    finally:
        for name in ("ws-carol-lc", "ws-bob-lc"):
            api(hub, "admin", "DELETE", f"/workloads/{name}")
        for name in ("ws-carol-lc", "ws-bob-lc"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and workload(hub, name)[0] != 404:
                time.sleep(0.3)


def _impossible(lc_org):
    """(request, field, message) for each kind of request that can never run."""
    node, cluster = lc_org["node_gpus"], lc_org["cluster_gpus"]
    ws = {"kind": "workspace", "gpu_mode": "whole"}
    return [
        ({**ws, "project": "lc-lim", "gpus": 2, "preemptible": True}, "gpus",
         "project lc-lim allows at most 1 GPU (limit), got 2"),
        ({**ws, "project": "lc", "gpus": 3, "preemptible": True}, "gpus",
         "department lc-d allows at most 2 GPUs (limit), got 3"),
        ({**ws, "project": "lc", "gpus": 2}, "gpus",
         "project lc allows at most 1 GPU (quota) to work that may not go over quota, got 2"),
        ({**ws, "project": "lc", "gpus": node + 1, "preemptible": True}, "gpus",
         f"must be from 1 to {node} (GPUs of the largest node), got {node + 1}"),
        ({"name": "lc-gang", "project": "lc", "command": ["sleep", "1"], "gpu": node,
          "workers": cluster // node + 1}, "workers",
         f"the cluster has {cluster} GPUs in all, got {node * (cluster // node + 1)}"),
    ]


def test_a_request_that_can_never_run_is_refused_through_rest(hub, lc_org):
    for body, field, message in _impossible(lc_org):
        path = "/trainings" if "workers" in body else "/workloads"
        status, out = api(hub, "bob", "POST", path, body)
        assert status == 400, (body, status, out)
        assert out["error"]["field"] == field and message in out["error"]["message"], (body, out)
    # nothing was stored or queued
    for project in ("lc", "lc-lim"):
        assert api(hub, "admin", "GET", f"/workloads?project={project}", expect=200)[1]["items"] == []
    # the same request as a training through /workloads: the same rule
    status, out = api(hub, "bob", "POST", "/workloads", {"kind": "training", "name": "lc-t", "project": "lc-lim",
                                                         "gpu_mode": "whole", "gpus": 2, "command": ["x"]})
    assert status == 400 and "project lc-lim allows at most 1 GPU (limit), got 2" in out["error"]["message"]


def test_a_request_that_can_never_run_is_refused_by_the_cli(hub, lc_org):
    node, cluster = lc_org["node_gpus"], lc_org["cluster_gpus"]
    runs = [
        (("workspace", "start", "--project", "lc-lim", "--gpus", "2", "--preemptible"),
         "gpus: project lc-lim allows at most 1 GPU (limit), got 2"),
        (("workspace", "start", "--project", "lc", "--gpus", "3", "--preemptible"),
         "gpus: department lc-d allows at most 2 GPUs (limit), got 3"),
        (("workspace", "start", "--project", "lc", "--gpus", "2"),
         "gpus: project lc allows at most 1 GPU (quota) to work that may not go over quota, got 2"),
        (("workspace", "start", "--project", "lc", "--gpus", str(node + 1), "--preemptible"),
         f"gpus: must be from 1 to {node} (GPUs of the largest node)"),
        (("training", "submit", "lc-gang", "--project", "lc", "--gpu", str(node), "--workers",
          str(cluster // node + 1), "--", "sleep", "1"),
         f"workers: the cluster has {cluster} GPUs in all"),
    ]
    for args, message in runs:
        r = cli(hub, "bob", *args)
        assert r.returncode != 0 and message in r.stderr and "(HTTP 400)" in r.stderr, (args, r.stdout, r.stderr)
    assert api(hub, "admin", "GET", "/workloads?project=lc", expect=200)[1]["items"] == []


def test_jupyterhubs_own_api_refuses_with_the_same_words(hub, lc_org):
    """POST /hub/api/users/NAME/servers/S with impossible options: a 400 with the rule's
    words, no workload left behind and no server held."""
    status, out = call(hub.url, hub.tokens["bob"], "POST", "/hub/api/users/bob/servers/lcx",
                       {"project": "lc-lim", "gpu_mode": "whole", "gpus": 2, "preemptible": True}, api=False)
    assert status == 400, (status, out)
    assert "gpus: project lc-lim allows at most 1 GPU (limit), got 2" in out["message"], out
    assert workload(hub, "ws-bob-lcx")[0] == 404
    user = call(hub.url, hub.tokens["admin"], "GET", "/hub/api/users/bob", api=False)[1]
    assert "lcx" not in (user.get("servers") or {}), user


def test_a_spawn_still_queued_at_start_timeout_gives_its_slot_back(tmp_path):
    """start_timeout ends a spawn that waited too long: the same clean end as a stop, with
    the reason, and nothing left in the queue. (Longer than JupyterHub's slow_spawn_timeout of
    10 s, after which the start request answers 202.)"""
    from hubclient import HubClient
    from hubproc import ADMIN_PW, USER_PW, Hub

    h = Hub(tmp_path / "timeout", config="c = get_config()  # noqa\nc.Gpupool.start_timeout_s = 15\n").start()
    try:
        h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "bob")}
        h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
        # a guaranteed training holds nlp's quota (a workspace would start slower than the timeout)
        api(h, "alice", "POST", "/workloads", {"kind": "training", "name": "hold", "project": "nlp",
                                               "gpu_mode": "whole", "gpus": 1, "preemptible": False,
                                               "command": ["sleep", "600"]}, expect=201)
        wait_state(h, "hold", "running")
        api(h, "bob", "POST", "/workloads", {"kind": "workspace", "project": "nlp", "gpu_mode": "whole",
                                             "gpus": 1}, expect=202)
        wait_state(h, "ws-bob", "pending")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and workload(h, "ws-bob")[0] != 404:
            time.sleep(0.5)
        assert workload(h, "ws-bob")[0] == 404
        events = cancelled_events(h, "ws-bob")
        assert len(events) == 1 and "after start_timeout (15 s)" in events[0]["message"], events
    finally:
        h.stop()
