"""The in-hub route of inference services on a live hub (``gpupool up``, tests/hub/hubproc.py):
a service submitted through the REST API is called through the hub's public proxy URL
``/services/gpupool-serve/NAME/...`` with JupyterHub tokens -- a project member's (200,
from zero replicas), none (401), an invalid one (401), another project's user's (403) --
and, for a service in public mode, with no token (200). The activator's /metrics is
scraped afterwards. No timing is asserted: the waits only bound a hung test."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .harness import MODEL_SERVER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

from hubclient import HubClient, call  # noqa: E402
from hubproc import ADMIN_PW, USER_PW, Hub, free_ports  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def get(url: str, token: str = "") -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a GET through the hub's proxy."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def served(url: str, token: str = "") -> tuple[int, dict]:
    code, body, _ = get(url, token)
    return code, body


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    (serve_port,) = free_ports(1)
    hub = Hub(tmp_path_factory.mktemp("hub-serve"),
              extra_env={"GPUPOOL_SERVE_PORT": str(serve_port)}).start()
    hub.serve_port = serve_port
    hub.tokens = {u: HubClient(hub.url).login(u, USER_PW).token(u) for u in ("alice", "carol")}
    yield hub
    for name in ("echo", "open"):
        call(hub.url, hub.tokens["alice"], "DELETE", f"/inferences/{name}")
    time.sleep(1.5)  # the hub's follower stops the replicas (then the hub itself stops)
    hub.stop()


def model(name: str, **over) -> dict:
    return {"name": name, "project": "nlp", "gpu": 0.25, "min_replicas": 0, "max_replicas": 1,
            "command": [sys.executable, MODEL_SERVER, "--startup-s", "0.3"],
            "ready_path": "/health", "scale_to_zero_after_s": 300, **over}


def test_tokens_of_members_others_and_none_through_the_hub_proxy(live):
    alice, carol = live.tokens["alice"], live.tokens["carol"]
    code, svc = call(live.url, alice, "POST", "/inferences", model("echo"))
    assert code == 201, svc
    url = live.url + svc["url"] + "predict?client=a&seq=1"
    assert svc["url"] == "/services/gpupool-serve/echo/"

    # a member of project nlp: served, after one cold start from zero replicas, by the first
    # request after the submission answered
    code, body = served(url, alice)
    assert code == 200 and (body["client"], body["seq"]) == ("a", "1"), body
    # the token as a query argument works too (browsers, EventSource)
    assert get(url + "&token=" + alice)[0] == 200

    code, body, headers = get(url)
    assert code == 401 and body["error"]["field"] == "Authorization"
    assert "JupyterHub token" in body["error"]["message"], body
    assert get(url, "not-a-token")[:1] == (401,)

    code, body, _ = get(url, carol)  # carol is in project vision only
    assert code == 403, body
    assert body["error"]["message"] == "carol is not a member of project 'nlp'"


def test_a_service_is_described_and_served_as_soon_as_its_submission_answers(live):
    """No 404 and no empty state between the submission's answer and the activator's next
    look at the table: describe shows the activator's state, the first call is served."""
    alice = live.tokens["alice"]
    for i in range(3):
        name = f"fresh{i}"
        code, svc = call(live.url, alice, "POST", "/inferences", model(name))
        try:
            assert code == 201, svc
            assert svc["status"].get("replicas") == 0 and "desired" in svc["status"], svc
            code, one = call(live.url, alice, "GET", f"/inferences/{name}")
            assert code == 200 and one["status"].get("replicas") == 0, one
            code, body = served(live.url + svc["url"] + f"predict?client=f&seq={i}", alice)
            assert code == 200 and body["seq"] == str(i), body
        finally:
            call(live.url, alice, "DELETE", f"/inferences/{name}")


def test_public_mode_takes_requests_without_a_token(live):
    alice = live.tokens["alice"]
    code, svc = call(live.url, alice, "POST", "/inferences", model("open", public=True))
    assert code == 201, svc
    code, body = served(live.url + svc["url"] + "predict?client=p&seq=0")
    assert code == 200 and body["client"] == "p", body


def test_activator_metrics_scraped(live):
    code, _ = served(live.url + "/services/gpupool-serve/echo/predict", live.tokens["alice"])
    assert code == 200
    get(live.url + "/services/gpupool-serve/echo/predict")  # one 401 more
    with urllib.request.urlopen(f"http://127.0.0.1:{live.serve_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    assert samples['gpupool_activator_requests_total{code="200",service="echo"}'] >= 2
    assert samples['gpupool_activator_requests_total{code="401",service="echo"}'] >= 1
    assert samples['gpupool_activator_requests_total{code="403",service="echo"}'] >= 1
    assert samples['gpupool_activator_replicas{service="echo"}'] == 1
    assert samples['gpupool_activator_held_requests{service="echo"}'] == 0
    assert samples['gpupool_activator_cold_start_seconds_count{service="echo"}'] == 1
    assert "# TYPE gpupool_activator_cold_start_seconds histogram" in text
    assert "# TYPE gpupool_activator_held_requests gauge" in text


POLICY_IDLE_S = 5


def test_the_policy_idle_timeout_scales_a_service_to_zero_over_min_replicas(live):
    """Project vision's policy bounds how long a service holds GPUs without requests: a
    service that asks for one replica at all times and would scale to zero only after 300 s
    goes to zero after the policy's 5 s, with an event naming the policy, and the next
    request wakes it."""
    from tests.waits import wait_for

    carol = live.tokens["carol"]
    code, _ = call(live.url, _admin(live), "PUT", "/projects/vision/policy",
                   {"idle_timeout_inference_s": POLICY_IDLE_S})
    assert code == 200
    code, svc = call(live.url, carol, "POST", "/inferences",
                     model("kept", project="vision", min_replicas=1, scale_to_zero_after_s=300))
    assert code == 201, svc

    def stops():
        items = call(live.url, carol, "GET", "/events?workload=kept")[1]["items"]
        return [e for e in items if e["kind"] == "stopped"]

    try:
        (ev,) = wait_for(stops, "the policy's scale to zero", timeout=120)
        assert ev["message"] == (
            "kept scaled to zero from 1 replica: no request for longer than the idle timeout of an "
            f"inference service ({POLICY_IDLE_S} s, project vision's policy); the next request starts it again")
        status = wait_for(lambda: (st := call(live.url, carol, "GET", "/inferences/kept")[1]["status"])
                          .get("replicas") == 0 and st, "no replica left")
        assert status["desired"] == 0 and "project vision's policy" in status["why"], status
        code, body = served(live.url + svc["url"] + "predict?client=k&seq=1", carol)
        assert code == 200 and body["client"] == "k", body  # woken by the request
    finally:
        call(live.url, _admin(live), "PUT", "/projects/vision/policy", {})
        call(live.url, carol, "DELETE", "/inferences/kept")


def _admin(hub) -> str:
    if "admin" not in hub.tokens:
        hub.tokens["admin"] = HubClient(hub.url).login("admin", ADMIN_PW).token("admin")
    return hub.tokens["admin"]
