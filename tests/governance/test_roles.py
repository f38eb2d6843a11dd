"""The role matrix on a real hub: every role x every REST action x own vs other project or
department, asserted allowed (2xx) or denied (403 with a message in the JSON error body,
never a 404-by-accident or a 500); list endpoints never leak other projects' items; the
CLI inherits the rule through the REST API; unit checks of hub_ext.org.roles.

The actions come from hub_ext/api/openapi.yaml: an endpoint without an entry in ROUTES
fails ``test_every_endpoint_has_a_matrix_entry``, so endpoints added later are covered.

People (tests/governance/org.yaml): admin (platform admin), erin (department admin of
research: nlp, vision), alice (member of nlp), vic (viewer of research), oscar (nothing).
"Own" is research / nlp (alice's project, erin's and vic's department); "other" is ops /
serving (bob's project, olga's department)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hub_ext.org import roles

from .conftest import api

pytestmark = pytest.mark.slow

SPEC = Path(__file__).resolve().parents[2] / "hub_ext" / "api" / "openapi.yaml"
ROLE_PEOPLE = {"platform-admin": "admin", "department-admin": "erin", "member": "alice",
               "viewer": "vic", "none": "oscar"}
SCOPES = {"own": ("nlp", "research", "alice"), "other": ("serving", "ops", "bob")}
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]

# Expected outcome per action: role -> (own, other); True = allowed. Written out by hand
# from the role table in the README (not computed by hub_ext.org.roles).
A, D = True, False
EXPECT = {
    "any": {"platform-admin": (A, A), "department-admin": (A, A), "member": (A, A), "viewer": (A, A), "none": (A, A)},
    "view": {"platform-admin": (A, A), "department-admin": (A, D), "member": (A, D), "viewer": (A, D), "none": (D, D)},
    "submit": {"platform-admin": (A, A), "department-admin": (D, D), "member": (A, D), "viewer": (D, D), "none": (D, D)},
    "manage_workload": {"platform-admin": (A, A), "department-admin": (A, D), "member": (A, D), "viewer": (D, D),
                        "none": (D, D)},
    "manage_project": {"platform-admin": (A, A), "department-admin": (A, D), "member": (D, D), "viewer": (D, D),
                       "none": (D, D)},
    "manage_department": {"platform-admin": (A, A), "department-admin": (D, D), "member": (D, D), "viewer": (D, D),
                          "none": (D, D)},
    "use_credentials": {"platform-admin": (A, A), "department-admin": (A, D), "member": (A, D), "viewer": (D, D),
                        "none": (D, D)},
    "view_audit": {"platform-admin": (A, A), "department-admin": (A, A), "member": (D, D), "viewer": (D, D),
                   "none": (D, D)},
    "administer_platform": {"platform-admin": (A, A), "department-admin": (D, D), "member": (D, D),
                            "viewer": (D, D), "none": (D, D)},
}
EXPECT["manage_credentials"] = EXPECT["manage_roles"] = EXPECT["manage_project"]
# no person: only the activator's service token (custom:gpupool:inference-auth)
EXPECT["activator"] = {r: (D, D) for r in EXPECT["any"]}


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass
class Call:
    path: str
    body: dict | None = None
    cleanup: Callable[[], None] | None = None


@dataclass
class Route:
    """How to exercise one endpoint: ``make(world, scope, allowed)`` gives the request for
    a cell (``allowed``: the cell expects success, so it may need a fresh object)."""

    action: str
    make: Callable[[World, str, bool], Call]
    list_key: str | None = None  # a list endpoint: the field naming the project ("NAME@": a department)
    scoped: bool = True  # False: the target names no project or department (one cell per role)


class World:
    """Objects in both the own and the other project, made by the platform admin."""

    def __init__(self, hub):
        self.hub = hub

    def admin(self, method, path, body=None, expect=None):
        status, data = api(self.hub, "admin", method, path, body)
        if expect is not None:
            assert status == expect, (method, path, status, data)
        return data

    def training(self, scope: str, owner_token_user: str | None = None) -> str:
        project, _, owner = SCOPES[scope]
        name = uid(f"t{scope[:2]}")
        status, data = api(self.hub, owner_token_user or owner, "POST", "/trainings",
                           {"name": name, "project": project, "command": SLEEP, "gpu": 0})
        assert status == 201, data
        return name

    def workload(self, scope: str) -> str:
        project, _, owner = SCOPES[scope]
        name = uid(f"w{scope[:2]}")
        status, data = api(self.hub, owner, "POST", "/workloads",
                           {"kind": "training", "name": name, "project": project, "command": SLEEP,
                            "gpu_mode": "none"})
        assert status == 201, data
        return name

    def inference(self, scope: str) -> str:
        project, _, owner = SCOPES[scope]
        name = uid(f"i{scope[:2]}")
        status, data = api(self.hub, owner, "POST", "/inferences",
                           {"name": name, "project": project, "command": SLEEP, "min_replicas": 0})
        assert status == 201, data
        return name

    def setup(self) -> World:
        self.trainings = {s: self.training(s) for s in SCOPES}
        self.workloads = {s: self.workload(s) for s in SCOPES}
        self.inferences = {s: self.inference(s) for s in SCOPES}
        self.credentials, self.datasources = {}, {}
        for s, (project, _, _) in SCOPES.items():
            self.credentials[s] = uid("cred")
            self.admin("POST", f"/projects/{project}/credentials",
                       {"name": self.credentials[s], "data": {"TOKEN": "matrix-secret"}}, expect=201)
            self.datasources[s] = uid("data")
            self.admin("POST", f"/projects/{project}/datasources",
                       {"name": self.datasources[s], "kind": "hostpath", "path": "/tmp"}, expect=201)
        return self


# -- how each endpoint is exercised ------------------------------------------------------
def _proj(scope):
    return SCOPES[scope][0]


def _dept(scope):
    return SCOPES[scope][1]


def _temp_project(w: World, scope: str) -> str:
    name = uid("tmp")
    w.admin("POST", "/projects", {"name": name, "department": _dept(scope), "gpus": 0}, expect=201)
    return name


def _drop_project(w: World, name: str):
    return lambda: api(w.hub, "admin", "DELETE", f"/projects/{name}")


def _post_project(w, scope, ok):
    name = uid("np")
    return Call("/projects", {"name": name, "department": _dept(scope), "gpus": 0}, _drop_project(w, name))


def _delete_project(w, scope, ok):
    return Call(f"/projects/{_temp_project(w, scope) if ok else _proj(scope)}")


def _post_department(w, scope, ok):
    name = uid("nd")
    return Call("/departments", {"name": name, "gpus": 0},
                lambda: api(w.hub, "admin", "DELETE", f"/departments/{name}"))


def _delete_department(w, scope, ok):
    if not ok:
        return Call(f"/departments/{_dept(scope)}")
    name = uid("td")
    w.admin("POST", "/departments", {"name": name, "gpus": 0}, expect=201)
    return Call(f"/departments/{name}")


def _training_body(w, scope, ok):
    name = uid("ts")
    return Call("/trainings", {"name": name, "project": _proj(scope), "command": SLEEP, "gpu": 0},
                lambda: api(w.hub, "admin", "DELETE", f"/trainings/{name}"))


def _workload_body(w, scope, ok):
    name = uid("ws")
    return Call("/workloads", {"kind": "training", "name": name, "project": _proj(scope), "command": SLEEP,
                               "gpu_mode": "none"},
                lambda: api(w.hub, "admin", "DELETE", f"/workloads/{name}"))


def _inference_body(w, scope, ok):
    name = uid("is")
    return Call("/inferences", {"name": name, "project": _proj(scope), "command": SLEEP, "min_replicas": 0},
                lambda: api(w.hub, "admin", "DELETE", f"/inferences/{name}"))


def _training_at(suffix: str, fresh: bool):
    def make(w, scope, ok):
        if not (ok and fresh):
            return Call(f"/trainings/{w.trainings[scope]}{suffix}")
        name = w.training(scope)
        if suffix == "/resume":  # only a Suspended job resumes: suspend it first
            w.admin("POST", f"/trainings/{name}/suspend", expect=202)
            deadline = time.monotonic() + 90
            while w.admin("GET", f"/trainings/{name}")["status"] != "Suspended":
                assert time.monotonic() < deadline, f"{name} was not suspended"
                time.sleep(0.5)
        return Call(f"/trainings/{name}{suffix}",
                    cleanup=lambda: api(w.hub, "admin", "DELETE", f"/trainings/{name}"))
    return make


def _project_items(kind: str, one: bool = False, post: bool = False, delete: bool = False):
    def make(w, scope, ok):
        project = _proj(scope)
        if post:
            name = uid("nc")
            body = ({"name": name, "data": {"KEY": "v"}} if kind == "credentials"
                    else {"name": name, "kind": "hostpath", "path": "/tmp"})
            return Call(f"/projects/{project}/{kind}", body,
                        lambda: api(w.hub, "admin", "DELETE", f"/projects/{project}/{kind}/{name}"))
        if delete and ok:
            name = uid("dc")
            body = ({"name": name, "data": {"KEY": "v"}} if kind == "credentials"
                    else {"name": name, "kind": "hostpath", "path": "/tmp"})
            w.admin("POST", f"/projects/{project}/{kind}", body, expect=201)
            return Call(f"/projects/{project}/{kind}/{name}")
        if one or delete:
            return Call(f"/projects/{project}/{kind}/{getattr(w, kind)[scope]}")
        return Call(f"/projects/{project}/{kind}")
    return make


def _user_roles(w, scope, ok):
    return Call("/users/pat/roles", {"roles": [{"role": "viewer", "department": _dept(scope)}]},
                lambda: api(w.hub, "admin", "PUT", "/users/pat/roles", {"roles": []}))


def fixed(path: str):
    return lambda w, scope, ok: Call(path)


ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/"): Route("any", fixed("/")),
    ("GET", "/openapi.json"): Route("any", fixed("/openapi.json")),
    ("GET", "/me"): Route("any", fixed("/me")),
    ("GET", "/me/ssh-keys"): Route("any", fixed("/me/ssh-keys")),
    ("PUT", "/me/ssh-keys"): Route("any", lambda w, s, ok: Call("/me/ssh-keys", {"keys": []})),
    ("GET", "/roles"): Route("any", fixed("/roles"), list_key="department@"),
    ("GET", "/users/{name}/roles"): Route("any", fixed("/users/erin/roles"), list_key="department@"),
    ("PUT", "/users/{name}/roles"): Route("manage_roles", _user_roles),
    ("GET", "/departments"): Route("any", fixed("/departments"), list_key="name@"),
    ("POST", "/departments"): Route("manage_department", _post_department),
    ("GET", "/departments/{name}"): Route("view", lambda w, s, ok: Call(f"/departments/{_dept(s)}")),
    ("PATCH", "/departments/{name}"): Route("manage_department", lambda w, s, ok: Call(f"/departments/{_dept(s)}", {})),
    ("DELETE", "/departments/{name}"): Route("manage_department", _delete_department),
    ("GET", "/departments/{name}/policy"): Route("view", lambda w, s, ok: Call(f"/departments/{_dept(s)}/policy")),
    ("PUT", "/departments/{name}/policy"): Route("manage_department", lambda w, s, ok: Call(
        f"/departments/{_dept(s)}/policy", {})),
    ("GET", "/projects"): Route("any", fixed("/projects"), list_key="name"),
    ("POST", "/projects"): Route("manage_project", _post_project),
    ("GET", "/projects/{name}"): Route("view", lambda w, s, ok: Call(f"/projects/{_proj(s)}")),
    ("PATCH", "/projects/{name}"): Route("manage_project", lambda w, s, ok: Call(f"/projects/{_proj(s)}", {})),
    ("DELETE", "/projects/{name}"): Route("manage_project", _delete_project),
    ("GET", "/projects/{name}/policy"): Route("view", lambda w, s, ok: Call(f"/projects/{_proj(s)}/policy")),
    ("PUT", "/projects/{name}/policy"): Route("manage_project", lambda w, s, ok: Call(
        f"/projects/{_proj(s)}/policy", {})),
    ("GET", "/projects/{project}/credentials"): Route("use_credentials", _project_items("credentials")),
    ("POST", "/projects/{project}/credentials"): Route("manage_credentials", _project_items("credentials", post=True)),
    ("GET", "/projects/{project}/credentials/{name}"): Route("use_credentials", _project_items("credentials", one=True)),
    ("DELETE", "/projects/{project}/credentials/{name}"): Route("manage_credentials",
                                                                _project_items("credentials", delete=True)),
    ("GET", "/projects/{project}/datasources"): Route("use_credentials", _project_items("datasources")),
    ("POST", "/projects/{project}/datasources"): Route("manage_credentials", _project_items("datasources", post=True)),
    ("GET", "/projects/{project}/datasources/{name}"): Route("use_credentials", _project_items("datasources", one=True)),
    ("DELETE", "/projects/{project}/datasources/{name}"): Route("manage_credentials",
                                                                _project_items("datasources", delete=True)),
    ("GET", "/audit"): Route("view_audit", fixed("/audit"), list_key="project"),
    ("GET", "/workloads"): Route("any", fixed("/workloads"), list_key="project"),
    ("POST", "/workloads"): Route("submit", _workload_body),
    ("GET", "/workloads/{name}"): Route("view", lambda w, s, ok: Call(f"/workloads/{w.workloads[s]}")),
    # a command workload's output is its project's to read; a workspace's is its owner's
    # (tests/hub/test_cli_remote.py)
    ("GET", "/workloads/{name}/logs"): Route("view", lambda w, s, ok: Call(f"/workloads/{w.workloads[s]}/logs")),
    ("DELETE", "/workloads/{name}"): Route("manage_workload", lambda w, s, ok: Call(
        f"/workloads/{w.workload(s) if ok else w.workloads[s]}")),
    ("GET", "/nodes"): Route("any", fixed("/nodes")),
    ("GET", "/capacity"): Route("any", fixed("/capacity")),
    ("POST", "/capacity"): Route("any", lambda w, s, ok: Call("/capacity", {"gpu_fraction": "0"})),
    ("GET", "/events"): Route("any", fixed("/events"), list_key="project"),
    ("GET", "/samples"): Route("any", fixed("/samples")),
    ("GET", "/trainings"): Route("any", fixed("/trainings"), list_key="project"),
    ("POST", "/trainings"): Route("submit", _training_body),
    ("GET", "/trainings/{name}"): Route("view", _training_at("", fresh=False)),
    ("DELETE", "/trainings/{name}"): Route("manage_workload", _training_at("", fresh=True)),
    ("POST", "/trainings/{name}/suspend"): Route("manage_workload", _training_at("/suspend", fresh=True)),
    ("POST", "/trainings/{name}/resume"): Route("manage_workload", _training_at("/resume", fresh=True)),
    ("GET", "/trainings/{name}/logs"): Route("view", _training_at("/logs", fresh=False)),
    ("GET", "/inferences"): Route("any", fixed("/inferences"), list_key="project"),
    ("POST", "/inferences"): Route("submit", _inference_body),
    ("GET", "/inferences/{name}"): Route("view", lambda w, s, ok: Call(f"/inferences/{w.inferences[s]}")),
    ("DELETE", "/inferences/{name}"): Route("manage_workload", lambda w, s, ok: Call(
        f"/inferences/{w.inference(s) if ok else w.inferences[s]}")),
    ("POST", "/inference-callers"): Route("activator", lambda w, s, ok: Call(
        "/inference-callers", {"token": "0" * 32}), scoped=False),
    ("GET", "/usage"): Route("administer_platform", fixed("/usage")),
    ("GET", "/usage.csv"): Route("administer_platform", fixed("/usage.csv")),
}
for _k, _r in ROUTES.items():  # a target with no project or department: one cell per role
    _r.scoped = _k in {("POST", "/projects"), ("POST", "/workloads"), ("POST", "/trainings"),
                       ("POST", "/inferences"), ("PUT", "/users/{name}/roles")} or (
        "{" in _k[1] and _k != ("GET", "/users/{name}/roles"))


def spec_operations() -> set[tuple[str, str]]:
    spec = yaml.safe_load(SPEC.read_text())
    return {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops
            if m in ("get", "post", "put", "patch", "delete")}


def cells():
    for (method, path) in sorted(spec_operations()):
        route = ROUTES.get((method, path))
        scopes = ("own", "other") if route is not None and route.scoped else ("own",)
        for role in ROLE_PEOPLE:
            for scope in scopes:
                yield pytest.param(method, path, role, scope, id=f"{method} {path} {role} {scope}")


def test_every_endpoint_has_a_matrix_entry():
    missing = sorted(spec_operations() - set(ROUTES))
    assert not missing, f"endpoints in openapi.yaml with no role-matrix entry in {__file__}: {missing}"
    stale = sorted(set(ROUTES) - spec_operations())
    assert not stale, f"matrix entries for endpoints the OpenAPI document no longer has: {stale}"
    assert {r.action for r in ROUTES.values()} - {"any", "activator"} <= set(roles.ACTIONS)


@pytest.fixture(scope="module")
def world(gov_hub):
    return World(gov_hub).setup()


@pytest.mark.parametrize("method, path, role, scope", list(cells()))
def test_matrix(world, method, path, role, scope):
    route = ROUTES.get((method, path))
    assert route is not None, f"{method} {path}: no role-matrix entry (add one to ROUTES)"
    expected = EXPECT[route.action][role][0 if scope == "own" else 1]
    call = route.make(world, scope, expected)
    status, data = api(world.hub, ROLE_PEOPLE[role], method, call.path, call.body)
    try:
        if expected:
            assert 200 <= status < 300, f"{role} {method} {call.path}: expected allowed, got {status} {data}"
        else:
            assert status == 403, f"{role} {method} {call.path}: expected 403, got {status} {data}"
            err = (data or {}).get("error") or {}
            assert err.get("status") == 403 and len(err.get("message") or "") > 10, data
    finally:
        if call.cleanup and 200 <= status < 300:
            call.cleanup()


# -- lists never leak ---------------------------------------------------------------------
VISIBLE = {  # person -> projects whose items they may list (None: all)
    "admin": None, "val": None, "erin": {"nlp", "vision"}, "vic": {"nlp", "vision"}, "alice": {"nlp"},
    "bob": {"serving"}, "olga": {"serving"}, "oscar": set(),
}
DEPTS = {"nlp": "research", "vision": "research", "serving": "ops"}


@pytest.mark.parametrize("person", sorted(VISIBLE))
def test_lists_never_leak_other_projects(world, person):
    lists = {k: r for k, r in ROUTES.items() if r.list_key}
    for (method, path), route in sorted(lists.items()):
        call = route.make(world, "own", True)
        status, data = api(world.hub, person, method, call.path)
        if status == 403:  # a guarded list (the audit log): the matrix covers who may read it
            continue
        assert status == 200, (person, path, status, data)
        key, dept_level = route.list_key.rstrip("@"), route.list_key.endswith("@")
        seen = VISIBLE[person]
        allowed = None if seen is None else ({DEPTS[p] for p in seen} if dept_level else seen)
        got = {i[key] for i in data["items"]}
        if allowed is None:
            if path in ("/workloads", "/trainings", "/inferences", "/projects"):  # not vacuous
                assert {"nlp", "serving"} <= got, (person, path, got)
            continue
        if path == "/audit":  # department and role changes carry a department, not a project
            depts = {DEPTS[p] for p in seen}
            leaked = {(i["action"], i["project"] or i["target"]) for i in data["items"]
                      if not (i["project"] in seen if i["project"] else _audit_department(i) in depts)}
        else:
            leaked = got - allowed
        assert not leaked, f"{person} sees {path} items of {leaked}"


def _audit_department(item: dict) -> str | None:
    if item["action"].startswith("department."):
        return item["target"]
    return (item.get("details") or {}).get("department") if item["action"].startswith("role.") else None


def test_nodes_hide_other_projects_workload_names(world):
    """A GPU workload of serving: its name on the nodes list for admins and bob, not alice."""
    name = uid("gpu")
    status, data = api(world.hub, "bob", "POST", "/trainings",
                       {"name": name, "project": "serving", "command": SLEEP, "gpu": 0.25})
    assert status == 201, data
    try:
        def holders(user):
            items = api(world.hub, user, "GET", "/nodes")[1]["items"]
            return [s for n in items for g in n["gpus"] for s in g["workloads"]]

        deadline = time.monotonic() + 120
        while not any(s["workload"] == name for s in holders("admin")):
            assert time.monotonic() < deadline, "the GPU training was not placed"
            time.sleep(1)
        assert any(s["workload"] == name for s in holders("bob"))
        mine = holders("alice")
        assert not any(s["workload"] == name or s["project"] == "serving" for s in mine)
        assert any(s["workload"] == "(other project)" for s in mine)
    finally:
        api(world.hub, "admin", "DELETE", f"/trainings/{name}")


# -- assignment through the REST API and what it changes ---------------------------------
def test_department_admin_assigned_through_the_api(world):
    hub = world.hub
    assert api(hub, "oscar", "GET", "/projects/nlp")[0] == 403
    status, data = api(hub, "erin", "PUT", "/users/oscar/roles",
                       {"roles": [{"role": "department-admin", "department": "research"}]})
    assert status == 200 and data["items"][0]["role"] == "department-admin", data
    try:
        assert api(hub, "oscar", "GET", "/projects/nlp")[0] == 200
        assert api(hub, "oscar", "PATCH", "/projects/vision", {})[0] == 200
        assert api(hub, "oscar", "PATCH", "/projects/serving", {})[0] == 403
        # within the department's quota: research holds 4, its projects 2
        status, data = api(hub, "oscar", "PATCH", "/projects/vision", {"gpus": 9})
        assert status == 400 and data["error"]["field"] == "gpus" and "department" in data["error"]["message"]
        # a department admin cannot reach into another department
        status, data = api(hub, "erin", "PUT", "/users/oscar/roles",
                           {"roles": [{"role": "viewer", "department": "ops"}]})
        assert status == 403 and "ops" in data["error"]["message"]
    finally:
        assert api(hub, "admin", "PUT", "/users/oscar/roles", {"roles": []})[0] == 200
    assert api(hub, "oscar", "GET", "/projects/nlp")[0] == 403


@pytest.mark.parametrize("body, field", [
    ({"roles": [{"role": "emperor", "department": "research"}]}, "role"),
    ({"roles": [{"role": "department-admin", "department": "*"}]}, "department"),
    ({"roles": [{"role": "viewer", "department": "nope"}]}, "department"),
    ({"roles": "viewer"}, "roles"),
    ({"role": "viewer"}, "role"),
])
def test_role_assignment_bad_input(world, body, field):
    status, data = api(world.hub, "admin", "PUT", "/users/pat/roles", body)
    assert status == 400 and data["error"]["field"] == field, data


# -- pages and the CLI ask the same rule ------------------------------------------------
def test_cli_inherits_the_rule(world):
    env = {**os.environ, "GPUPOOL_URL": world.hub.url, "GPUPOOL_TOKEN": world.hub.tokens["vic"]}
    gp = str(Path(sys.executable).parent / "gpupool")
    out = subprocess.run([gp, "training", "submit", "cli-vic", "--project", "nlp", "--", "true"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "HTTP 403" in out.stderr and "read-only" in out.stderr, out.stderr
    out = subprocess.run([gp, "project", "show", "serving"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "HTTP 403" in out.stderr, out.stderr
    out = subprocess.run([gp, "project", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "nlp" in out.stdout and "serving" not in out.stdout, out


def test_cli_roles(world):
    gp = str(Path(sys.executable).parent / "gpupool")

    def run(user, *argv):
        env = {**os.environ, "GPUPOOL_URL": world.hub.url, "GPUPOOL_TOKEN": world.hub.tokens[user]}
        return subprocess.run([gp, "roles", *argv], env=env, capture_output=True, text=True, timeout=60)

    out = run("erin", "set", "pat", "viewer:research")
    assert out.returncode == 0 and "pat: viewer:research" in out.stdout, out
    try:
        out = run("erin", "list")
        assert "department-admin" in out.stdout and "pat" in out.stdout and "ops" not in out.stdout, out
        out = run("alice", "set", "pat", "viewer:research")
        assert out.returncode != 0 and "HTTP 403" in out.stderr, out
        out = run("erin", "set", "pat", "viewer")
        assert out.returncode != 0 and "ROLE:DEPARTMENT" in out.stderr, out
    finally:
        assert run("admin", "set", "pat").returncode == 0


def test_pages_ask_the_same_rule(world):
    from hubclient import HubClient

    hub = world.hub
    for user, sees, hidden in (("vic", "vision", "serving"), ("alice", "nlp", "vision")):
        c = HubClient(hub.url).login(user, "gpupool-user")
        html = c.opener.open(hub.url + "/services/gpupool/org").read().decode()
        assert f'data-name="{sees}"' in html and f'data-name="{hidden}"' not in html
        assert "Save" not in html  # read-only for viewers and members
    c = HubClient(hub.url).login("erin", "gpupool-user")
    html = c.opener.open(hub.url + "/services/gpupool/org").read().decode()
    assert "(department admin)" in html and 'id="new-project"' in html
    assert '<option>research</option>' in html and '<option>ops</option>' not in html


# -- the rule itself ----------------------------------------------------------------------
def test_rule_unit():
    who = roles.Who("erin", admin_of=frozenset({"research"}), departments={"nlp": "research", "serving": "ops"})
    assert roles.allowed(who, "manage_project", project="nlp")
    d = roles.allowed(who, "manage_project", project="serving")
    assert not d and "ops" in d.reason
    assert roles.visible_projects(who) == {"nlp"}
    with pytest.raises(ValueError, match="unknown action"):
        roles.allowed(who, "launch_rockets")
    assert roles.allowed(who, "view_audit") and roles.allowed(who, "view_audit", project="nlp")
    assert not roles.allowed(who, "view_audit", project="serving")
    assert not roles.allowed(roles.Who("alice", projects=frozenset({"nlp"})), "view_audit")
    viewer = roles.Who("val", viewer_of=frozenset({"*"}), departments={"nlp": "research"})
    assert roles.visible_projects(viewer) is None and not roles.allowed(viewer, "submit", project="nlp")


def test_a_workspace_log_refusal_names_what_reading_needs():
    bob = roles.Who("bob", projects=frozenset({"nlp"}), departments={"nlp": "research"})
    read = roles.allowed(bob, "read_workspace_log", project="nlp", owner="alice")
    assert not read and read.reason == ("only the workspace's owner, an admin of its department or a "
                                        "platform admin can read its log (project 'nlp')")
    change = roles.allowed(bob, "manage_workload", project="nlp", owner="alice")
    assert not change and change.reason.endswith("can change it (project 'nlp')")
    assert roles.allowed(bob, "read_workspace_log", project="nlp", owner="bob")
    erin = roles.Who("erin", admin_of=frozenset({"research"}), departments={"nlp": "research"})
    assert roles.allowed(erin, "read_workspace_log", project="nlp", owner="alice")


def test_platform_admin_starts_a_workspace_in_any_project(world):
    """The spawner and its form ask the same rule: admin is no member of serving."""
    from hubclient import HubClient

    hub = world.hub
    html = HubClient(hub.url).login("admin", "gpupool-admin-password-change-me").opener.open(
        hub.url + "/hub/spawn").read().decode()
    assert all(f'value="{p}"' in html for p in ("nlp", "vision", "serving")), html[:2000]
    status, w = api(hub, "admin", "POST", "/workloads", {"kind": "workspace", "project": "serving",
                                                         "server_name": "anywhere", "gpu_mode": "none"})
    assert status == 202 and w.get("project") == "serving", (status, w)
    try:
        deadline = time.monotonic() + 180
        while api(hub, "admin", "GET", f"/workloads/{w['name']}")[1].get("state") != "running":
            assert time.monotonic() < deadline, api(hub, "admin", "GET", f"/workloads/{w['name']}")
            time.sleep(1)
    finally:
        api(hub, "admin", "DELETE", f"/workloads/{w['name']}")
    html = HubClient(hub.url).login("vic", "gpupool-user").opener.open(hub.url + "/hub/spawn").read().decode()
    assert 'value="nlp"' not in html  # a viewer may start nothing
