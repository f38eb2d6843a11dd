"""Policies per department and project (hub_ext/org/policy.py), against a real hub: every
policy field through every door (the spawn form, the REST API, the CLI, the notebook
widget), within, at and beyond its limit. Beyond is a 400 naming the policy and the field;
a project's policy can never widen its department's; every change is audited."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse

import pytest
from hubclient import HubClient, call
from hubproc import ADMIN_PW, USER_PW, Hub

from hub_ext.org import policy
from hub_ext.requests.rules import Limits, parse_request
from hub_ext.validation import FieldError
from tests.waits import wait_for

pytest.importorskip("ipywidgets")
from gpupool.widgets import JobLauncher, http_client  # noqa: E402

CONFIG = """c = get_config()  # noqa
c.Gpupool.environments = {
    "default": {"display": "Python 3 (hub environment)", "image": ""},
    "torch": {"display": "PyTorch", "image": "", "prefix": ""},
}
c.Gpupool.declared_gpus = [
    {"node": "local", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 4},
]
c.Gpupool.cull_every_s = 1
"""

# The department's policy, and the project's that narrows it.
DEPARTMENT = {"gpu_fraction_max": 0.75, "gpus_max": 3, "gpu_memory_gib_max": 40, "cpu_max": 8,
              "memory_gib_max": 32, "templates": ["small", "medium"],
              "environments": ["default", "torch"], "node_pools": ["default"],
              "gpu_models": ["NVIDIA H100 80GB HBM3"],
              **{f"idle_timeout_{k}_s": 3600 for k in policy.KINDS}}
PROJECT = {"gpu_fraction_max": 0.5, "gpus_max": 2, "gpu_memory_gib_max": 20, "cpu_max": 4,
           "memory_gib_max": 16, "templates": ["small"], "environments": ["default"]}

# field -> (base request, field, at the limit, within, beyond, the refusal's words)
FIELDS = {
    "gpu_fraction": ({"gpu_mode": "fraction"}, "gpu_fraction", 0.5, 0.25, 0.75,
                     "project nlp's policy allows at most 0.5, got 0.75"),
    "gpus": ({"gpu_mode": "whole"}, "gpus", 2, 1, 3, "project nlp's policy allows at most 2, got 3"),
    "gpu_memory_gib": ({"gpu_mode": "memory"}, "gpu_memory_gib", 20, 10, 30,
                       "project nlp's policy allows at most 20, got 30"),
    "cpu": ({}, "cpu", 4, 2, 6, "project nlp's policy allows at most 4, got 6"),
    "memory_gib": ({}, "memory_gib", 16, 8, 24, "project nlp's policy allows at most 16, got 24"),
    "template": ({}, "template", "small", "small", "medium",
                 "project nlp's policy allows only small, got 'medium'"),
    "environment": ({}, "environment", "default", "default", "torch",
                    "project nlp's policy allows only default, got 'torch'"),
}
LEVELS = ("within", "at", "beyond")


@pytest.fixture(scope="module")
def phub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("policy-hub"), config=CONFIG).start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "bob")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    admin = h.tokens["admin"]
    assert call(h.url, admin, "PUT", "/departments/research/policy", DEPARTMENT)[0] == 200
    assert call(h.url, admin, "PUT", "/projects/nlp/policy", PROJECT)[0] == 200
    h.form = HubClient(h.url).login("alice", USER_PW)
    yield h
    h.stop()


def _body(field: str, value) -> dict:
    base, name, *_ = FIELDS[field]
    return {"project": "nlp", **base, name: value}


def _value(field: str, level: str):
    _, _, at, within, beyond, _ = FIELDS[field]
    return {"within": within, "at": at, "beyond": beyond}[level]


def _rest(h: Hub, body: dict) -> tuple[int, dict]:
    """A training through POST /workloads: the same rules as a workspace, and it ends."""
    code, out = call(h.url, h.tokens["alice"], "POST", "/workloads",
                     {**body, "kind": "training", "command": ["true"]})
    if code == 201:
        call(h.url, h.tokens["alice"], "DELETE", f"/workloads/{out['name']}")
    return code, out


def _refusal(out: dict) -> str:
    err = out.get("error", {})
    return f"{err.get('field')}: {err.get('message')}"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("field", FIELDS)
def test_rest(phub, field, level):
    code, out = _rest(phub, _body(field, _value(field, level)))
    if level == "beyond":
        assert code == 400 and _refusal(out) == f"{FIELDS[field][1]}: {FIELDS[field][5]}", out
    else:
        assert code == 201, out


def _cli(h: Hub, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUPOOL_URL": h.url, "GPUPOOL_TOKEN": h.tokens["alice"]}
    return subprocess.run([sys.executable, "-m", "hub_ext.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


CLI_OPTIONS = {"gpu_fraction": "--fraction", "gpus": "--gpus", "gpu_memory_gib": "--gpu-memory",
               "cpu": "--cpu", "memory_gib": "--memory", "template": "--template",
               "environment": "--environment"}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("field", FIELDS)
def test_cli(phub, field, level):
    value = _value(field, level)
    r = _cli(phub, "workspace", "start", f"cli-{field.replace('_', '-')}-{level}", "--project", "nlp",
             "--preemptible", CLI_OPTIONS[field], str(value))
    if level == "beyond":
        assert r.returncode != 0 and f"{FIELDS[field][1]}: {FIELDS[field][5]} (HTTP 400)" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    name = r.stdout.split(":")[0]
    assert _cli(phub, "workspace", "stop", name).returncode == 0
    _remove_server(phub, f"cli-{field.replace('_', '-')}-{level}")


def _remove_server(h: Hub, server: str) -> None:
    """Named servers count against the hub's limit per user until removed."""


    wait_for(lambda: call(h.url, h.tokens["alice"], "DELETE", f"/hub/api/users/alice/servers/{server}",
                          {"remove": True}, api=False)[0] in (202, 204, 404), f"server {server} removed")


# The widget submits trainings: its GPU field is a fraction below 1, whole GPUs from 1, sent
# as gpu_fraction or gpus.
WIDGET = {"gpu_fraction": (0.25, 0.5, 0.75, "gpu_fraction: project nlp's policy allows at most 0.5, got 0.75"),
          "gpus": (1, 2, 3, "gpus: project nlp's policy allows at most 2, got 3")}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("field", WIDGET)
def test_widget(phub, field, level):
    within, at, beyond, words = WIDGET[field]
    ui = JobLauncher(client=http_client(phub.url, phub.tokens["alice"]))
    ui.project.value = "nlp"
    ui.name.value, ui.command.value = f"w-{field.replace('_', '-')}-{level}", "true"
    ui.gpu.value = {"within": within, "at": at, "beyond": beyond}[level]
    t = ui.submit()
    if level == "beyond":
        assert t is None and words in html.unescape(ui.message.value), ui.message.value
    else:
        assert t is not None, ui.message.value
        call(phub.url, phub.tokens["alice"], "DELETE", f"/trainings/{t['name']}")


def _form(h: Hub, server: str, fields: dict) -> str:
    c = h.form
    page = c.opener.open(f"{h.url}/hub/spawn/alice/{server}").read().decode()
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page)
    data = {"project": "nlp", **{k: str(v) for k, v in fields.items()}}
    data["_xsrf"] = xsrf.group(1) if xsrf else c._xsrf()
    try:
        r = c.opener.open(f"{h.url}/hub/spawn/alice/{server}", urllib.parse.urlencode(data).encode())
    except urllib.error.HTTPError as e:
        return e.read().decode()
    return r.read().decode()


@pytest.mark.parametrize("field", FIELDS)
def test_form_refuses_beyond_the_limit(phub, field):
    page = _form(phub, "beyond", _body(field, _value(field, "beyond")))
    assert FIELDS[field][5] in html.unescape(page), page[-2000:]


def test_form_at_every_limit_starts(phub):
    """One workspace at every limit of the project's policy at once (a start is costly)."""
    page = _form(phub, "at-limits", {"gpu_mode": "fraction", "gpu_fraction": 0.5, "cpu": 4,
                                     "memory_gib": 16, "template": "small", "environment": "default"})
    assert "policy allows" not in page
    code, out = call(phub.url, phub.tokens["alice"], "GET", "/workloads?kind=workspace")
    mine = [w for w in out["items"] if w["name"] == "ws-alice-at-limits"]
    assert mine and mine[0]["spec"]["template"] == "small" and mine[0]["spec"]["cpu"] == 4
    call(phub.url, phub.tokens["alice"], "DELETE", "/workloads/ws-alice-at-limits")
    _remove_server(phub, "at-limits")


# -- a project's policy narrows, never widens ----------------------------------------------------
@pytest.mark.parametrize("key, value", [
    ("gpu_fraction_max", 1.0), ("gpus_max", 4), ("gpu_memory_gib_max", 80), ("cpu_max", 16),
    ("memory_gib_max", 64), ("templates", ["small", "large"]), ("environments", ["other"]),
    ("node_pools", ["default", "fast"]), ("gpu_models", ["NVIDIA A100"]),
    *[(f"idle_timeout_{k}_s", 7200) for k in policy.KINDS],
])
def test_a_project_policy_cannot_widen_its_department(phub, key, value):
    code, out = call(phub.url, phub.tokens["admin"], "PUT", "/projects/vision/policy", {key: value})
    assert code == 400 and out["error"]["field"] == key, out
    assert "department research's policy allows" in out["error"]["message"]
    assert "can only narrow" in out["error"]["message"]


def test_policy_changes_are_audited_and_need_a_manager(phub):
    admin = phub.tokens["admin"]
    assert call(phub.url, admin, "PUT", "/projects/vision/policy", {"cpu_max": 2})[0] == 200
    code, out = call(phub.url, admin, "GET", "/audit?action=policy.updated")
    entry = next(e for e in out["items"] if e["target"] == "project/vision")
    assert entry["actor"] == "admin" and entry["details"]["after"] == {"cpu_max": 2}
    code, out = call(phub.url, phub.tokens["alice"], "PUT", "/projects/vision/policy", {})
    assert code == 403
    code, out = call(phub.url, phub.tokens["alice"], "GET", "/projects/nlp/policy")
    assert code == 200 and out["effective"]["cpu_max"] == {"value": 4, "policy": "project nlp's policy"}
    assert out["effective"]["gpu_models"]["policy"] == "department research's policy"
    assert call(phub.url, admin, "PUT", "/projects/vision/policy", {})[0] == 200


def test_cli_sets_and_shows_a_policy(phub):
    env = {**os.environ, "GPUPOOL_URL": phub.url, "GPUPOOL_TOKEN": phub.tokens["admin"]}

    def run(*a):
        return subprocess.run([sys.executable, "-m", "hub_ext.cli", "policy", *a], env=env,
                              capture_output=True, text=True, timeout=60)
    r = run("set", "project", "vision", "cpu_max=3", "templates=small", "idle_timeout_training_s=900",
            "idle_timeout_inference_s=300")
    assert r.returncode == 0 and "cpu_max=3" in r.stdout, r.stderr
    assert "idle_timeout_training_s=900, idle_timeout_inference_s=300" in r.stdout, r.stdout
    r = run("set", "project", "vision", "cpu_max=99")
    assert r.returncode != 0 and "cpu_max: department research's policy allows at most 8" in r.stderr
    r = run("set", "project", "vision", "--clear")
    assert r.returncode == 0 and "no policy" in r.stdout


def test_an_unknown_policy_key_names_itself(phub):
    code, out = call(phub.url, phub.tokens["admin"], "PUT", "/departments/ops/policy", {"gpu_max": 1})
    assert code == 400 and out["error"]["field"] == "gpu_max"
    code, out = call(phub.url, phub.tokens["admin"], "PUT", "/departments/ops/policy", {"cpu_max": -1})
    assert code == 400 and out["error"]["field"] == "cpu_max"


# -- the merge, without a hub -------------------------------------------------------------------
def test_defaults_come_from_the_template_then_the_policy():
    eff = policy.effective("research", {"cpu_default": 3, "cpu_max": 8}, "nlp", {"memory_gib_default": 6})
    limits = Limits(projects=("nlp",), policies={"nlp": eff},
                    templates={"small": {"gpu_mode": "fraction", "gpu_fraction": 0.25, "cpu": 2}})
    req = parse_request({}, limits)
    assert (req.cpu, req.memory_gib) == (3, 6)
    req = parse_request({"template": "small"}, limits)
    assert (req.cpu, req.gpu_fraction, req.template) == (2, 0.25, "small")
    req = parse_request({"template": "small", "cpu": 5}, limits)
    assert req.cpu == 5  # a field given overrides the template


def test_a_department_narrowed_later_still_binds_its_project():
    eff = policy.effective("research", {"cpu_max": 2}, "nlp", {"cpu_max": 4})
    with pytest.raises(FieldError, match="cpu: department research's policy allows at most 2, got 3"):
        parse_request({"cpu": 3}, Limits(projects=("nlp",), policies={"nlp": eff}))


def test_node_pool_and_gpu_model_policies():
    eff = policy.effective("d", {"node_pools": ["fast"], "gpu_models": ["A"]}, "p", {})
    limits = Limits(projects=("p",), policies={"p": eff}, node_pools=("default", "fast"),
                    gpu_models=("A", "B"))
    req = parse_request({}, limits)
    assert (req.node_pool, req.gpu_model) == ("fast", "A")
    with pytest.raises(FieldError, match="node_pool: department d's policy allows only fast"):
        parse_request({"node_pool": "default"}, limits)
    with pytest.raises(FieldError, match="gpu_model: department d's policy allows only A"):
        parse_request({"gpu_model": "B"}, limits)


# -- idle timeouts per kind (workspace, training, inference) -------------------------------------
IDLE = {"within": 600, "at": 3600, "beyond": 7200}  # the department allows at most 3600


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", policy.KINDS)
def test_a_project_idle_timeout_within_at_and_beyond_its_department(phub, kind, level):
    admin, key = phub.tokens["admin"], f"idle_timeout_{kind}_s"
    try:
        code, out = call(phub.url, admin, "PUT", "/projects/vision/policy", {key: IDLE[level]})
        if level == "beyond":
            assert code == 400 and _refusal(out) == (
                f"{key}: department research's policy allows at most 3600; a project's policy can "
                "only narrow it, got 7200"), out
            return
        assert code == 200, out
        code, out = call(phub.url, phub.tokens["alice"], "GET", "/projects/vision/policy")
        assert out["effective"][key] == {"value": IDLE[level], "policy": "project vision's policy"}
    finally:
        call(phub.url, admin, "PUT", "/projects/vision/policy", {})


def test_the_policies_page_sets_an_idle_timeout_and_shows_the_refusal(phub, browser):
    """The admin panel's Policies page: an idle timeout saved in a project's row lands in
    its policy; one wider than the department's is refused with the API's words."""
    from tests import chromium

    page = chromium.login(browser, phub.url, "admin", ADMIN_PW)
    page.goto(phub.url + "/services/gpupool/policies")
    assert "idle_timeout_training_s, idle_timeout_inference_s" in page.inner_text("main")
    row = page.locator('tr[data-scope="project"][data-name="vision"]')
    try:
        for value, words in ((900, "Saved project vision"),
                             (7200, "idle_timeout_inference_s: department research's policy allows at most 3600")):
            row.locator("textarea").fill(f'{{"idle_timeout_inference_s": {value}}}')
            row.locator("button").click()
            page.wait_for_function("w => document.getElementById('msg').textContent.includes(w)", arg=words)
        code, out = call(phub.url, phub.tokens["admin"], "GET", "/projects/vision/policy")
        assert out["policy"] == {"idle_timeout_inference_s": 900}, out
    finally:
        call(phub.url, phub.tokens["admin"], "PUT", "/projects/vision/policy", {})


@pytest.mark.parametrize("kind", policy.KINDS)
def test_an_idle_timeout_is_whole_seconds_from_one_second_to_a_year(kind):
    key = f"idle_timeout_{kind}_s"
    for ok in (1, policy.MAX_SECONDS):
        assert policy.parse({key: ok}) == {key: ok}
    for bad in (0, policy.MAX_SECONDS + 1, 1.5, "soon", True):
        with pytest.raises(FieldError) as e:
            policy.parse({key: bad})
        assert e.value.field == key


def test_a_policy_default_above_its_max_is_refused():
    with pytest.raises(FieldError, match="cpu_default: must be at most cpu_max"):
        policy.parse({"cpu_default": 4, "cpu_max": 2})



# -- maximum runtime (the culler, hub_ext/service/culler.py) --------------------------------------
def test_maximum_runtime_ends_a_training_and_a_workspace_with_an_event(phub):


    admin, alice = phub.tokens["admin"], phub.tokens["alice"]
    assert call(phub.url, admin, "PUT", "/projects/vision/policy",
                # long enough for the workspace to finish starting first
                {"max_runtime_training_s": 3, "max_runtime_workspace_s": 30})[0] == 200
    try:
        code, t = call(phub.url, alice, "POST", "/trainings",
                       {"name": "long-run", "project": "vision", "command": ["sleep", "600"], "gpu": 0.25})
        assert code in (201, 202), t
        code, w = call(phub.url, alice, "POST", "/workloads",
                       {"kind": "workspace", "project": "vision", "server_name": "long-ws"})
        assert code in (201, 202), w

        def ended(name):
            items = call(phub.url, alice, "GET", f"/events?workload={name}")[1]["items"]
            return [e for e in items if e["kind"] == "stopped" and "maximum runtime" in e["message"]]

        for name, kind, most in (("long-run", "training", 3), ("ws-alice-long-ws", "workspace", 30)):
            ev = wait_for(lambda name=name: ended(name), f"{name} ended by its maximum runtime",
                          timeout=120)[0]
            assert ev["kind"] == "stopped"
            assert f"maximum runtime of a {kind} ({most} s, project vision's policy)" in ev["message"]
        wait_for(lambda: call(phub.url, alice, "GET", "/trainings/long-run")[1]["status"] == "Suspended",
                 "the training ended")
        # its status says why, not "suspended by a user"
        assert call(phub.url, alice, "GET", "/trainings/long-run")[1]["reason"] == (
            "reached the maximum runtime of a training (3 s, project vision's policy)")
        def workspace_ended():  # one read: the row may go between two
            code, w = call(phub.url, alice, "GET", "/workloads/ws-alice-long-ws")
            return code == 404 or (code == 200 and w["state"] == "stopped")
        wait_for(workspace_ended, "the workspace ended")
    finally:
        call(phub.url, admin, "PUT", "/projects/vision/policy", {})
        call(phub.url, alice, "DELETE", "/trainings/long-run")


# -- environments (Gpupool.environments: prefix and start command) -------------------------------
def test_an_environment_puts_its_prefix_first_and_runs_its_start_command(tmp_path):
    from hub_ext.host.launch import in_environment

    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    tool = prefix / "bin" / "envtool"
    tool.write_text("#!/bin/sh\necho tool-from-env $GPUPOOL_STARTED\n")
    tool.chmod(0o755)
    env, argv = in_environment({"prefix": str(prefix), "start_command": "export GPUPOOL_STARTED=yes"},
                               {"PATH": "/usr/bin:/bin"}, ["envtool"])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "tool-from-env yes", out
    assert env["VIRTUAL_ENV"] == str(prefix)
    assert in_environment(None, {"PATH": "/bin"}, ["x"]) == ({"PATH": "/bin"}, ["x"])


# -- CPU and memory quotas of projects (the scheduler holds work to them) -------------------------
def test_a_project_cpu_quota_holds_work_back_with_its_reason(phub):
    admin, alice = phub.tokens["admin"], phub.tokens["alice"]
    code, out = call(phub.url, admin, "PATCH", "/projects/vision", {"cpu_quota": 3, "memory_quota_gib": 64})
    assert code == 200 and (out["cpu_quota"], out["memory_quota_gib"]) == (3, 64), out
    body = {"kind": "training", "project": "vision", "command": ["sleep", "120"], "cpu": 2,
            "memory_gib": 4, "gpu_mode": "none"}
    try:
        code, out = call(phub.url, alice, "POST", "/workloads", {**body, "cpu": 4, "name": "cpu-never"})
        assert code == 400 and out["error"]["field"] == "cpu", out
        assert out["error"]["message"] == "project vision's CPU quota is 3 CPUs, got 4"
        assert call(phub.url, alice, "POST", "/workloads", {**body, "name": "cpu-first"})[0] == 201
        wait_for(lambda: call(phub.url, alice, "GET", "/workloads/cpu-first")[1]["state"] == "running",
                 "the first workload runs")
        assert call(phub.url, alice, "POST", "/workloads", {**body, "name": "cpu-second"})[0] == 201
        got = wait_for(lambda: (lambda r: r["reason"] if r["state"] == "pending" and r["reason"] else None)(
            call(phub.url, alice, "GET", "/workloads/cpu-second")[1]), "a pending reason")
        assert got == "project vision is at its CPU quota (2 of 3 CPUs in use, 2 more asked)"
        code, out = call(phub.url, admin, "PATCH", "/projects/vision", {"cpu_quota": -1})
        assert code == 400 and out["error"]["field"] == "cpu_quota"
    finally:
        for name in ("cpu-first", "cpu-second"):
            call(phub.url, alice, "DELETE", f"/workloads/{name}")
        call(phub.url, admin, "PATCH", "/projects/vision", {"cpu_quota": None, "memory_quota_gib": None})
