"""Helpers for the chart's tests: run helm, render with values, server-side dry-run apply
(what ``kubectl apply --server-side --dry-run=server`` sends), API paths from discovery,
and kubeconfigs holding a ServiceAccount's token (TokenRequest API)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.kubernetes.testcluster import ClusterInfo

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
RELEASE = "gpupool"
INSTANCE = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/managed-by=Helm"


def helm_run(helm: Path, *args: str, info: ClusterInfo | None = None, check: bool = True,
             timeout: float = 400) -> subprocess.CompletedProcess:
    cmd = [str(helm), *args]
    if info is not None:
        cmd += ["--kubeconfig", str(info.kubeconfig)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[1:])} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return p


def values_file(tmp: Path, values: dict, name: str = "values.yaml") -> Path:
    f = tmp / name
    f.write_text(yaml.safe_dump(values))
    return f


def render(helm: Path, tmp: Path, values: dict, namespace: str) -> list[dict]:
    out = helm_run(helm, "template", RELEASE, str(CHART), "-n", namespace,
                   "-f", str(values_file(tmp, values))).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


class Discovery:
    """kind -> (plural, namespaced) per apiVersion, from the API server's discovery."""

    def __init__(self, kc: KubeClient):
        self.kc = kc
        self._groups: dict[str, dict[str, tuple[str, bool]]] = {}

    async def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        if api_version not in self._groups:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            doc = await self.kc.get(base)
            self._groups[api_version] = {r["kind"]: (r["name"], r["namespaced"])
                                         for r in doc["resources"] if "/" not in r["name"]}
        return self._groups[api_version][kind]

    async def path(self, obj: dict, namespace: str | None = None, named: bool = True) -> str:
        av, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = await self.resource(av, kind)
        base = "/api/v1" if av == "v1" else f"/apis/{av}"
        if namespaced:
            ns = obj["metadata"].get("namespace") or namespace
            base += f"/namespaces/{ns}"
        base += f"/{plural}"
        return f"{base}/{obj['metadata']['name']}" if named else base

    async def all_listable(self) -> list[tuple[str, bool]]:
        """(collection path, namespaced) of every resource type that can be listed."""
        out = []
        core = await self.kc.get("/api/v1")
        groups = [("/api/v1", core)]
        for g in (await self.kc.get("/apis"))["groups"]:
            gv = g["preferredVersion"]["groupVersion"]
            try:
                groups.append((f"/apis/{gv}", await self.kc.get(f"/apis/{gv}")))
            except ApiError:
                continue
        for base, doc in groups:
            for r in doc["resources"]:
                if "/" not in r["name"] and "list" in r.get("verbs", []):
                    out.append((f"{base}/{r['name']}", r["namespaced"]))
        return out


async def dry_run_apply(kc: KubeClient, disc: Discovery, obj: dict, namespace: str) -> dict:
    """Server-side apply with dryRun=All: the API server validates the object fully
    (schema, admission, CRD validation rules) and stores nothing."""
    path = await disc.path(obj, namespace)
    return await kc.request("PATCH", path, obj, content_type="application/apply-patch+yaml",
                            params={"dryRun": "All", "fieldManager": "chart-test",
                                    "force": "true"})


async def sa_kubeconfig(kc: KubeClient, info: ClusterInfo, namespace: str, sa: str,
                        path: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/sa`` (a bound token
    from the TokenRequest API), so a process run with it has exactly the chart's RBAC."""
    tok = await kc.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": info.host,
                                               "certificate-authority": str(info.ca_file)}}],
        "users": [{"name": sa, "user": {"token": tok["status"]["token"]}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": sa,
                                                "namespace": namespace}}],
    }  # fmt: skip
    path.write_text(json.dumps(cfg))
    path.chmod(0o600)
    return path
