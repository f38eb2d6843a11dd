"""The chart on the test cluster's real node, with the images scripts/build-images makes from
docker/*/Dockerfile (imported into its containerd, imagePullPolicy Never): hub, scheduler,
activator and node agent run as the chart's own pods and become Ready, the node agent's pod
publishes the node's declared GPUs, and the hub answers through the chart's proxy
(kubectl port-forward through the API server), which reaches the hub by its Service's name
(the node's cluster DNS and kube-proxy). In chromium through that proxy, alice logs in and
starts JupyterLab with 0.25 GPU: GpupoolKubeSpawner's pod runs the workspace image on the
node, and a kernel there sees the fraction's environment, the interception library loaded
and the fraction's memory on the (fake) driver."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from hub_ext.workspaces.spawner import VSCODE_MACHINE_SETTINGS
from scheduler.contract import A, L
from scheduler.kubernetes.testcluster import ClusterInfo, TestCluster, script_path
from tests.chart.imagelib import build_images

from .helpers import kube, wait_until
from .realnode import kubectl, port_forward
from .test_real_node import FAKE_CUDA

pytestmark = [
    pytest.mark.slow,
    pytest.mark.images,
    pytest.mark.skipif(os.geteuid() != 0, reason="the real node and image builds need root"),
]

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


NS = "gpupool-system"
RELEASE = "gpupool"
# the controllers the chart's Deployments and DaemonSet need (kube-controller-manager); real
# pods mount the API server's CA from the ConfigMap root-ca-cert-publisher writes; Services
# reach pods through the EndpointSlices kube-proxy reads; the workspace's home claim binds
CONTROLLERS = ("serviceaccount,serviceaccount-token,root-ca-cert-publisher,namespace,"
               "garbagecollector,deployment,replicaset,daemonset,endpointslice,"
               "persistentvolume-binder")
HUB_STATE = "real-node-chart-hub-state"  # the volume of the hub's claim (gpupool-hub-db)
SSH_PORT = _free_port()
DECLARED = {"count": 4, "model": "NVIDIA L4", "memoryMib": 23034}
USER_PASSWORD = "chart-user-password"
# No GPU here: workspaces get the fake driver (native/build/fake) from the node's disk.
FAKE_DRIVER = {
    "volumes": [{"name": "fake-cuda", "hostPath": {"path": str(FAKE_CUDA)}}],
    "volume_mounts": [{"name": "fake-cuda", "mountPath": "/opt/fake-cuda", "readOnly": True}],
    "environment": {"LD_LIBRARY_PATH": "/opt/fake-cuda"},
}
FAKE_DRIVER_CONFIG = "\n".join(f"c.KubeSpawner.{k} = {v!r}" for k, v in FAKE_DRIVER.items())


@pytest.fixture(scope="module")
def images():
    from tests.conftest import _build_first

    _build_first(cluster_dns=True)
    return build_images("hub", "scheduler", "node-agent", "workspace")


@pytest.fixture(scope="module")
def chart_node(images):
    """A cluster of its own: one real node with its Services and cluster DNS (kube-proxy,
    CoreDNS), kube-controller-manager and kube-scheduler for the chart's Deployments and
    DaemonSet, the chart's images in the node's containerd."""
    cluster = TestCluster(nodes=0, real_node=True, cluster_dns=True, controller_manager=True,
                          kube_scheduler=True, controllers=CONTROLLERS,
                          image_archives=tuple(b.archive for b in images.values()))
    info = cluster.start()
    try:
        yield info
    finally:
        cluster.stop()


def _tag(image: str) -> str:
    return image.rsplit(":", 1)[1]


def _values(images) -> dict:
    return {
        "imageRegistry": "localhost",
        "imagePullPolicy": "Never",
        "hub": {"image": {"tag": _tag(images["hub"].image)},
                # the hub's state (database, SSH host key) outlives its pod (HUB_STATE)
                "db": {"pvc": {"enabled": True}},
                # the SSH gateway, reached through kubectl port-forward on the same port
                "ssh": {"port": SSH_PORT, "host": "127.0.0.1"},
                "auth": {"sharedPassword": {"userPassword": USER_PASSWORD,
                                            "adminPassword": "chart-admin-password-" + "x" * 16}},
                "workspaces": {"image": {"tag": _tag(images["workspace"].image)}},
                "extraConfig": FAKE_DRIVER_CONFIG},
        "scheduler": {"image": {"tag": _tag(images["scheduler"].image)}},
        "activator": {"image": {"tag": _tag(images["hub"].image)}},
        "nodeAgent": {"image": {"tag": _tag(images["node-agent"].image)},
                      # no device plugin here: the node agent advertises nvidia.com/gpu
                      "declaredGpus": DECLARED, "advertiseCapacity": True},
        # nothing on the node enforces NetworkPolicies; the objects themselves are checked
        # in tests/chart
        "networkPolicy": {"enabled": False},
    }


@pytest.fixture(scope="module")
def release(chart_node: ClusterInfo, images, tmp_path_factory):
    state = tmp_path_factory.mktemp("hub-state")
    state.chmod(0o777)  # the hub's user (1000) writes its database there
    run(_volume(chart_node, HUB_STATE, state))
    helm = subprocess.run([str(script_path()), "helm-path"], capture_output=True, text=True,
                          check=True).stdout.strip()
    values = tmp_path_factory.mktemp("chart") / "values.yaml"
    values.write_text(yaml.safe_dump(_values(images)))
    p = subprocess.run([helm, "install", RELEASE, str(Path(__file__).parents[2] / "chart"),
                        "-n", NS, "--create-namespace", "-f", str(values),
                        "--kubeconfig", str(chart_node.kubeconfig)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return chart_node


def run(coro):
    """``coro`` run to its end in a thread of its own: Playwright's sync API (the browser
    tests) keeps an event loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _pods(info: ClusterInfo) -> list[dict]:
    async with kube(info) as kc:
        return (await kc.get(f"/api/v1/namespaces/{NS}/pods"))["items"]


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _describe(info: ClusterInfo) -> str:
    """What the pods say when they are not Ready: status, and each container's log tail."""
    out = []
    for p in run(_pods(info)):
        name = p["metadata"]["name"]
        out.append(f"{name}: {json.dumps((p.get('status') or {}).get('containerStatuses'))}")
        logs = subprocess.run([str(info.kubernetes_bin / "kubectl"), "-n", NS, "logs", name,
                               "--tail=30"], env=info.env(), capture_output=True, text=True,
                              timeout=60)
        out.append(logs.stdout[-3000:] + logs.stderr[-500:])
    return "\n".join(out)


def test_the_chart_s_pods_run_its_images_and_become_ready(release: ClusterInfo, images):
    info = release
    components = {"hub": images["hub"].image, "scheduler": images["scheduler"].image,
                  "activator": images["hub"].image, "node-agent": images["node-agent"].image}

    async def all_ready():
        pods = await _pods(info)
        by = {p["metadata"]["labels"].get("app.kubernetes.io/component"): p for p in pods}
        return by if set(components) <= set(by) and all(_ready(by[c]) for c in components) else None

    try:
        by = run(wait_until(all_ready, "the chart's pods Ready", timeout=300))
    except Exception:
        pytest.fail(f"the chart's pods did not all become Ready:\n{_describe(info)}")
    for component, image in components.items():
        pod = by[component]
        assert pod["spec"]["nodeName"] == info.real_node
        assert pod["spec"]["containers"][0]["image"] == image
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, _describe(info)

    # the node agent's pod (NVML finds no GPU here) published the declared ones
    async def node():
        async with kube(info) as kc:
            return await kc.get(f"/api/v1/nodes/{info.real_node}")

    labels = run(node())["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == str(DECLARED["count"])
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels["nvidia.com/gpu.memory"] == str(DECLARED["memoryMib"])


async def _hub_ready(info: ClusterInfo):
    return next((p for p in await _pods(info) if p["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "hub" and _ready(p)), None)


def test_the_hub_answers_through_the_chart_s_proxy(release: ClusterInfo):
    """Through the hub Service's port (the proxy of the hub's pod), forwarded by the API
    server and the kubelet: the pod's address exists only inside the node's namespace. The
    proxy reaches the hub at its hub_connect_url, the Service's name (gpupool-hub.NS.svc),
    through the node's cluster DNS and kube-proxy."""
    info = release
    run(wait_until(lambda: _hub_ready(info), "the hub pod Ready", timeout=300))
    with port_forward(info, NS, f"svc/{RELEASE}-hub", 80) as base:
        seen: list = []

        async def api_answers():
            # the pod is Ready on the hub's own port; the proxy learns the hub's route after
            try:
                with urllib.request.urlopen(f"{base}/hub/api", timeout=30) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                seen.append((e.code, e.read()[:300]))
                return None

        try:
            answer = run(wait_until(api_answers, "the hub's API through the proxy", timeout=120,
                                    interval=1))
        except Exception:
            pytest.fail(f"the proxy never reached the hub: {seen[-3:]}\n{_describe(info)}")
        assert "version" in answer
        with urllib.request.urlopen(f"{base}/hub/login", timeout=30) as r:
            assert r.status == 200
            assert 'name="password"' in r.read().decode()


# In the kernel: the fraction's environment, the libraries the process has loaded, and the
# GPU memory the (fake) driver reports through the interception library.
KERNEL_PROBE = r"""
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, free, total = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
code = os.path.expanduser("~/.local/share/code-server/Machine/settings.json")
print(json.dumps({"total": total.value, "hostname": os.uname().nodename,
                  "code_settings": json.load(open(code)) if os.path.exists(code) else None,
                  "env": {k: v for k, v in os.environ.items() if k.startswith(("GPUPOOL_", "LD_", "CODE_"))},
                  "maps": sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l})}))
"""


@pytest.fixture(scope="module")
def homes(release: ClusterInfo, tmp_path_factory):
    """Volumes for the home claims of alice's two servers and bob's (KubeSpawner makes one
    claim per server; kube-controller-manager binds each to one of these)."""
    for i in range(3):
        home = tmp_path_factory.mktemp(f"home{i}")
        home.chmod(0o777)  # the image's user (1000) writes its home
        run(_volume(release, f"real-node-chart-home-{i}", home))
    return release


async def _volume(info: ClusterInfo, name: str, path: Path) -> None:
    """A hostPath PersistentVolume at ``path`` for a claim kube-controller-manager binds."""
    async with kube(info) as kc:
        await kc.apply("/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(path), "type": "Directory"}}})


def _spawn(page, base: str, path: str, kind: str) -> None:
    """The spawn form at ``path``: nlp, ``kind``, 0.25 GPU, a small CPU and memory."""
    page.goto(base + path)
    page.select_option("#gp-project", "nlp")
    page.check(f"input[name=workspace_kind][value={kind}]")
    page.check("input[name=gpu_mode][value=fraction]")
    page.fill("#gp-fraction", "0.25")
    page.dispatch_event("#gp-fraction", "input")
    page.fill("input[name=cpu]", "0.5")  # the node has 2 CPUs, the chart's pods ask some
    page.fill("input[name=memory_gib]", "2")
    page.wait_for_selector("#gp-status[aria-busy=false]")
    verdict = page.inner_text("#gp-verdict")
    assert "Starts now" in verdict, verdict
    page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")


def _probe(info: ClusterInfo, base: str, token: str, server_path: str, workload: str):
    """The kernel probe's answer in ``server_path``'s container, that container's pod, and
    the fraction's ConfigMap."""
    from tests.hub.hubkernel import run_code

    out = run_code(base, server_path, token, KERNEL_PROBE, timeout=120)
    probe = json.loads(out.strip().splitlines()[-1])
    pod = next(p for p in run(_pods(info))
               if p["metadata"]["name"] == probe["hostname"])
    assert pod["metadata"]["annotations"][A.WORKLOAD] == workload

    async def share():
        async with kube(info) as kc:
            return await kc.get(f"/api/v1/namespaces/{NS}/configmaps/"
                                f"{pod['metadata']['name']}-gpupool")

    return probe, pod, run(share())["data"]


def _check_share(info: ClusterInfo, images, probe: dict, pod: dict, share_env: dict) -> None:
    assert pod["spec"]["nodeName"] == info.real_node
    assert pod["spec"]["schedulerName"] == "gpupool"
    assert pod["spec"]["containers"][0]["image"] == images["workspace"].image
    assert pod["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "250"
    env = probe["env"]
    for key, value in share_env.items():  # the fraction's environment, from its ConfigMap
        if key.startswith("GPUPOOL_") or key == "LD_PRELOAD":
            assert env.get(key) == value, key
    assert env["GPUPOOL_GPU_MILLI"] == "250"
    assert env["LD_PRELOAD"] in probe["maps"], probe["maps"]  # loaded into the kernel
    cap = DECLARED["memoryMib"] * 2**20 // 4
    assert env["GPUPOOL_MEMORY_LIMIT"] == str(cap)
    assert probe["total"] == cap  # the driver's memory, as the interception library caps it
    # VS Code (chosen, or opened from JupyterLab) opens the home trusted, as in embedded mode
    assert probe["code_settings"] == VSCODE_MACHINE_SETTINGS
    assert env["CODE_SERVER_CONFIG"] == "/tmp/gpupool-code-server/config.yaml"


def _stop(base: str, token: str, server: str = "", user: str = "alice") -> None:
    path = f"servers/{server}" if server else "server"
    req = urllib.request.Request(f"{base}/hub/api/users/{user}/{path}",
                                 method="DELETE", headers={"Authorization": f"token {token}"})
    # The stop is idempotent; the port-forward under it may drop a connection (the hub
    # answers the repeat as it did the first), an HTTP error is an answer and fails.
    for attempt in range(3):
        try:
            urllib.request.urlopen(req, timeout=60).close()
            return
        except urllib.error.HTTPError:
            raise
        except OSError:
            if attempt == 2:
                raise
            time.sleep(2)


def _open_in_chromium(info: ClusterInfo, images, browser, shots, *, spawn_path: str, choice: str,
                      url: str, ready: str, ready_s: int, what: str, shot: str, server: str = "",
                      check=None):
    """Through the chart's proxy in chromium: alice logs in with the chart's password, asks
    the form at ``spawn_path`` for ``choice`` with 0.25 GPU, waits for ``url`` and the
    ``ready`` element; then the kernel probe in that server's container, which holds the
    share (``_check_share``), and the server stopped."""
    from tests import chromium
    from tests.hub.hubclient import HubClient

    run(wait_until(lambda: _hub_ready(info), "the hub pod Ready", timeout=300))
    with port_forward(info, NS, f"svc/{RELEASE}-hub", 80) as base:
        run(wait_until(_async(lambda: _answers(f"{base}/hub/login")), "the hub's login page",
                       timeout=120, interval=1))
        page = chromium.login(browser, base, "alice", USER_PASSWORD)
        _spawn(page, base, spawn_path, choice)
        try:
            page.wait_for_url(re.compile(url), timeout=300_000)
            page.wait_for_selector(ready, timeout=ready_s * 1000)
        except Exception:
            page.screenshot(path=str(shots / f"{shot}-failed.png"), full_page=True)
            pytest.fail(f"{what} did not open: {page.url}\n{_describe(info)}")
        page.screenshot(path=str(shots / f"{shot}.png"))
        if check is not None:
            check(page)
        token = HubClient(base).login("alice", USER_PASSWORD).token("alice")
        server_path = f"/user/alice/{server}/" if server else "/user/alice/"
        probe, pod, share_env = _probe(info, base, token, server_path,
                                       f"ws-alice-{server}" if server else "ws-alice")
        _stop(base, token, server)
        page.context.close()
    _check_share(info, images, probe, pod, share_env)


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                    "(scripts/setup-system installs it)")
def test_alice_starts_jupyterlab_with_a_quarter_gpu_in_chromium(homes: ClusterInfo, images,
                                                                 browser, shots):
    """Through the chart's proxy in chromium: alice logs in with the chart's shared password,
    asks the spawn form for 0.25 GPU, and lands in JupyterLab; GpupoolKubeSpawner's pod runs
    the workspace image on the real node (bound by the chart's gpupool-scheduler), and a
    kernel there runs code: the fraction's environment is set, the interception library is
    loaded, and the driver reports the fraction's memory."""
    _open_in_chromium(homes, images, browser, shots, spawn_path="/hub/spawn", choice="jupyterlab",
                      url=r".*/user/alice/lab.*", ready="#jp-main-dock-panel, .jp-LabShell",
                      ready_s=180, what="JupyterLab", shot="real-node-jupyterlab")


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                    "(scripts/setup-system installs it)")
def test_alice_opens_vs_code_with_a_quarter_gpu_in_chromium(homes: ClusterInfo, images,
                                                             browser, shots):
    """The same through the form's VS Code choice, on a named server: the workbench of the
    image's code-server opens behind the chart's proxy, and its container holds the share."""
    _open_in_chromium(homes, images, browser, shots, spawn_path="/hub/spawn/alice/code",
                      choice="vscode", url=r".*/user/alice/code/vscode/.*",
                      ready=".monaco-workbench .part.sidebar", ready_s=240, what="VS Code",
                      shot="real-node-vscode", server="code", check=_trusted)


def _trusted(page) -> None:
    """The workbench opens the home trusted (no Restricted Mode), with the configuration
    GpupoolKubeSpawner's postStart hook wrote: its app name in the window title."""
    html = page.content().replace("&quot;", '"')
    assert '"enableWorkspaceTrust":false' in html, html[:2000]
    page.wait_for_function("document.title.includes('gpupool ws-alice-code (0.25 GPU')",
                           timeout=60_000)


# The replicas' model server: every answer names the pod that gave it; /slow takes two
# seconds (50 clients keep about 50 requests in flight).
MODEL = """
import http.server, os, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(2.0)
        body = os.uname().nodename.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8000), H).serve_forever()
"""


def _service(name: str, **over) -> dict:
    """A service of nlp with no image (the workspace image's python runs MODEL)."""
    return {"name": name, "project": "nlp", "gpu": 0.25, "port": 8000, "ready_path": "/",
            "command": ["python3", "-c", MODEL], "min_replicas": 0, "max_replicas": 1,
            "scale_to_zero_after_s": 600, **over}


@pytest.fixture(scope="module")
def serving(homes: ClusterInfo):
    """The hub's and the activator's Services, forwarded; the JupyterHub tokens of alice
    (nlp) and dave (serving only)."""
    from tests.hub.hubclient import HubClient

    info = homes
    run(wait_until(lambda: _hub_ready(info), "the hub pod Ready", timeout=300))
    with port_forward(info, NS, f"svc/{RELEASE}-hub", 80) as hub:
        run(wait_until(_async(lambda: _answers(f"{hub}/hub/login")), "the hub's login page",
                       timeout=120, interval=1))
        tokens = {u: HubClient(hub).login(u, USER_PASSWORD).token(u) for u in ("alice", "dave")}
        yield info, hub, tokens


def _get(url: str, token: str = "", timeout: float = 300) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _body(url: str, token: str = "") -> str:
    """A page that must answer 200: its text."""
    code, body = _get(url, token, timeout=60)
    assert code == 200, (url, code, body[-2000:])
    return body


def _status(act: str) -> dict:
    try:
        with urllib.request.urlopen(f"{act}/_status", timeout=10) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def _submit(hub: str, token: str, spec: dict, act: str) -> dict:
    from tests.hub.hubclient import call

    status, body = call(hub, token, "POST", "/inferences", spec)
    assert status in (200, 201, 202), body
    return run(wait_until(_async(lambda: _status(act).get(spec["name"])),
                          f"the activator serves {spec['name']}", timeout=120, interval=1))


def test_an_inference_service_answers_http_through_the_activator_from_zero(serving, images):
    """A service alice submits through the hub, with no image (the workspace image), is
    served by the chart's activator at zero replicas. The activator asks the hub who holds
    a caller's token: none gets 401, dave's (not a member of nlp) 403, and neither starts a
    replica; alice's brings one, bound by gpupool-scheduler on the real node with 0.25 GPU,
    held until it is ready, and gets the replica's own answer."""
    info, hub, tokens = serving
    with port_forward(info, NS, f"svc/{RELEASE}-activator", 80) as act:
        first = _submit(hub, tokens["alice"], _service("echo"), act)
        assert first["replicas"] == 0 and _replicas(info, "echo") == []

        code, body = _get(f"{act}/echo/")
        assert code == 401 and json.loads(body)["error"]["field"] == "Authorization", body
        code, body = _get(f"{act}/echo/", "not-a-token")
        assert code == 401 and "not valid" in json.loads(body)["error"]["message"], body
        code, body = _get(f"{act}/echo/", tokens["dave"])
        assert code == 403 and "dave is not a member of project 'nlp'" in body, body
        assert _status(act)["echo"]["replicas"] == 0 and _replicas(info, "echo") == []

        code, page = _get(f"{act}/echo/", tokens["alice"])  # held until ready
        assert code == 200, page
        (replica,) = _replicas(info, "echo")
        assert page == replica["metadata"]["name"]  # the replica's own answer
        assert _get(f"{act}/echo/?token={tokens['alice']}", timeout=60) == (200, page)

    assert replica["spec"]["nodeName"] == info.real_node
    assert replica["spec"]["schedulerName"] == "gpupool"
    assert replica["spec"]["containers"][0]["image"] == images["workspace"].image
    assert replica["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "250"
    assert replica["metadata"]["annotations"][A.PROJECT] == "nlp"
    # the replica belongs to the activator's ConfigMap: it goes with the release
    (owner,) = replica["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ConfigMap", f"{RELEASE}-activator")


def test_deleting_the_activator_pod_adopts_its_replicas(serving):
    """echo's replica (the previous test's) keeps running when the activator's pod is
    deleted: the new activator adopts it (the same pod answers) and starts none."""
    from tests.hub.hubclient import call

    info, hub, tokens = serving
    (before,) = _replicas(info, "echo")
    old = [p for p in run(_pods(info)) if p["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "activator"]
    assert len(old) == 1

    async def delete_and_wait():
        async with kube(info) as kc:
            await kc.delete(f"/api/v1/namespaces/{NS}/pods/{old[0]['metadata']['name']}")

        async def new_ready():
            return [p for p in await _pods(info) if p["metadata"]["labels"].get(
                "app.kubernetes.io/component") == "activator" and _ready(p)
                and p["metadata"]["uid"] != old[0]["metadata"]["uid"]
                and not p["metadata"].get("deletionTimestamp")]

        return await wait_until(new_ready, "a new activator pod Ready", timeout=180)

    (new,) = run(delete_and_wait())
    target = f"pod/{new['metadata']['name']}"

    def echo_ready():  # a forward per look: kubectl's ends when the pod refuses one
        try:
            with port_forward(info, NS, target, 9000) as act:
                return (_status(act).get("echo") or {}).get("ready")
        except (AssertionError, OSError, subprocess.SubprocessError):
            return None

    adopted = run(wait_until(_async(echo_ready), "echo's replica ready in the new activator",
                             timeout=120, interval=1))
    assert adopted == 1
    with port_forward(info, NS, target, 9000) as act:
        code, page = _get(f"{act}/echo/", tokens["alice"], timeout=60)
        assert code == 200 and page == before["metadata"]["name"], page
        (after,) = _replicas(info, "echo")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert _status(act)["echo"]["replicas"] == 1
    assert call(hub, tokens["alice"], "DELETE", "/inferences/echo")[0] in (200, 202, 204)
    run(wait_until(_async(lambda: _replicas(info, "echo") == []),
                   "echo's replica deleted with the service", timeout=120, interval=1))


CLIENTS, TARGET = 50, 10


def test_fifty_clients_scale_a_service_out_to_its_target_and_idle_brings_it_to_zero(serving):
    """50 clients, each with one request in flight at a time (two seconds each), through the
    activator with alice's token: the service (0.1 GPU a replica, target 10 in flight per
    replica, up to 8) scales out to ceil(50 / 10) = 5 replicas, all bound on the real node;
    once the clients stop it goes back to zero replicas after its idle time (8 s), its pods
    deleted."""
    from tests.hub.hubclient import call

    info, hub, tokens = serving
    # 5 x 0.1 GPU: inference runs in quota only, and nlp's quota is 1 GPU
    spec = _service("load", gpu=0.1, target=TARGET, max_replicas=8, stable_window_s=6,
                    scale_to_zero_after_s=8)
    with port_forward(info, NS, f"svc/{RELEASE}-activator", 80) as act:
        _submit(hub, tokens["alice"], spec, act)
        stop = threading.Event()
        answers: list[tuple[int, str]] = []
        host, port = act.rsplit("/", 1)[1].split(":")

        def client():  # one keep-alive connection each, as a model's client would keep
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            while not stop.is_set():
                try:
                    conn.request("GET", "/load/slow", headers={"Authorization": f"token {tokens['alice']}"})
                    r = conn.getresponse()
                    answers.append((r.status, r.read().decode()))
                except (OSError, http.client.HTTPException) as e:
                    answers.append((0, repr(e)))
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.close()

        seen: list[dict] = []

        def scaled_out():
            st = _status(act).get("load") or {}
            seen.append(st)
            return st.get("ready", 0) >= -(-CLIENTS // TARGET) or None

        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            for _ in range(CLIENTS):
                pool.submit(client)
            try:
                run(wait_until(_async(scaled_out), "5 replicas ready under 50 clients",
                               timeout=300, interval=1))
                pods = _replicas(info, "load")
            finally:
                stop.set()
        assert max(st.get("desired", 0) for st in seen) == -(-CLIENTS // TARGET)
        assert len(pods) == -(-CLIENTS // TARGET)
        assert {p["spec"]["nodeName"] for p in pods} == {info.real_node}
        assert not [a for a in answers if a[0] != 200], [a for a in answers if a[0] != 200][:5]
        # every answer is a replica's own, and the last ones are spread over them
        ok = [body for _, body in answers]
        assert set(ok) <= {p["metadata"]["name"] for p in pods}
        assert len(set(ok[-CLIENTS:])) > 1

        run(wait_until(_async(lambda: (_status(act).get("load") or {}).get("replicas") == 0
                              and _replicas(info, "load") == []),
                       "load back at zero replicas after its idle time", timeout=180, interval=1))
    assert call(hub, tokens["alice"], "DELETE", "/inferences/load")[0] in (200, 202, 204)


def _replicas(info: ClusterInfo, service: str) -> list[dict]:
    return [p for p in run(_pods(info))
            if p["metadata"].get("labels", {}).get(L.INFERENCE) == service
            and p["spec"].get("nodeName")]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def _async(pred):
    async def call():
        return pred()
    return call


# -- the CLI's remote commands and a hub restart, as a user drives them ------------------------
GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def _cli(base: str, token: str, config: Path, *args: str, stdin: str | None = None,
         timeout: float = 180) -> subprocess.CompletedProcess:
    """The ``gpupool`` command as a user runs it: the hub's URL (the chart's proxy, through
    loopback) and the user's token; its known_hosts under ``config``."""
    env = {**os.environ, "GPUPOOL_URL": base, "GPUPOOL_TOKEN": token,
           "XDG_CONFIG_HOME": str(config)}
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, input=stdin if stdin is not None else "")


def _cli_forward(base: str, token: str, config: Path, *args: str):
    """``gpupool ... port-forward ...`` running; (the process, its local port)."""
    env = {**os.environ, "GPUPOOL_URL": base, "GPUPOOL_TOKEN": token,
           "XDG_CONFIG_HOME": str(config)}
    p = subprocess.Popen([GPUPOOL, *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    first = p.stdout.readline()
    m = re.match(r"Forwarding 127\.0\.0\.1:(\d+) -> ", first)
    if not m:
        p.kill()
        pytest.fail(f"no forwarding line: {first!r} {p.communicate(timeout=10)[1][-2000:]}")
    return p, int(m.group(1))


def _workload_pod(info: ClusterInfo, workload: str) -> dict | None:
    return next((p for p in run(_pods(info))
                 if (p["metadata"].get("annotations") or {}).get(A.WORKLOAD) == workload
                 and not p["metadata"].get("deletionTimestamp")), None)


def _hub_proxy(info: ClusterInfo):
    """The chart's proxy and the SSH gateway (on the port /me names), both forwarded to
    loopback through the API server once the hub's pod is Ready."""
    import contextlib

    @contextlib.contextmanager
    def both():
        run(wait_until(lambda: _hub_ready(info), "the hub pod Ready", timeout=300))
        with port_forward(info, NS, f"svc/{RELEASE}-hub", 80) as base, \
                port_forward(info, NS, f"svc/{RELEASE}-hub", SSH_PORT, local=SSH_PORT):
            run(wait_until(_async(lambda: _answers(f"{base}/hub/login")), "the hub's login page",
                           timeout=120, interval=1))
            yield base

    return both()


def _tokens(base: str, *users: str) -> dict[str, str]:
    from tests.hub.hubclient import HubClient

    return {u: HubClient(base).login(u, USER_PASSWORD).token(u) for u in users}


def test_alice_reaches_her_workspace_with_the_cli_and_bob_does_not(homes: ClusterInfo,
                                                                  tmp_path):
    """alice starts a workspace with ``gpupool workspace start`` (0.25 GPU); ``exec``,
    ``ssh`` (OpenSSH with her token), ``logs`` and ``port-forward`` reach its container on
    the real node through the hub's SSH gateway (the API server's pods/exec and
    pods/portforward with the chart's Role) and the hub's API (pods/log). bob, in the same
    project, is refused each: his exec and ssh are told the workspace is not running or not
    his, his logs get the API's 403."""
    from tests.hub.hubclient import call

    info = homes
    with _hub_proxy(info) as base:
        tok = _tokens(base, "alice", "bob")
        alice = functools.partial(_cli, base, tok["alice"], tmp_path / "alice")
        bob = functools.partial(_cli, base, tok["bob"], tmp_path / "bob")
        r = alice("workspace", "start", "--project", "nlp", "--fraction", "0.25", "--cpu", "0.5",
                  "--memory", "2")
        assert r.returncode == 0, r.stderr

        async def ready():
            status, user = call(base, tok["alice"], "GET", "/hub/api/users/alice", api=False)
            return status == 200 and (user["servers"].get("") or {}).get("ready")

        try:
            run(wait_until(ready, "alice's workspace ready", timeout=400, interval=2))
        except Exception:
            pytest.fail(f"alice's workspace did not start:\n{_describe(info)}")
        pod = _workload_pod(info, "ws-alice")
        assert pod is not None and pod["spec"]["nodeName"] == info.real_node
        name = pod["metadata"]["name"]

        r = alice("workspace", "exec", "ws-alice", "--", "sh", "-c",
                  "hostname; echo $GPUPOOL_GPU_MILLI; echo to-stderr >&2; exit 7")
        assert r.returncode == 7, r.stderr
        assert r.stdout.split() == [name, "250"] and "to-stderr" in r.stderr
        known = (tmp_path / "alice" / "gpupool" / "known_hosts").read_text()
        assert known.startswith(f"[127.0.0.1]:{SSH_PORT} ssh-ed25519 ")

        r = alice("workspace", "ssh", "ws-alice", stdin="hostname; id -u; exit\n")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[-2:] == [name, "1000"], r.stdout
        assert tok["alice"] not in r.stdout + r.stderr

        r = alice("workspace", "logs", "ws-alice", "--tail", "500")
        assert r.returncode == 0, r.stderr
        assert "Jupyter Server" in r.stdout and "/user/alice/" in r.stdout, r.stdout[-2000:]

        p, port = _cli_forward(base, tok["alice"], tmp_path / "alice", "workspace",
                               "port-forward", "ws-alice", "0:8888")
        try:  # the Jupyter server in the container, on its own port
            assert "version" in json.loads(_body(f"http://127.0.0.1:{port}/user/alice/api"))
        finally:
            p.terminate()
            p.wait(10)

        r = bob("workspace", "exec", "ws-alice", "--", "hostname")
        assert r.returncode == 1 and name not in r.stdout
        assert "workspace 'ws-alice' is not running (or is not yours)" in r.stderr, r.stderr
        r = bob("workspace", "ssh", "ws-alice", stdin="hostname; exit\n")
        assert r.returncode != 0 and name not in r.stdout
        assert "is not running (or is not yours)" in r.stderr, r.stderr
        r = bob("workspace", "logs", "ws-alice")
        assert r.returncode != 0 and r.stdout == ""
        assert "403" in r.stderr, r.stderr


def test_the_workspace_outlives_the_hub_s_pod(homes: ClusterInfo, tmp_path):
    """The hub's pod deleted while alice's workspace runs: the Deployment's new pod (the
    same database, on the hub's claim) shows the workspace again (JupyterHub's API, the
    CLI's list), the workspace's pod is the same one and never restarted, and alice's
    server answers through the new pod's proxy."""
    from tests.hub.hubclient import call

    info = homes
    before = _workload_pod(info, "ws-alice")
    if before is None:  # this test alone: a workspace of its own
        with _hub_proxy(info) as base:
            tok = _tokens(base, "alice")
            r = _cli(base, tok["alice"], tmp_path, "workspace", "start", "--project", "nlp",
                     "--fraction", "0.25", "--cpu", "0.5", "--memory", "2")
            assert r.returncode == 0, r.stderr

            async def ready():
                status, user = call(base, tok["alice"], "GET", "/hub/api/users/alice",
                                    api=False)
                return status == 200 and (user["servers"].get("") or {}).get("ready")

            run(wait_until(ready, "alice's workspace ready", timeout=400, interval=2))
        before = _workload_pod(info, "ws-alice")
    assert before is not None
    hub = run(_hub_ready(info))
    kubectl(info, "-n", NS, "delete", "pod", hub["metadata"]["name"], "--wait=false")

    async def new_hub():
        p = await _hub_ready(info)
        return p if p and p["metadata"]["uid"] != hub["metadata"]["uid"] else None

    run(wait_until(new_hub, "the hub's new pod Ready", timeout=300, interval=2))

    async def old_gone():  # the Service's port-forward then reaches the new pod only
        return hub["metadata"]["uid"] not in {p["metadata"]["uid"] for p in await _pods(info)}

    run(wait_until(old_gone, "the hub's old pod gone", timeout=120, interval=1))
    with _hub_proxy(info) as base:
        tok = _tokens(base, "alice")  # the users' and their tokens' database is the same

        async def shown():
            status, user = call(base, tok["alice"], "GET", "/hub/api/users/alice", api=False)
            return status == 200 and (user["servers"].get("") or {}).get("ready")

        run(wait_until(shown, "alice's workspace shown by the new hub", timeout=120, interval=2))
        r = _cli(base, tok["alice"], tmp_path, "workspace", "list")
        assert r.returncode == 0, r.stderr
        line = next((x for x in r.stdout.splitlines() if "ws-alice " in x + " "), "")
        assert "running" in line, r.stdout

        async def answers():  # the new proxy's route to the server, added by the new hub
            try:
                code, body = _get(f"{base}/user/alice/api/status", tok["alice"], timeout=60)
            except OSError:
                return None
            return json.loads(body) if code == 200 else None

        assert "started" in run(wait_until(answers, "alice's server through the proxy",
                                           timeout=120, interval=2))
        after = _workload_pod(info, "ws-alice")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        _stop(base, tok["alice"])


def test_alice_reaches_an_inference_replica_with_the_cli(homes: ClusterInfo, tmp_path):
    """A service alice submits with ``gpupool inference submit`` (one replica kept, 0.25
    GPU): ``exec``, ``logs`` and ``port-forward`` with ``--replica`` reach the replica's
    container on the real node. bob (her project) cannot exec there; dave (another
    project) cannot read its log."""
    info = homes
    with _hub_proxy(info) as base:
        tok = _tokens(base, "alice", "bob", "dave")
        alice = functools.partial(_cli, base, tok["alice"], tmp_path / "alice")
        r = alice("inference", "submit", "remote", "--project", "nlp", "--fraction", "0.25",
                  "--min-replicas", "1", "--max-replicas", "1", "--port", "8000",
                  "--", "python3", "-m", "http.server", "8000")
        assert r.returncode == 0, r.stderr

        async def replica():
            pods = [p for p in await _pods(info)
                    if p["metadata"].get("labels", {}).get(L.INFERENCE) == "remote"
                    and _ready(p)]
            return pods[0] if pods else None

        try:
            pod = run(wait_until(replica, "the replica Ready", timeout=300, interval=2))
        except Exception:
            pytest.fail(f"no replica:\n{_describe(info)}")
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == info.real_node
        try:
            r = alice("inference", "exec", "remote", "--replica", name, "--", "sh", "-c",
                      "hostname; echo $GPUPOOL_GPU_MILLI; exit 3")
            assert r.returncode == 3, r.stderr
            assert r.stdout.split() == [name, "250"]

            r = alice("inference", "logs", "remote", "--replica", name)
            assert r.returncode == 0, r.stderr
            assert '"GET / HTTP/1.1" 200' in r.stdout, r.stdout[-2000:]  # its readiness probes

            p, port = _cli_forward(base, tok["alice"], tmp_path / "alice", "inference",
                                   "port-forward", "remote", "--replica", name, "0:8000")
            try:
                assert "Directory listing for /" in _body(f"http://127.0.0.1:{port}/")
            finally:
                p.terminate()
                p.wait(10)

            r = _cli(base, tok["bob"], tmp_path / "bob", "inference", "exec", "remote",
                     "--replica", name, "--", "hostname")
            assert r.returncode == 1 and name not in r.stdout
            assert "is not running (or is not yours)" in r.stderr, r.stderr
            r = _cli(base, tok["dave"], tmp_path / "dave", "inference", "logs", "remote",
                     "--replica", name)
            assert r.returncode != 0 and "403" in r.stderr, r.stderr
        finally:
            r = alice("inference", "delete", "remote")
            assert r.returncode == 0, r.stderr


def test_alice_reaches_a_training_worker_with_the_cli(homes: ClusterInfo, tmp_path):
    """A one-worker training alice submits (0.25 GPU; its checkpoint claim bound to a
    ReadWriteMany volume): ``training exec``, ``logs`` and ``port-forward`` with ``--rank``
    reach the worker's container on the real node; bob (her project) cannot exec there,
    dave (another project) cannot read its log."""
    from tests.hub.hubclient import call

    info = homes
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    ckpt.chmod(0o777)

    async def volume():
        async with kube(info) as kc:
            await kc.apply("/api/v1/persistentvolumes", {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "real-node-chart-checkpoints"},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"],
                         "persistentVolumeReclaimPolicy": "Retain",
                         "hostPath": {"path": str(ckpt), "type": "Directory"}}})

    run(volume())
    with _hub_proxy(info) as base:
        tok = _tokens(base, "alice", "bob", "dave")
        alice = functools.partial(_cli, base, tok["alice"], tmp_path / "alice")
        status, body = call(base, tok["alice"], "POST", "/trainings", {
            "name": "remote-tr", "project": "nlp", "gpu_mode": "fraction", "gpu_fraction": 0.25,
            "cpu": 0.25, "memory_gib": 1, "workers": 1,
            "command": ["sh", "-c", "echo worker-up; exec python3 -m http.server 8000"]})
        assert status in (200, 201, 202), body

        async def worker():
            pods = [p for p in await _pods(info)
                    if (p["metadata"].get("annotations") or {}).get(A.WORKLOAD) == "remote-tr"
                    and (p.get("status") or {}).get("phase") == "Running"]
            return pods[0] if pods else None

        try:
            try:
                pod = run(wait_until(worker, "the worker running", timeout=300, interval=2))
            except Exception:
                pytest.fail(f"no worker: {call(base, tok['alice'], 'GET', '/trainings/remote-tr')}"
                            f"\n{_describe(info)}")
            name = pod["metadata"]["name"]
            assert pod["spec"]["nodeName"] == info.real_node
            r = alice("training", "exec", "remote-tr", "--rank", "0", "--", "sh", "-c",
                      "hostname; echo $GPUPOOL_GPU_MILLI; exit 4")
            assert r.returncode == 4, r.stderr
            assert r.stdout.split() == [name, "250"]

            r = alice("training", "logs", "remote-tr", "--rank", "0")
            assert r.returncode == 0 and "worker-up" in r.stdout, r.stdout + r.stderr

            p, port = _cli_forward(base, tok["alice"], tmp_path / "alice", "training",
                                   "port-forward", "remote-tr", "--rank", "0", "0:8000")
            try:
                assert "Directory listing for /" in _body(f"http://127.0.0.1:{port}/")
            finally:
                p.terminate()
                p.wait(10)

            r = _cli(base, tok["bob"], tmp_path / "bob", "training", "exec", "remote-tr",
                     "--rank", "0", "--", "hostname")
            assert r.returncode == 1 and name not in r.stdout
            assert "is not running (or is not yours)" in r.stderr, r.stderr
            r = _cli(base, tok["dave"], tmp_path / "dave", "training", "logs", "remote-tr")
            assert r.returncode != 0 and "worker-up" not in r.stdout
            assert "403" in r.stderr or "404" in r.stderr, r.stderr
        finally:
            r = alice("training", "delete", "remote-tr")
            assert r.returncode == 0, r.stderr


# -- the chart's scheduler pod deleted while it binds -----------------------------------------
def _quarter(name: str, image: str) -> dict:
    """A quarter-GPU training pod of nlp for the chart's gpupool-scheduler, in the workspace
    image, that sleeps."""
    from scheduler.contract import request_annotations, workload_annotations

    ann = {**request_annotations("nlp", "training"), **workload_annotations(name, "alice"),
           A.FRACTION: "0.25"}
    c = {"name": "main", "image": image, "imagePullPolicy": "Never",
         "command": ["sleep", "100000"], "envFrom": [{"configMapRef": {"name": f"{name}-gpupool"}}],
         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
            "spec": {"schedulerName": "gpupool", "terminationGracePeriodSeconds": 0,
                     "containers": [c]}}


def test_deleting_the_scheduler_pod_binds_each_pod_once(release: ClusterInfo, images):
    """Eight quarter-GPU pods arrive one by one; the chart's scheduler pod is deleted once the
    first is bound. Its Deployment's next pod binds the rest: every pod is bound once (no
    restart, its ConfigMap naming the GPU of its binding) and no GPU holds more than four
    quarters."""
    info, n = release, 8
    path = f"/api/v1/namespaces/{NS}/pods"
    names = [f"burst-{i}" for i in range(n)]

    def scheduler_pods(pods):
        return [p for p in pods if p["metadata"].get("labels", {}).get(
            "app.kubernetes.io/component") == "scheduler" and not p["metadata"].get("deletionTimestamp")]

    async def go():
        async with kube(info) as kc:
            first = scheduler_pods(await _pods(info))
            assert len(first) == 1, [p["metadata"]["name"] for p in first]
            try:
                async def create_all():
                    for name in names:
                        await kc.post(path, _quarter(name, images["workspace"].image))
                        await asyncio.sleep(0.2)

                async def bound_count(k: int):
                    pods = [p for p in await _pods(info) if p["metadata"]["name"] in names]
                    return pods if sum(bool(p["spec"].get("nodeName")) for p in pods) >= k else None

                creating = asyncio.create_task(create_all())
                await wait_until(lambda: bound_count(1), "the first pod bound", interval=0.05)
                await kc.delete(f"{path}/{first[0]['metadata']['name']}", {"gracePeriodSeconds": 0})
                await creating

                async def running():
                    pods = [p for p in await _pods(info) if p["metadata"]["name"] in names]
                    return pods if len(pods) == n and all(
                        (p.get("status") or {}).get("phase") == "Running" for p in pods) else None

                pods = await wait_until(running, "every pod running", timeout=300)
                later = scheduler_pods(await _pods(info))
                cms = {p["metadata"]["name"]: (await kc.get(
                    f"/api/v1/namespaces/{NS}/configmaps/{p['metadata']['name']}-gpupool"))["data"]
                       for p in pods}
                return first[0], later, pods, cms
            finally:
                for name in names:
                    try:
                        await kc.delete(f"{path}/{name}", {"gracePeriodSeconds": 0})
                    except Exception:
                        pass

    first, later, pods, cms = run(go())
    assert later and all(p["metadata"]["uid"] != first["metadata"]["uid"] for p in later)
    use: dict[str, int] = {}
    for p in pods:
        ann, name = p["metadata"]["annotations"], p["metadata"]["name"]
        assert p["spec"]["nodeName"] == ann[A.PLANNED_NODE] == info.real_node
        assert p["status"]["containerStatuses"][0]["restartCount"] == 0
        assert cms[name]["GPUPOOL_GPU_INDEX"] == ann[A.GPU_INDICES]
        use[ann[A.GPU_INDICES]] = use.get(ann[A.GPU_INDICES], 0) + int(ann[A.GPU_MILLI])
    assert sum(use.values()) == n * 250
    assert all(v <= 1000 for v in use.values()), f"a GPU holds more than itself: {use}"


# -- an attacker inside alice's workspace ------------------------------------------------------
ATTACK = r"""
import json, os, ssl, sys, urllib.error, urllib.request
bob_ip, hub, ns = sys.argv[1:4]
mine = os.environ.get("JUPYTERHUB_API_TOKEN", "")
def get(url, token=""):
    h = {"Authorization": "token " + token} if token else {}
    ctx = ssl._create_unverified_context() if url.startswith("https") else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=h), timeout=15, context=ctx) as r:
            return [r.status, r.read(4000).decode(errors="replace")]
    except urllib.error.HTTPError as e:
        return [e.code, ""]
    except Exception as e:
        return [type(e).__name__, ""]
def cmd(p):
    try:
        return open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
print(json.dumps({
    "own_token": bool(mine),
    "sa_token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    "hub_db": os.path.exists("/srv/jupyterhub/jupyterhub.sqlite"),
    "k8s_secrets": get("https://kubernetes.default.svc/api/v1/namespaces/%s/secrets" % ns),
    "hub_users": get("http://%s/hub/api/users" % hub, mine),
    "hub_bob": get("http://%s/hub/api/users/bob" % hub, mine),
    "bob_via_proxy": get("http://%s/user/bob/api/contents" % hub, mine),
    "bob_direct": get("http://%s:8888/user/bob/api/contents" % bob_ip, mine),
    "bob_direct_no_token": get("http://%s:8888/user/bob/api/contents" % bob_ip),
    "procs": [cmd(p) for p in os.listdir("/proc")  # every process but this probe's own two
              if p.isdigit() and int(p) not in (os.getpid(), os.getppid())],
    "uid": os.getuid(),
}))
"""


def test_from_inside_alice_s_workspace_bob_s_work_the_hub_and_the_api_server_stay_closed(
        homes: ClusterInfo, tmp_path):
    """alice and bob each run a workspace of nlp on the real node. From a shell in alice's
    container (``gpupool workspace exec``), with her own server token: no service-account
    token and no hub database are there; the API server refuses her; the hub's API shows her
    neither bob nor the user list beyond herself; bob's server refuses her through the proxy
    and at its pod's address, with her token or none; her container sees only its own
    processes, as uid 1000."""
    from tests.hub.hubclient import call

    info = homes
    with _hub_proxy(info) as base:
        tok = _tokens(base, "alice", "bob")
        for user in ("alice", "bob"):
            r = _cli(base, tok[user], tmp_path / user, "workspace", "start", "--project", "nlp",
                     "--fraction", "0.25", "--cpu", "0.5", "--memory", "2")
            assert r.returncode == 0, r.stderr
        try:
            for user in ("alice", "bob"):
                async def ready(user=user):
                    status, body = call(base, tok[user], "GET", f"/hub/api/users/{user}", api=False)
                    return status == 200 and (body["servers"].get("") or {}).get("ready")

                try:
                    run(wait_until(ready, f"{user}'s workspace ready", timeout=400, interval=2))
                except AssertionError:
                    pytest.fail(f"{user}'s workspace did not start:\n{_describe(info)}")
            bob_ip = _workload_pod(info, "ws-bob")["status"]["podIP"]
            r = _cli(base, tok["alice"], tmp_path / "alice", "workspace", "exec", "ws-alice", "--",
                     "python3", "-c", ATTACK, bob_ip, f"{RELEASE}-hub", NS)
            assert r.returncode == 0, r.stderr
            seen = json.loads(r.stdout.strip().splitlines()[-1])
        finally:
            for user in ("alice", "bob"):
                _stop(base, tok[user], user=user)
    assert seen["own_token"], "the workspace has its own server token (the test's premise)"
    assert not seen["sa_token"] and not seen["hub_db"]
    assert seen["k8s_secrets"][0] != 200, seen["k8s_secrets"]
    code, body = seen["hub_users"]
    assert code in (403, 404) or (code == 200 and '"bob"' not in body), seen["hub_users"]
    assert seen["hub_bob"][0] in (403, 404), seen["hub_bob"]
    for key in ("bob_via_proxy", "bob_direct", "bob_direct_no_token"):
        assert seen[key][0] != 200, (key, seen[key])
    assert not any("jupyterhub_config" in c or "configurable-http-proxy" in c
                   for c in seen["procs"]), seen["procs"]
    assert not any("/user/bob/" in c for c in seen["procs"]), seen["procs"]
    assert seen["uid"] == 1000
