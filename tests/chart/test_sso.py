"""Single sign-on through the chart: the hub runs with the configuration ``helm template``
renders for ``hub.auth.type: oidc`` and the environment its Deployment gives it (the client
secret as the chart's Secret holds it), against a real OIDC provider (Dex) on 127.0.0.1, on
the suite's cluster; a user logs in through the provider's form in chromium and gets the
project the values map their group to."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import shutil

import pytest

from scheduler.kubernetes.client import ApiError
from scheduler.kubernetes.testcluster import client_for
from tests.governance.dex import CLIENT_ID, CLIENT_SECRET, Dex, dex_binary, dex_login, my_projects

from . import procs
from .chartlib import by_kind, render

GROUP = "/apis/gpupool.io/v1alpha1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]
USERS = {"ann": {"password": "ann-pw-1", "groups": ["nlp-team"]}}
ORG = {"create": True, "nodePool": "default", "admins": [], "users": [],
       "departments": [{"name": "d-sso", "gpus": 8, "projects": [{"name": "p-sso", "gpus": 1, "members": []}]}]}


def test_a_user_logs_in_through_the_charts_oidc_configuration(helm, chart_cluster, tmp_path, browser):
    binary = dex_binary()
    if binary is None:
        pytest.fail("Dex is not built: run scripts/build-dex (make test does)")
    port_hub = procs.free_ports(1)[0]
    callback = f"http://127.0.0.1:{port_hub}/hub/oauth_callback"
    dex = Dex(tmp_path / "dex", callback, binary).start(USERS)
    values = {"organisation": ORG, "hub": {"auth": {"type": "oidc", "oidc": {
        "issuer": dex.issuer, "clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET, "callbackUrl": callback,
        "groupProjects": {"nlp-team": ["p-sso"]}}}}}
    objs = render(helm, tmp_path, values, "sso")
    files = by_kind(objs, "ConfigMap")["gpupool-hub-config"]["data"]
    secret = {k: base64.b64decode(v).decode() for k, v in by_kind(objs, "Secret")["gpupool-hub"]["data"].items()}
    env = {}
    for e in by_kind(objs, "Deployment")["gpupool-hub"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        if e["name"].startswith(("GPUPOOL_AUTH", "GPUPOOL_OIDC")):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            env[e["name"]] = secret[ref["key"]] if ref else e["value"]
    assert env["GPUPOOL_AUTH"] == "oidc" and env["GPUPOOL_OIDC_CLIENT_SECRET"] == CLIENT_SECRET
    hub = procs.ChartHub(tmp_path / "hub", files, chart_cluster.kubeconfig, {}, env, port=port_hub)
    org = [o for o in objs if o["kind"] in ("Department", "Project")]
    try:
        _in_thread(_apply(chart_cluster, org))  # what helm install creates
        hub.start().wait_up()
        page = dex_login(browser, hub.url, "ann", USERS["ann"]["password"])
        assert my_projects(page, hub) == ["p-sso"]
        page.context.close()
    except BaseException:
        print(f"--- hub ---\n{hub.tail(20000)}\n--- dex ---\n{dex.log.read_text()[-3000:]}")
        raise
    finally:
        hub.stop()
        dex.stop()
        _in_thread(_delete_org(chart_cluster))


def _in_thread(coro) -> None:
    """Run ``coro`` in a thread of its own: Playwright's sync API holds this thread's loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


async def _apply(info, objs: list[dict]) -> None:
    async with client_for(info) as kc:
        for o in objs:
            await kc.apply(f"{GROUP}/{o['kind'].lower()}s", o, versioned=True)


async def _delete_org(info) -> None:
    """The organisation's objects the hub wrote (cluster-scoped)."""
    async with client_for(info) as kc:
        for path in (f"{GROUP}/projects/p-sso", f"{GROUP}/departments/d-sso"):
            with contextlib.suppress(ApiError):
                await kc.delete(path)
