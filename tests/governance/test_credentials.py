"""Project credentials on a real hub (tests/hub/hubproc.py, org.yaml of this folder): admins
create them, users attach them to a training and a workspace, the workload sees them as
environment variables and 0400 files; a value never comes back through any GET endpoint
of the OpenAPI document, any admin page, the hub/service log, the events, the audit log
or the state folder (the database holds them encrypted). On the local Kubernetes cluster
a training's and an inference's pods reference the Secret that holds them.

Workloads never print a value: they print SHA-256 digests the test compares.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import shutil
import stat
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from hubclient import HubClient
from hubclient import call as hub_call
from hubkernel import run_code
from hubproc import ACCOUNT_PREFIX, ADMIN_PW, USER_PW
from openapi_check import spec, validate

from hub_ext.host.accounts import Accounts, default_mode
from tests import chromium

from .conftest import api

pytestmark = pytest.mark.slow

ACCESS, SECRET, PASSWORD = "AKIAGPUPOOLTEST0001", "s3-secret-4b1d-value", "registry-pw-9f3e-value"
VALUES = (ACCESS, SECRET, PASSWORD)


def sha(v: str) -> str:
    return hashlib.sha256(v.encode()).hexdigest()


def call(hub, user, method, path, body=None, expect=None):
    """An API call checked against the OpenAPI document; returns the JSON body."""
    status, data = api(hub, user, method, path, body)
    validate(method, path, status, data)
    if expect is not None:
        assert status == expect, (method, path, status, data)
    return data


def error(hub, user, method, path, body, status, field=None) -> str:
    data = call(hub, user, method, path, body, expect=status)
    if field is not None:
        assert data["error"]["field"] == field, data
    return data["error"]["message"]


def ensure_credentials(hub) -> None:
    """nlp's s3 (env) and registry (files) credentials, created once per hub."""
    have = {c["name"] for c in call(hub, "admin", "GET", "/projects/nlp/credentials", expect=200)["items"]}
    if "s3" not in have:
        call(hub, "admin", "POST", "/projects/nlp/credentials", {
            "name": "s3", "description": "object store",
            "data": {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET}}, expect=201)
    if "registry" not in have:
        call(hub, "admin", "POST", "/projects/nlp/credentials",
             {"name": "registry", "delivery": "files", "data": {"password": PASSWORD}}, expect=201)


def home_of(user: str) -> Path:
    """The home of the Unix account the hub runs ``user``'s workloads as (made by now)."""
    return Accounts(mode=default_mode(), prefix=ACCOUNT_PREFIX).for_user(user).home


def run_training(hub, user, body: dict, timeout: float = 120) -> dict:
    """Submit a training and wait until it has finished; the job with its log lines."""
    call(hub, user, "POST", "/trainings", {"gpu": 0, "project": "nlp", **body}, expect=201)
    name, deadline = body["name"], time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = call(hub, user, "GET", f"/trainings/{name}", expect=200)
        if job["status"] in ("Succeeded", "Failed"):
            job["lines"] = call(hub, user, "GET", f"/trainings/{name}/logs", expect=200)["lines"]
            return job
        time.sleep(0.3)
    raise AssertionError(f"training {name} did not finish: {job}")


# The workload side: digests of what it was given, and the file's mode and owner.
CHECK = """
import hashlib, os, stat, sys
h = lambda v: hashlib.sha256(v.encode()).hexdigest()
folder = os.environ["GPUPOOL_CREDENTIALS_REGISTRY"]
f = os.path.join(folder, "password")
print("env", h(os.environ["AWS_ACCESS_KEY_ID"]), h(os.environ["AWS_SECRET_ACCESS_KEY"]))
print("file", h(open(f).read()), oct(stat.S_IMODE(os.stat(f).st_mode)),
      oct(stat.S_IMODE(os.stat(folder).st_mode)), os.stat(f).st_uid == os.getuid())
"""


def expected_lines() -> list[str]:
    return [f"env {sha(ACCESS)} {sha(SECRET)}", f"file {sha(PASSWORD)} 0o400 0o700 True"]


def test_create_shows_names_and_keys_never_values(gov_hub):
    ensure_credentials(gov_hub)
    items = call(gov_hub, "alice", "GET", "/projects/nlp/credentials", expect=200)["items"]
    s3 = next(c for c in items if c["name"] == "s3")
    assert s3["keys"] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] and s3["delivery"] == "env"
    assert s3["created_by"] == "admin" and s3["created"] > 0
    one = call(gov_hub, "alice", "GET", "/projects/nlp/credentials/registry", expect=200)
    assert one["keys"] == ["password"] and set(one) == set(s3)
    error(gov_hub, "admin", "POST", "/projects/nlp/credentials",
          {"name": "s3", "data": {"A": "b"}}, 409, "name")
    error(gov_hub, "admin", "GET", "/projects/nlp/credentials/nope", None, 404)
    error(gov_hub, "admin", "GET", "/projects/nope/credentials", None, 404)


@pytest.mark.parametrize("body, field", [
    ({"name": "Bad Name", "data": {"A": "b"}}, "name"),
    ({"name": "x" * 51, "data": {"A": "b"}}, "name"),
    ({"name": "ok", "data": {}}, "data"),
    ({"name": "ok", "data": "A=b"}, "data"),
    ({"name": "ok", "data": {"A": 5}}, "data"),
    ({"name": "ok", "data": {"1A": "b"}}, "data"),
    ({"name": "ok", "data": {"PATH": "/x"}}, "data"),
    ({"name": "ok", "data": {"GPUPOOL_X": "y"}}, "data"),
    ({"name": "ok", "delivery": "files", "data": {"../up": "y"}}, "data"),
    ({"name": "ok", "delivery": "vault", "data": {"A": "b"}}, "delivery"),
    ({"name": "ok", "data": {"A": "b"}, "value": "x"}, "value"),
    ({"name": "ok", "data": {"A": "b"}, "description": 5}, "description"),
    (b"{not json", "body"),
])
def test_bad_input_names_the_field(gov_hub, body, field):
    msg = error(gov_hub, "admin", "POST", "/projects/nlp/credentials", body, 400, field)
    assert "must" in msg or "unknown" in msg or "reserved" in msg or "set by gpupool" in msg


def test_bad_value_is_not_echoed(gov_hub):
    msg = error(gov_hub, "admin", "POST", "/projects/nlp/credentials",
                {"name": "ok", "data": {"A": "b" * 70_000}}, 400, "data")
    assert "bbbb" not in msg and "65536" in msg


@pytest.mark.parametrize("data", [
    {"TOKEN": "abc\0def"},
    {"OK": "fine", "TOKEN": "\0"},
    {"TOKEN": "trailing\0"},
])
def test_env_value_with_nul_is_refused_naming_the_key(gov_hub, data):
    """An environment string ends at its first NUL, so such a value could never reach the
    workload: refused, naming the key, and nothing stored."""
    msg = error(gov_hub, "admin", "POST", "/projects/nlp/credentials",
                {"name": "nul-env", "data": data}, 400, "data")
    assert "'TOKEN'" in msg and "NUL" in msg and "def" not in msg
    error(gov_hub, "admin", "GET", "/projects/nlp/credentials/nul-env", None, 404)


def test_files_value_may_hold_nul(gov_hub):
    """A file holds any byte: the same value is accepted with delivery 'files'."""
    call(gov_hub, "admin", "DELETE", "/projects/nlp/credentials/nul-files")
    made = call(gov_hub, "admin", "POST", "/projects/nlp/credentials",
                {"name": "nul-files", "delivery": "files", "data": {"blob": "a\0b"}}, expect=201)
    assert made["keys"] == ["blob"]
    call(gov_hub, "admin", "DELETE", "/projects/nlp/credentials/nul-files", expect=204)


@pytest.mark.parametrize("user, method, path, status", [
    ("alice", "POST", "/projects/nlp/credentials", 403),  # member: uses, does not manage
    ("vic", "POST", "/projects/nlp/credentials", 403),  # viewer
    ("olga", "POST", "/projects/nlp/credentials", 403),  # admin of another department
    ("oscar", "GET", "/projects/nlp/credentials", 403),  # nobody's member
    ("bob", "GET", "/projects/nlp/credentials", 403),  # member of another project
    ("alice", "DELETE", "/projects/nlp/credentials/s3", 403),
])
def test_non_admins_are_denied(gov_hub, user, method, path, status):
    ensure_credentials(gov_hub)
    body = {"name": "mine", "data": {"A": "b"}} if method == "POST" else None
    assert error(gov_hub, user, method, path, body, status)


def test_department_admin_manages_their_projects(gov_hub):
    call(gov_hub, "erin", "POST", "/projects/vision/credentials",
         {"name": "erins", "data": {"TOKEN": "erin-token-value"}}, expect=201)
    call(gov_hub, "erin", "DELETE", "/projects/vision/credentials/erins", expect=204)
    error(gov_hub, "erin", "DELETE", "/projects/vision/credentials/erins", None, 404)


def test_training_gets_env_and_files(gov_hub):
    ensure_credentials(gov_hub)
    job = run_training(gov_hub, "alice", {"name": "cred-train", "credentials": ["s3", "registry"],
                                          "command": [sys.executable, "-c", CHECK]})
    assert job["status"] == "Succeeded", job
    assert [ln for ln in job["lines"] if not ln.startswith("---")] == expected_lines()
    # credential files are the account's, in its home, and removed when the job ends
    assert not (home_of("alice") / ".gpupool" / "secrets" / "cred-train").exists()
    assert (home_of("alice") / ".gpupool" / "workloads" / "cred-train").is_dir()


def test_workloads_api_training_gets_them(gov_hub):
    """POST /workloads (kind training) runs through the hub's own launcher."""
    ensure_credentials(gov_hub)
    call(gov_hub, "alice", "POST", "/workloads", {
        "kind": "training", "project": "nlp", "name": "cred-wl", "gpu_mode": "none",
        "credentials": ["s3", "registry"], "command": [sys.executable, "-c", CHECK]}, expect=201)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        w = call(gov_hub, "alice", "GET", "/workloads/cred-wl", expect=200)
        if w["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.3)
    out = home_of("alice") / ".gpupool" / "workloads" / "cred-wl" / "output.log"  # the account's
    assert w["state"] == "succeeded", (w, out.read_text())
    assert out.read_text().splitlines() == expected_lines()
    assert not (home_of("alice") / ".gpupool" / "secrets" / "cred-wl").exists()


# The same check as a model server: the replica answers every GET with CHECK's lines.
SERVER = """
import contextlib, http.server, io, os
out = io.StringIO()
with contextlib.redirect_stdout(out):
    exec(CHECK)
body = out.getvalue().encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def test_inference_replica_gets_them(gov_hub):
    ensure_credentials(gov_hub)
    svc = call(gov_hub, "alice", "POST", "/inferences", {
        "name": "cred-serve", "project": "nlp", "gpu": 0.25, "min_replicas": 1, "max_replicas": 1,
        "credentials": ["s3", "registry"], "ready_path": "/",
        "command": [sys.executable, "-c", f"CHECK = {CHECK!r}\n{SERVER}"]}, expect=201)
    try:
        req = urllib.request.Request(gov_hub.url + svc["url"] + "x",
                                     headers={"Authorization": f"token {gov_hub.tokens['alice']}"})
        deadline, body = time.monotonic() + 120, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    body = r.read().decode()
                break
            except urllib.error.HTTPError as e:
                body = f"{e.code} {e.read()[:200]!r}"
                time.sleep(0.5)
        assert body.splitlines() == expected_lines(), body
    finally:
        call(gov_hub, "alice", "DELETE", "/inferences/cred-serve", expect=204)


def test_attach_checks_names(gov_hub):
    ensure_credentials(gov_hub)
    msg = error(gov_hub, "alice", "POST", "/trainings", {"name": "t-x", "project": "nlp", "gpu": 0,
                "command": ["true"], "credentials": ["nope"]}, 400, "credentials")
    assert "no credential 'nope'" in msg and "s3" in msg
    error(gov_hub, "alice", "POST", "/trainings", {"name": "t-x", "project": "nlp", "gpu": 0,
          "command": ["true"], "credentials": "s3,s3"}, 400, "credentials")
    error(gov_hub, "alice", "POST", "/workloads", {"kind": "training", "project": "nlp",
          "command": ["true"], "gpu_mode": "none", "credentials": ["Bad!"]}, 400, "credentials")


def test_workspace_gets_them(gov_hub):
    ensure_credentials(gov_hub)
    status, w = api(gov_hub, "alice", "POST", "/workloads", {
        "kind": "workspace", "project": "nlp", "gpu_mode": "none", "server_name": "creds",
        "credentials": ["s3", "registry"]})
    assert status == 202, w
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        _, u = hub_call(gov_hub.url, gov_hub.tokens["admin"], "GET", "/hub/api/users/alice", api=False)
        if (u.get("servers") or {}).get("creds", {}).get("ready"):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the workspace did not start")
    try:
        out = run_code(gov_hub.url, "/user/alice/creds/", gov_hub.tokens["alice"], CHECK)
        assert out.split("\n")[:2] == expected_lines(), out
    finally:
        assert api(gov_hub, "alice", "DELETE", "/workloads/ws-alice-creds")[0] == 204


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed")
def test_spawn_form_attaches_them(gov_hub):
    """In the browser: the form lists the chosen project's credentials (names only), the
    ticked ones reach the workspace."""
    from playwright.sync_api import sync_playwright

    ensure_credentials(gov_hub)
    with sync_playwright() as p:
        browser = chromium.launch(p)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(60_000)
            page.goto(gov_hub.url + "/hub/login")
            page.fill("#username_input", "alice")
            page.fill("#password_input", USER_PW)
            page.click("#login_submit")
            page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
            page.goto(gov_hub.url + "/hub/spawn/alice/form")
            page.select_option("#gp-project", "nlp")
            for v in VALUES:
                assert v not in page.content()
            boxes = page.locator('.gp-attach[data-project="nlp"] input[name=credentials]')
            assert sorted(boxes.evaluate_all("l => l.map(e => e.value)")) == ["registry", "s3"]
            assert page.is_hidden('.gp-attach[data-project="vision"]')
            page.check("input[name=gpu_mode][value=none]")
            page.check('.gp-attach[data-project="nlp"] input[value=s3]')
            page.check('.gp-attach[data-project="nlp"] input[value=registry]')
            page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
            page.wait_for_url(re.compile(r".*/user/alice/form/lab.*"), timeout=180_000)
        finally:
            browser.close()
    try:
        out = run_code(gov_hub.url, "/user/alice/form/", gov_hub.tokens["alice"], CHECK)
        assert out.split("\n")[:2] == expected_lines(), out
    finally:
        assert api(gov_hub, "alice", "DELETE", "/workloads/ws-alice-form")[0] == 204


def _fill(template: str, names: dict[str, str]) -> str:
    out = template
    for key, value in names.items():
        out = out.replace("{" + key + "}", value)
    return out


def admin_pages() -> list[str]:
    """Every page of the admin panel without a path parameter (pages.routes)."""
    from hub_ext.service import pages

    return [pattern.strip("/?") for pattern, *_ in pages.routes("") if "(" not in pattern]


def _page_client(hub) -> HubClient:
    return HubClient(hub.url).login("admin", ADMIN_PW)


def test_values_never_come_back(gov_hub):
    """After credentials were created, attached and delivered (the tests above run first in
    this file; ensure at least one delivery here): no GET endpoint, page, log, event or
    audit entry holds a value, and the state folder holds none outside the deliveries."""
    ensure_credentials(gov_hub)
    job = run_training(gov_hub, "alice", {"name": "cred-leak", "credentials": ["s3", "registry"],
                                          "command": [sys.executable, "-c", CHECK]})
    assert job["status"] == "Succeeded", job
    names = {"name": "s3", "project": "nlp"}
    per_path = {"/departments/{name}": "research", "/projects/{name}": "nlp",
                "/workloads/{name}": "cred-leak", "/trainings/{name}": "cred-leak",
                "/trainings/{name}/logs": "cred-leak", "/inferences/{name}": "none",
                "/projects/{project}/datasources/{name}": "none"}
    seen = 0
    for template, ops in spec()["paths"].items():
        if "get" not in ops:
            continue
        path = _fill(template, {**names, "name": per_path.get(template, "s3")})
        for user in ("admin", "alice"):
            status, data = api(gov_hub, user, "GET", path)
            text = str(data)
            for v in VALUES:
                assert v not in text, f"GET {path} as {user} returned a credential value"
            seen += 1
    assert seen >= 2 * 20
    client = _page_client(gov_hub)
    for page in admin_pages():
        html = client.opener.open(gov_hub.url + "/services/gpupool/" + page).read().decode()
        assert "gpupool" in html
        for v in VALUES:
            assert v not in html, f"page /{page} shows a credential value"
    audit = call(gov_hub, "admin", "GET", "/audit?action=credential.&limit=1000", expect=200)
    assert {e["action"] for e in audit["items"]} >= {"credential.created", "credential.used"}
    events = call(gov_hub, "admin", "GET", "/events?limit=1000", expect=200)
    for v in VALUES:
        assert v not in str(audit) and v not in str(events)
    logs = Path(gov_hub.log).read_bytes()
    assert b"credential" in logs or b"cred-leak" in logs  # the log is the hub's and the service's
    state = Path(gov_hub.workdir)
    for f in state.rglob("*"):
        if f.is_file() and "secrets" not in f.relative_to(state).parts:
            data = f.read_bytes()
            for v in VALUES:
                assert v.encode() not in data, f"{f} holds a credential value"


def test_key_file_is_private(gov_hub):
    key = Path(gov_hub.workdir) / "state" / "credentials.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_bytes().strip()) == 44  # a Fernet key


def test_openapi_documents_the_routes():
    paths = spec()["paths"]
    for p in ("/projects/{project}/credentials", "/projects/{project}/credentials/{name}", "/audit"):
        assert p in paths
    assert "data" not in spec()["components"]["schemas"]["Credential"]["properties"]
    assert yaml.safe_load(Path(__file__).with_name("org.yaml").read_text())["admins"] == ["admin"]


# -- Kubernetes ----------------------------------------------------------------------------
def test_kube_spawner_settings_build_a_valid_pod():
    """The hook for GpupoolKubeSpawner: KubeSpawner's own pod builder takes the settings."""
    from kubernetes_asyncio.client import ApiClient
    from kubespawner.objects import make_pod

    from hub_ext.attachments.attach import (
        Attachments,
        CredentialRef,
        DataSourceRef,
        kube_spawner_settings,
    )

    att = Attachments("nlp", (CredentialRef("s3", "env", ("AWS_SECRET_ACCESS_KEY",)),
                              CredentialRef("registry", "files", ("password",))),
                      (DataSourceRef("shared", "hostpath", {"path": "/srv/shared"}, "/data/shared"),))
    s = kube_spawner_settings(att, "ws-alice-credentials")

    async def build():
        pod = make_pod(name="jupyter-alice", cmd=["jupyterhub-singleuser"], port=8888,
                       image="jupyter/base", env=s["environment"], volumes=s["volumes"],
                       volume_mounts=s["volume_mounts"])
        return ApiClient().sanitize_for_serialization(pod)  # what KubeSpawner sends

    c = asyncio.run(build())["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    ref = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ws-alice-credentials", "key": "s3.AWS_SECRET_ACCESS_KEY"}
    assert env["GPUPOOL_CREDENTIALS_REGISTRY"]["value"] == "/var/run/gpupool/credentials/registry"
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/var/run/gpupool/credentials/registry",
                                                           "/data/shared"]


def test_k8s_pods_reference_the_secret(k8s_cluster):  # noqa: F811
    """Training workers and an inference replica built with attachments: applied as they
    are, the pods name the Secret's keys and volumes, and the Secret holds the values."""
    from hub_ext.attachments.attach import Attachments, CredentialRef, DataSourceRef, secret_name
    from hub_ext.serving.kubernetes import credentials_secret, replica_pod
    from hub_ext.serving.spec import parse_spec
    from hub_ext.training.pods import KubernetesOptions, training_objects
    from hub_ext.training.spec import TrainingSpec
    from scheduler.kubernetes.client import ApiError
    from tests.k8s.helpers import create_namespace, delete_pods, kube

    att = Attachments("nlp", (CredentialRef("s3", "env", ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
                              CredentialRef("registry", "files", ("password",))),
                      (DataSourceRef("imagenet", "pvc", {"claim": "imagenet-ro"}, "/data/imagenet"),
                       DataSourceRef("scratch", "nfs", {"server": "10.0.0.5", "path": "/export/scratch"},
                                     "/scratch", False)))
    values = {"s3": {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET},
              "registry": {"password": PASSWORD}}
    ns = "governance-creds"
    spec = TrainingSpec(name="ktrain", project="nlp", command=["python", "train.py"], gpu=0, workers=2)
    svc = parse_spec({"name": "kserve", "project": "nlp", "command": ["serve"], "gpu": 1})

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_namespace(kc, ns)
            await delete_pods(kc, ns)
            for kind in ("secrets", "services"):
                for name in ("ktrain-credentials", "kserve-credentials", "ktrain"):
                    try:
                        await kc.delete(f"/api/v1/namespaces/{ns}/{kind}/{name}")
                    except ApiError:
                        pass
            objs = training_objects(spec, KubernetesOptions(namespace=ns, attachments=att), values)
            assert [o["kind"] for o in objs] == ["Secret", "Service", "Pod", "Pod"]
            objs += [credentials_secret(svc, ns, values), replica_pod(svc, "kserve-1", ns, att)]
            for o in objs:
                plural = {"Secret": "secrets", "Service": "services", "Pod": "pods"}[o["kind"]]
                await kc.post(f"/api/v1/namespaces/{ns}/{plural}", o)
            # the inference backend writes the service's Secret again on every replica start (apply)
            secrets_path = f"/api/v1/namespaces/{ns}/secrets"
            rotated = {**values, "registry": {"password": PASSWORD + "-2"}}
            await kc.apply(secrets_path, credentials_secret(svc, ns, rotated))
            kept = await kc.get(f"{secrets_path}/{secret_name('kserve')}")
            assert base64.b64decode(kept["data"]["registry.password"]).decode() == PASSWORD + "-2"
            await kc.apply(secrets_path, credentials_secret(svc, ns, values))
            pods = [await kc.get(f"/api/v1/namespaces/{ns}/pods/{n}") for n in ("ktrain-0", "ktrain-1", "kserve-1")]
            secrets = {n: await kc.get(f"/api/v1/namespaces/{ns}/secrets/{n}")
                       for n in (secret_name("ktrain"), secret_name("kserve"))}
            await delete_pods(kc, ns)
            return pods, secrets

    pods, secrets = asyncio.run(go())
    for pod in pods:
        owner = "ktrain" if pod["metadata"]["name"].startswith("ktrain") else "kserve"
        secret = secrets[secret_name(owner)]
        c = pod["spec"]["containers"][0]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
        assert set(refs) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        for var, ref in refs.items():
            assert ref["name"] == secret["metadata"]["name"]
            assert base64.b64decode(secret["data"][ref["key"]]).decode() == values["s3"][var]
        plain = {e["name"]: e.get("value") for e in c["env"]}
        assert plain["GPUPOOL_CREDENTIALS_REGISTRY"] == "/var/run/gpupool/credentials/registry"
        assert plain["GPUPOOL_DATA_IMAGENET"] == "/data/imagenet"
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vols["cred-registry"]["secret"]["secretName"] == secret["metadata"]["name"]
        assert vols["cred-registry"]["secret"]["defaultMode"] == 0o400
        item = vols["cred-registry"]["secret"]["items"][0]
        assert base64.b64decode(secret["data"][item["key"]]).decode() == PASSWORD
        assert vols["data-imagenet"]["persistentVolumeClaim"] == {"claimName": "imagenet-ro", "readOnly": True}
        assert vols["data-scratch"]["nfs"] == {"server": "10.0.0.5", "path": "/export/scratch"}
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["cred-registry"]["mountPath"] == "/var/run/gpupool/credentials/registry"
        assert mounts["data-imagenet"] == {"name": "data-imagenet", "mountPath": "/data/imagenet", "readOnly": True}
        assert mounts["data-scratch"]["mountPath"] == "/scratch" and not mounts["data-scratch"].get("readOnly")
        for v in VALUES:  # the pod itself holds references only
            assert v not in str(pod)
