"""Hostile input on a real hub: every finding of the REST API fuzzing is refused with a
400 (413 for a body too big, 405 for a method a path does not take) naming the field and
the limit, nothing of it is stored, and the scheduler keeps placing work. Every response
is checked against the OpenAPI document."""

import json
import sys
import time
import urllib.error
import urllib.request

import pytest
from hubclient import call
from openapi_check import validate

pytestmark = pytest.mark.slow

DEEP = b'{"name": ' + b"[" * 1000 + b"]" * 1000 + b"}"
HUGE_INT = 10**400  # 401 digits
TEN_MB = 10 * 1024 * 1024


def refused(hub, user, method, path, body, field, status=400, limit=None):
    """The call is refused with ``status``, naming ``field`` (and ``limit`` in the message)."""
    code, data = call(hub.url, hub.tokens.get(user, ""), method, path, body)
    validate(method, path, code, data)
    assert code == status, (method, path, code, data)
    assert data["error"]["status"] == status and data["error"]["field"] == field, data
    if limit is not None:
        assert str(limit) in data["error"]["message"], data
    return data["error"]["message"]


def names_in(hub, user, path, key="name"):
    code, data = call(hub.url, hub.tokens[user], "GET", path)
    assert code == 200, data
    return [x[key] for x in data["items"]]


def raw(hub, user, method, path):
    """(status, headers, JSON body) of a call no OpenAPI operation describes."""
    req = urllib.request.Request(hub.url + "/services/gpupool/api/v1" + path, method=method,
                                 headers={"Authorization": f"token {hub.tokens[user]}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"null")


def _training(**kw):
    return {"name": "hostile-t", "project": "vision", "gpu": 0.25,
            "command": [sys.executable, "-c", "pass"], **kw}


def _inference(**kw):
    return {"name": "hostile-i", "project": "vision", "gpu": 0.25,
            "command": [sys.executable, "-m", "http.server"], **kw}


# -- finding 1: one value stopped all scheduling --------------------------------------------
def test_huge_limit_is_refused_and_scheduling_goes_on(hub):
    for path in ("/projects/vision", "/departments/research"):
        refused(hub, "admin", "PATCH", path, {"limit": 1e307}, "limit", limit=1000000)
        refused(hub, "admin", "PATCH", path, {"gpus": 1e7}, "gpus", limit=1000000)
        refused(hub, "admin", "PATCH", path, {"over_quota_weight": 1e300}, "over_quota_weight",
                limit=1000000)
    code, vision = call(hub.url, hub.tokens["admin"], "GET", "/projects/vision")
    assert code == 200 and vision["limit"] is None and vision["gpus"] == 2
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    code, w = call(hub.url, hub.tokens["dave"], "POST", "/workloads",
                   {"kind": "training", "project": "serving", "name": "after-huge-limit",
                    "gpu_fraction": 0.25, "command": cmd})
    assert code == 201, w
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and w["state"] != "running":
        time.sleep(0.3)
        w = call(hub.url, hub.tokens["dave"], "GET", "/workloads/after-huge-limit")[1]
    assert w["state"] == "running", w
    assert call(hub.url, hub.tokens["dave"], "DELETE", "/workloads/after-huge-limit")[0] == 204


# -- finding 2: 500s from gpupool's own code ------------------------------------------------
def test_role_department_object_is_400(hub):
    refused(hub, "admin", "PUT", "/users/bob/roles",
            {"roles": [{"role": "viewer", "department": {}}]}, "department")
    refused(hub, "admin", "PUT", "/users/bob/roles",
            {"roles": [{"role": {}, "department": "ops"}]}, "role")


@pytest.mark.parametrize("action", ["suspend", "resume"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_training_action_takes_only_post(hub, method, action):
    status, headers, body = raw(hub, "alice", method, f"/trainings/anything/{action}")
    assert status == 405, body
    assert headers["Allow"] == "POST" and body["error"]["status"] == 405


@pytest.mark.parametrize("method, path", [
    ("POST", "/departments"), ("PATCH", "/departments/ops"), ("POST", "/projects"),
    ("PATCH", "/projects/nlp"), ("POST", "/workloads"), ("POST", "/trainings"),
    ("POST", "/inferences"), ("POST", "/projects/nlp/credentials"),
    ("POST", "/projects/nlp/datasources"), ("PUT", "/users/bob/roles"),
])
def test_json_nested_1000_deep_is_400(hub, method, path):
    refused(hub, "admin", method, path, DEEP, "body", limit=16)


@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "/departments", {"name": "huge-int", "gpus": HUGE_INT}, "gpus"),
    ("PATCH", "/departments/ops", {"limit": HUGE_INT}, "limit"),
    ("POST", "/projects", {"name": "huge-int", "department": "ops", "gpus": HUGE_INT}, "gpus"),
    ("PATCH", "/projects/serving", {"over_quota_weight": HUGE_INT}, "over_quota_weight"),
    ("POST", "/trainings", _training(workers=HUGE_INT), "workers"),
    ("POST", "/workloads", {"kind": "training", "project": "vision", "command": ["x"],
                            "gpu_mode": "whole", "gpus": HUGE_INT}, "gpus"),
    ("POST", "/inferences", _inference(max_replicas=HUGE_INT), "max_replicas"),
])
def test_400_digit_integer_is_400(hub, method, path, body, field):
    refused(hub, "admin", method, path, body, field, limit="401-digit")
    refused(hub, "admin", method, path, json.dumps(body).replace(str(HUGE_INT), "9" * 5000).encode(),
            "body", limit=1000)


def test_usage_at_the_end_of_time(hub):
    msg = refused(hub, "admin", "GET", "/usage?from=9999-12-31&to=9999-12-31", None, "to")
    assert "9999-12-31T23:59:59Z" in msg
    refused(hub, "admin", "GET", "/usage?from=0001-01-01&to=0001-01-02", None, "to")
    code, rep = call(hub.url, hub.tokens["admin"], "GET", "/usage?from=9999-12-29&to=9999-12-30")
    validate("GET", "/usage", code, rep)
    assert code == 200 and rep["items"] == []
    refused(hub, "admin", "GET", "/audit?since=1e400", None, "since")
    refused(hub, "admin", "GET", "/events?limit=" + "9" * 400, None, "limit")


def test_lone_surrogate_in_a_credential_is_400(hub):
    body = b'{"name": "surrogate", "data": {"KEY": "\\ud800"}}'
    refused(hub, "admin", "POST", "/projects/nlp/credentials", body, "data")
    assert "surrogate" not in names_in(hub, "admin", "/projects/nlp/credentials")


@pytest.mark.parametrize("owner", [{}, [], 7, "bad\nname"])
def test_owner_must_be_a_user_name(hub, owner):
    refused(hub, "admin", "POST", "/workloads",
            {"kind": "training", "project": "vision", "command": ["x"], "owner": owner}, "owner")
    refused(hub, "admin", "POST", "/trainings", _training(owner=owner), "owner")


# -- finding 3: stored input that should have been refused -----------------------------------
@pytest.mark.parametrize("method, path, body, listing", [
    ("POST", "/departments", {"name": "nl-dept\n"}, "/departments"),
    ("POST", "/projects", {"name": "nl-proj\n", "department": "ops"}, "/projects"),
    ("POST", "/trainings", _training(name="nl-train\n"), "/trainings"),
    ("POST", "/workloads", {"kind": "training", "project": "vision", "command": ["x"],
                            "name": "nl-work\n"}, "/workloads"),
    ("POST", "/inferences", _inference(name="nl-inf\n"), "/inferences"),
    ("POST", "/projects/nlp/credentials", {"name": "nl-cred\n", "data": {"K": "v"}},
     "/projects/nlp/credentials"),
    ("POST", "/projects/nlp/datasources", {"name": "nl-data\n", "kind": "pvc", "claim": "c"},
     "/projects/nlp/datasources"),
])
def test_name_ending_in_newline_is_refused(hub, method, path, body, listing):
    refused(hub, "admin", method, path, body, "name")
    assert not any(n.endswith("\n") for n in names_in(hub, "admin", listing))
    assert not list((hub.workdir / "state").glob("**/nl-*\n"))


def test_member_and_role_user_ending_in_newline_are_refused(hub):
    refused(hub, "admin", "PATCH", "/projects/serving", {"members": ["dave", "eve\n"]}, "members")
    code, serving = call(hub.url, hub.tokens["admin"], "GET", "/projects/serving")
    assert "eve\n" not in serving["members"]
    refused(hub, "admin", "PUT", "/users/eve%0A/roles", {"roles": []}, "name")
    refused(hub, "admin", "POST", "/projects",
            {"name": "many-members", "department": "ops", "members": [f"u{i}" for i in range(5001)]},
            "members", limit=5000)


@pytest.mark.parametrize("body, field", [
    (_training(command=["python", "-c", "pass\x00"]), "command[2]"),
    (_training(command=["python", "\ud800"]), "command[1]"),
    (_training(env={"A": "x\x00y"}), "env.A"),
    (_training(env={"A": "\udfff"}), "env.A"),
    (_training(env={"A" * 129: "x"}), "env"),
    (_training(image="i" * 513), "image"),
    (_training(image="repo/image\n"), "image"),
    (_training(checkpoint_dir="/tmp/ckpt/../../etc"), "checkpoint_dir"),
    (_training(checkpoint_dir="/" + "c" * 1024), "checkpoint_dir"),
    (_training(command=["x"] * 1025), "command"),
    (_training(command=["x" * 40_000]), "command[0]"),
    (_training(env={f"V{i}": "x" for i in range(257)}), "env"),
    (_training(env={f"V{i}": "x" * 30_000 for i in range(100)}), "env"),  # 3 MB in all
])
def test_training_spec_bad_strings_are_refused(hub, body, field):
    refused(hub, "alice", "POST", "/trainings", body, field)
    assert "hostile-t" not in names_in(hub, "alice", "/trainings")
    assert not (hub.workdir / "state" / "trainings" / "hostile-t").exists()


def test_checkpoint_dir_with_dotdot_is_not_created(hub, tmp_path):
    target = tmp_path / "made-by-the-hub"
    refused(hub, "alice", "POST", "/trainings",
            _training(checkpoint_dir=f"{tmp_path}/x/../made-by-the-hub"), "checkpoint_dir")
    assert not target.exists()


@pytest.mark.parametrize("body, field", [
    (_inference(command=["serve", "\x00"]), "command[1]"),
    (_inference(env={"A": "\ud800"}), "env.A"),
    (_inference(ready_path="/" + "r" * 1024), "ready_path"),
    (_inference(ready_path="/ready\x00"), "ready_path"),
    (_inference(image="i" * 513), "image"),
])
def test_inference_spec_bad_strings_are_refused(hub, body, field):
    refused(hub, "alice", "POST", "/inferences", body, field)
    assert "hostile-i" not in names_in(hub, "alice", "/inferences")


@pytest.mark.parametrize("body, field", [
    ({"kind": "training", "project": "vision", "command": ["x\x00"]}, "command[0]"),
    ({"kind": "training", "project": "vision", "command": ["x"] * 1025}, "command"),
    ({"kind": "workspace", "project": "vision", "server_name": "a/b"}, "server_name"),
    ({"kind": "workspace", "project": "vision", "server_name": "é"}, "server_name"),
])
def test_workload_bad_strings_are_refused(hub, body, field):
    refused(hub, "alice", "POST", "/workloads", body, field)


@pytest.mark.parametrize("path", ["/trainings", "/inferences", "/projects", "/workloads"])
def test_ten_megabyte_body_is_413(hub, path):
    body = json.dumps({"name": "big", "command": ["x" * TEN_MB]}).encode()
    refused(hub, "admin", "POST", path, body, "body", status=413, limit=4194304)


@pytest.mark.parametrize("mount", ["//etc", "//var/run/gpupool/credentials", "/data/../etc",
                                   "/etc/./", "///usr//lib", "/proc/"])
def test_mount_path_cannot_reach_reserved_folders(hub, mount):
    refused(hub, "admin", "POST", "/projects/nlp/datasources",
            {"name": "sneaky", "kind": "pvc", "claim": "c", "mount_path": mount}, "mount_path")
    assert "sneaky" not in names_in(hub, "admin", "/projects/nlp/datasources")


def test_mount_path_is_stored_normalised(hub):
    code, d = call(hub.url, hub.tokens["admin"], "POST", "/projects/nlp/datasources",
                   {"name": "tidy", "kind": "pvc", "claim": "c", "mount_path": "//data//tidy/./x/"})
    validate("POST", "/projects/nlp/datasources", code, d)
    assert code == 201 and d["mount_path"] == "/data/tidy/x", d
    assert call(hub.url, hub.tokens["admin"], "DELETE", "/projects/nlp/datasources/tidy")[0] == 204
