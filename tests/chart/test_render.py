"""The chart without installing it: ``helm lint``, ``helm template`` with several value sets
validated server-side by the local API server (dry-run apply), and the values schema
(bad values fail at install with a message naming the field)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json

import pytest
import yaml

from scheduler.kubernetes.testcluster import ClusterInfo, client_for

from .chartlib import CHART, RELEASE, Discovery, by_kind, dry_run_apply, helm_run, render

OIDC = {"hub": {"auth": {"type": "oidc", "oidc": {
    "issuer": "https://idp.example.org/realms/gpupool", "clientId": "gpupool",
    "clientSecret": "s3cret", "callbackUrl": "https://gpupool.example.org/hub/oauth_callback",
    "adminGroups": ["gpupool-admins"]}}}}
VALUE_SETS = {
    "default": {},
    "oidc": OIDC,
    "no-activator": {"activator": {"enabled": False}, "networkPolicy": {"enabled": False},
                     "hub": {"db": {"pvc": {"enabled": False}}}},
    "custom-images": {
        "imageRegistry": "registry.example.org/ml", "imagePullSecrets": [{"name": "regcred"}],
        "hub": {"image": {"repository": "hub", "tag": "1.2.3"},
                "workspaces": {"environments": {
                    "default": {"display": "Python"},
                    "pytorch": {"display": "PyTorch", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}},
                    "vscode": False}},  # an image without code-server
        "scheduler": {"image": {"repository": "sched", "tag": "1.2.3"}, "replicas": 2,
                      "topologyKey": "gpupool.io/rack", "consolidateInQuota": False, "gpuReservations": True},
    },
    "agent-capacity-no-org": {"nodeAgent": {"advertiseCapacity": True, "runtimeClassName": "nvidia",
                                            "nodeSelector": {"nvidia.com/gpu.present": "true"},
                                            "declaredGpus": {"count": 2, "model": "NVIDIA L4"}},
                              "organisation": {"create": False}},
}


def _container(objs, kind, name) -> dict:
    return by_kind(objs, kind)[name]["spec"]["template"]["spec"]["containers"][0]


def _env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def test_helm_lint(helm):
    p = helm_run(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in p.stdout
    for name, values in VALUE_SETS.items():
        args = ["lint", "--strict", str(CHART)]
        if values:
            args += ["--set-json", ",".join(f"{k}={json.dumps(v)}" for k, v in values.items())]
        assert helm_run(helm, *args).returncode == 0, name


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_template_validated_by_the_api_server(helm, chart_cluster: ClusterInfo, tmp_path, name):
    ns = f"render-{name}"[:40]
    objs = render(helm, tmp_path, VALUE_SETS[name], ns)
    kinds = {o["kind"] for o in objs}
    assert {"ServiceAccount", "ClusterRole", "Deployment", "DaemonSet", "ConfigMap", "Secret",
            "Service", "Role"} <= kinds
    for o in objs:  # everything the chart makes carries its labels
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE, o["metadata"]
    check_value_set(name, objs, ns)

    async def go():
        async with client_for(chart_cluster) as kc:
            try:
                await kc.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": ns}})
            except Exception:
                pass
            disc = Discovery(kc)
            errors = []
            for o in objs:
                try:
                    got = await dry_run_apply(kc, disc, o, ns)
                    assert got["kind"] == o["kind"]
                except Exception as e:  # collect all, report together
                    errors.append(f"{o['kind']}/{o['metadata']['name']}: {e}")
            return errors

    assert asyncio.run(go()) == []


def check_value_set(name: str, objs: list[dict], ns: str = "default") -> None:
    hub = _container(objs, "Deployment", "gpupool-hub")
    sched = _container(objs, "Deployment", "gpupool-scheduler")
    cfg = by_kind(objs, "ConfigMap")["gpupool-hub-config"]["data"]["gpupool_config.py"]
    assert 'c.GpupoolKubeSpawner.gpupool_scheduler_name = "gpupool"' in cfg
    assert "--lease-name=gpupool-scheduler" in sched["args"]
    if name != "custom-images":
        assert "--consolidate-in-quota=on" in sched["args"]
    assert "c.KubeSpawner.automount_service_account_token = False" in cfg
    if name == "default":
        assert _env(hub)["GPUPOOL_AUTH"] == "shared-password"
        assert hub["image"] == "ghcr.io/gpupool/gpupool-hub:0.1.0"
        assert {"gpupool-activator", "gpupool-hub", "gpupool-scheduler"} <= set(by_kind(objs, "Deployment"))
        assert set(by_kind(objs, "Project")) == {"nlp", "vision", "serving"}
        assert by_kind(objs, "Project")["nlp"]["spec"] == {
            "department": "research", "quotas": {"default": {"gpus": 1, "overQuotaWeight": 1,
                                                             "limit": 3}}}
        assert len(by_kind(objs, "NetworkPolicy")) == 5
        org = yaml.safe_load(by_kind(objs, "ConfigMap")["gpupool-hub-config"]["data"]["org.yaml"])
        assert org["departments"][0]["projects"][0]["members"] == ["alice", "bob", "admin"]
        secret = by_kind(objs, "Secret")["gpupool-hub"]["data"]
        assert set(secret) == {"user-password", "admin-password"}
        # the activator checks callers' tokens with the hub's REST API, with a service token
        # of its own (generated), which the hub registers (GPUPOOL_ACTIVATOR_TOKEN)
        act = _container(objs, "Deployment", "gpupool-activator")
        token_ref = {"secretKeyRef": {"name": "gpupool-activator", "key": "hub-token"}}
        assert _env(act)["GPUPOOL_ACTIVATOR_TOKEN"] == token_ref
        assert _env(hub)["GPUPOOL_ACTIVATOR_TOKEN"] == token_ref
        hub_token = base64.b64decode(by_kind(objs, "Secret")["gpupool-activator"]["data"]["hub-token"])
        assert len(hub_token) == 48 and hub_token.isalnum()
        cmd = act["command"]
        assert cmd[cmd.index("--hub-url") + 1] == \
            f"http://gpupool-hub.{ns}.svc/services/gpupool/"
        assert cmd[cmd.index("--auth-cache") + 1] == "30"
        # its NetworkPolicy lets it reach the hub's proxy port, nothing else of the hub
        egress = by_kind(objs, "NetworkPolicy")["gpupool-activator"]["spec"]["egress"]
        to_hub = [e for e in egress if any(
            t.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "hub"
            for t in e.get("to", []))]
        assert [e["ports"] for e in to_hub] == [[{"protocol": "TCP", "port": 8000}]]
    elif name == "oidc":
        env = _env(hub)
        assert env["GPUPOOL_AUTH"] == "oidc"
        assert env["GPUPOOL_OIDC_ISSUER"] == "https://idp.example.org/realms/gpupool"
        assert env["GPUPOOL_OIDC_ADMIN_GROUPS"] == '["gpupool-admins"]'
        assert env["GPUPOOL_OIDC_CLIENT_SECRET"] == {
            "secretKeyRef": {"name": "gpupool-hub", "key": "oidc-client-secret"}}
        assert "oidc-client-secret" in by_kind(objs, "Secret")["gpupool-hub"]["data"]
    elif name == "no-activator":
        assert not [o for o in objs if o["metadata"]["name"].startswith("gpupool-activator")]
        assert "NetworkPolicy" not in {o["kind"] for o in objs}
        assert "PersistentVolumeClaim" not in {o["kind"] for o in objs}
        vols = by_kind(objs, "Deployment")["gpupool-hub"]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "state", "emptyDir": {}} in vols
    elif name == "custom-images":
        assert hub["image"] == "registry.example.org/ml/hub:1.2.3"
        assert sched["image"] == "registry.example.org/ml/sched:1.2.3"
        assert "--topology-key=gpupool.io/rack" in sched["args"]
        assert "--consolidate-in-quota=off" in sched["args"]  # on by default (record 0050)
        # GPU reservations: the flag, the scheduler's image for the reservation pods, their
        # service account, which may only patch pods of the release namespace
        assert "--gpu-reservations" in sched["args"]
        assert "--reservation-image=registry.example.org/ml/sched:1.2.3" in sched["args"]
        assert by_kind(objs, "Role")["gpupool-scheduler-reservation"]["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
        assert "gpupool-scheduler-reservation" in by_kind(objs, "ServiceAccount")
        assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]} in \
            by_kind(objs, "ClusterRole")["gpupool-scheduler"]["rules"]
        assert by_kind(objs, "Deployment")["gpupool-scheduler"]["spec"]["replicas"] == 2
        for d in by_kind(objs, "Deployment").values():
            assert d["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert '"pytorch":"nvcr.io/nvidia/pytorch:25.01-py3"' in cfg
        assert '"default":"registry.example.org/ml/gpupool-workspace:0.1.0"' in cfg
        # trainings and inference services without an image run the workspace image
        assert 'c.Gpupool.workload_image = "registry.example.org/ml/gpupool-workspace:0.1.0"' in cfg
        act = _container(objs, "Deployment", "gpupool-activator")["command"]
        assert act[act.index("--default-image") + 1] == "registry.example.org/ml/gpupool-workspace:0.1.0"
        assert 'c.KubeSpawner.image_pull_secrets = ["regcred"]' in cfg
    elif name == "agent-capacity-no-org":
        assert "Department" not in {o["kind"] for o in objs}
        role = by_kind(objs, "ClusterRole")["gpupool-node-agent"]
        assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in role["rules"]
        ds = by_kind(objs, "DaemonSet")["gpupool-node-agent"]["spec"]["template"]["spec"]
        assert ds["runtimeClassName"] == "nvidia"
        assert "--advertise-capacity" in ds["containers"][0]["args"]
        # where NVML finds no GPU, the declared ones (the agent's --declared-gpus JSON)
        assert '--declared-gpus={"count":2,"memory_mib":81559,"model":"NVIDIA L4"}' in \
            ds["containers"][0]["args"]


# ------------------------------------------------------------------------------- schema
def _set(path: str, value):
    """A full values dict with one field changed (lists are replaced whole by --set)."""
    values = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text()))
    keys = path.split(".")
    cur = values
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    last = keys[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return values


BAD = [
    ("hub.auth.type", "ldap", "at '/hub/auth/type': value must be one of"),
    ("scheduler.replicas", -1, "at '/scheduler/replicas': minimum"),
    ("scheduler.replica", 2, "at '/scheduler': additional properties 'replica' not allowed"),
    ("organisation.departments.0.projects.0.name", "Bad_Name",
     "at '/organisation/departments/0/projects/0/name'"),
    ("organisation.departments.1.gpus", -2, "at '/organisation/departments/1/gpus': minimum"),
    ("hub.workspaces.storage.capacity", "lots", "at '/hub/workspaces/storage/capacity'"),
    ("hub.auth.sharedPassword.adminPassword", "short",
     "at '/hub/auth/sharedPassword/adminPassword'"),
    ("nodeAgent.hostLibDir", "relative/dir", "at '/nodeAgent/hostLibDir'"),
    ("nodeAgent.declaredGpus.count", -1, "at '/nodeAgent/declaredGpus/count': minimum"),
    ("imagePullPolicy", "Sometimes", "at '/imagePullPolicy'"),
    ("activator.hubToken", "short", "at '/activator/hubToken'"),
    ("activator.authCacheSeconds", -1, "at '/activator/authCacheSeconds': minimum"),
    ("hub.auth.oidc.issuer", "", None),  # with type oidc below: issuer and client id required
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] for b in BAD])
def test_bad_values_fail_install_naming_the_field(helm, chart_cluster, tmp_path, path, value,
                                                  message):
    values = _set(path, value)
    if path.startswith("hub.auth.oidc"):
        values["hub"]["auth"]["type"] = "oidc"
        message = "at '/hub/auth/oidc/clientId': minLength"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(values))
    p = helm_run(helm, "install", "bad", str(CHART), "-n", "bad-values", "--create-namespace",
                 "-f", str(f), info=chart_cluster, check=False)
    assert p.returncode != 0
    assert "values don't meet the specifications of the schema" in p.stderr
    assert message in p.stderr, p.stderr
    if path.startswith("hub.auth.oidc"):
        assert "at '/hub/auth/oidc/issuer'" in p.stderr
    # nothing was installed
    assert "bad" not in helm_run(helm, "list", "-A", "-q", info=chart_cluster).stdout.split()


def test_dry_run_reports_what_only_the_api_server_checks(helm, chart_cluster, tmp_path):
    """The dry run is a real validation: a quota limit under the quota passes the values
    schema but the Project CRD's rule rejects it on the server."""
    values = _set("organisation.departments.0.projects.0.limit", 0.5)
    objs = [o for o in render(helm, tmp_path, values, "render-bad") if o["kind"] == "Project"]

    async def go():
        async with client_for(chart_cluster) as kc:
            disc = Discovery(kc)
            return [await _dry_run_error(kc, disc, o) for o in objs]

    errors = dict(zip([o["metadata"]["name"] for o in objs], asyncio.run(go())))
    assert "limit must be greater than or equal to the quota" in errors["nlp"]
    assert errors["vision"] is None


async def _dry_run_error(kc, disc, obj) -> str | None:
    try:
        await dry_run_apply(kc, disc, obj, "render-bad")
    except Exception as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_hub_config_loads(helm, tmp_path, monkeypatch, name):
    """The hub's gpupool_config.py, with the environment its Deployment gives it, is valid
    configuration: traitlets loads it and gpupool's settings class accepts every value."""
    from traitlets.config import PyFileConfigLoader

    from hub_ext.config import Gpupool

    objs = render(helm, tmp_path, VALUE_SETS[name], "cfg")
    data = by_kind(objs, "ConfigMap")["gpupool-hub-config"]["data"]
    (tmp_path / "gpupool_config.py").write_text(data["gpupool_config.py"])
    for k, v in _env(_container(objs, "Deployment", "gpupool-hub")).items():
        monkeypatch.setenv(k, v if isinstance(v, str) else f"secret-{k.lower()}-" + "x" * 32)
    c = PyFileConfigLoader("gpupool_config.py", path=str(tmp_path)).load_config()
    cfg = Gpupool(config=c)
    envs = VALUE_SETS[name].get("hub", {}).get("workspaces", {}).get("environments") or {
        "default": {}}
    assert set(cfg.environments) == set(envs)
    assert set(c.GpupoolKubeSpawner.environment_images) == set(envs)
    assert c.KubeSpawner.namespace == "cfg"
    assert cfg.workload_image == c.KubeSpawner.image  # the workspace image
    assert cfg.auth == ("oidc" if name == "oidc" else "shared-password")
    # VS Code is offered where the workspace images carry code-server (the chart's own does)
    assert cfg.code_server == ("" if name == "custom-images" else "code-server")
    if name == "oidc":
        assert cfg.oidc_issuer == "https://idp.example.org/realms/gpupool"
        assert cfg.oidc_client_secret == "secret-gpupool_oidc_client_secret-" + "x" * 32
        assert cfg.oidc_group_roles == {"gpupool-admins": ["platform-admin"]}
    if name == "custom-images":
        assert c.GpupoolKubeSpawner.environment_images["pytorch"] == \
            "nvcr.io/nvidia/pytorch:25.01-py3"


def test_crd_quota_maxima_are_the_scheduler_s_bound():
    """The API server refuses what the hub and the scheduler refuse (issue: one huge limit
    stopped every cycle): every GPU quota number in the CRDs is bounded by MAX_GPUS, the CPU
    and memory quotas by MAX_CPU_MEMORY."""
    from pathlib import Path

    import yaml

    from scheduler.model import MAX_CPU_MEMORY, MAX_GPUS

    for name in ("gpupool.io_projects.yaml", "gpupool.io_departments.yaml"):
        crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "chart" / "crds" / name).read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        quota = spec["properties"]["quotas"]["additionalProperties"]["properties"]
        assert {k: v.get("maximum") for k, v in quota.items()} == {
            "gpus": MAX_GPUS, "overQuotaWeight": MAX_GPUS, "limit": MAX_GPUS,
            "cpu": MAX_CPU_MEMORY, "memoryGib": MAX_CPU_MEMORY}, name
