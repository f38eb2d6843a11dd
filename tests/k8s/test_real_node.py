"""A real node in the test cluster: containerd and a kubelet in a network namespace of the
run's own (scripts/test-cluster up --real-node). Pods run as real containers; `logs`,
`exec` and `port-forward` go through the API server; memory limits hold; a run leaves
nothing on the host. A workspace with 0.25 GPU, started by GpupoolKubeSpawner from the
chart's workspace image and bound by gpupool-scheduler, runs there with the interception
library loaded and its memory cap holding on the fake driver."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from scheduler.kubernetes.testcluster import REPO, ClusterInfo, TestCluster, script_path

from .helpers import (
    SchedulerProcess,
    create_namespace,
    create_org,
    default_service_account,
    delete_org,
    delete_pods,
    kube,
    run,
    wait_until,
)
from .realnode import (
    HostSnapshot,
    build_test_image,
    cgroup_dirs,
    kubectl,
    ns_inode,
    pids_in,
    pinned_pod,
    port_forward,
)

pytestmark = pytest.mark.timeout(900)

POD_SUBNET = ipaddress.ip_network("10.88.0.0/16")
SERVE = ("/bin/busybox mkdir -p /www && echo {token} > /www/index.html && echo started {token}"
         " && exec /bin/busybox httpd -f -p 8080 -h /www")


async def _start_pod(info: ClusterInfo, ns: str, pod: dict, with_kcm: bool = True) -> dict:
    """Create ``pod`` in a new namespace ``ns`` and wait until it runs."""
    async with kube(info) as kc:
        await create_namespace(kc, ns)
        if with_kcm:
            await default_service_account(kc, ns)
        await kc.post(f"/api/v1/namespaces/{ns}/pods", pod)
        name = pod["metadata"]["name"]

        async def running():
            p = await kc.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            return p if (p.get("status") or {}).get("phase") == "Running" else None

        return await wait_until(running, f"pod {ns}/{name} running", timeout=120)


def test_a_pod_runs_on_the_real_node_with_logs_exec_and_port_forward(real_cluster):
    info, token = real_cluster, secrets.token_hex(8)
    pod = run(_start_pod(info, "real-node-basics",
                         pinned_pod("web", info.real_node, SERVE.format(token=token))))
    assert pod["spec"]["nodeName"] == info.real_node
    assert ipaddress.ip_address(pod["status"]["podIP"]) in POD_SUBNET
    assert pod["status"]["hostIP"] == "10.200.0.1"

    def logs() -> str:
        return kubectl(info, "-n", "real-node-basics", "logs", "web")

    run(wait_until(_async(lambda: f"started {token}" in logs()), "the pod's log line", 30))

    # exec: the container runs in the run's own cgroup tree, under its memory limit.
    cgroup = kubectl(info, "-n", "real-node-basics", "exec", "web", "--",
                     "/bin/busybox", "cat", "/proc/self/cgroup")
    assert f"memory:{info.node_cgroup}/kubepods" in cgroup, cgroup
    limit = kubectl(info, "-n", "real-node-basics", "exec", "web", "--",
                    "/bin/busybox", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert int(limit) == 64 * 2**20

    # The `kubernetes` Service: the node's own DNAT rule takes the pod to the API server, which
    # keeps no endpoints of its own here (busybox has no TLS it accepts, so plain HTTP gets the
    # Go TLS server's own refusal).
    answer = kubectl(info, "-n", "real-node-basics", "exec", "web", "--", "/bin/busybox", "sh",
                     "-c", r"printf 'GET / HTTP/1.0\r\n\r\n' | /bin/busybox nc -w 5 "
                     "$KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT")
    assert "Client sent an HTTP request to an HTTPS server" in answer, answer

    # port-forward: the pod's address exists only inside the node's namespace, so the
    # page comes through the API server and the kubelet.
    with port_forward(info, "real-node-basics", "pod/web", 8080) as base, \
            urllib.request.urlopen(f"{base}/", timeout=30) as r:
        assert r.read().decode().strip() == token


class _Process:
    """The SSH side of a gateway session (what asyncssh hands the backend): no input, and
    what the container writes to its stdout and stderr."""

    def __init__(self):
        self.out, self.err = bytearray(), bytearray()
        self.stdin = self
        self.stdout = type("W", (), {"write": lambda _, d: self.out.extend(d)})()
        self.stderr = type("W", (), {"write": lambda _, d: self.err.extend(d)})()

    async def read(self, n: int) -> bytes:
        return b""


class _Channel:
    """The SSH side of a forwarded connection: what comes back from the pod's port."""

    def __init__(self):
        self.data, self.closed = bytearray(), asyncio.Event()

    def write(self, data: bytes) -> None:
        self.data.extend(data)

    def close(self) -> None:
        self.closed.set()


def test_the_ssh_gateway_reaches_the_workload_container_of_a_real_pod(real_cluster):
    """The SSH gateway's Kubernetes backend (hub_ext/ssh/kubernetes.py) against the real
    kubelet: it finds a pod by the workload its user owns (not another user's), and its
    exec (websocket, v4.channel.k8s.io) and port-forward reach the workload's container,
    the first of the pod's two: the sidecar beside it would make an exec without a
    container name fail."""
    from kubernetes_asyncio import client

    from hub_ext.ssh.kubernetes import KubernetesBackend, _bridge
    from scheduler.contract import A

    info, ns, token = real_cluster, "real-node-gateway", secrets.token_hex(8)
    pod = pinned_pod("echo-0a1b2c", info.real_node, SERVE.format(token=token))
    pod["metadata"]["annotations"] = {A.OWNER: "alice", A.WORKLOAD: "echo-0a1b2c"}
    sidecar = {**pod["spec"]["containers"][0], "name": "sidecar",
               "command": ["/bin/busybox", "sleep", "3600"]}
    pod["spec"]["containers"].append(sidecar)
    run(_start_pod(info, ns, pod))
    cfg = client.Configuration(host=info.host, api_key={"BearerToken": info.token},
                               api_key_prefix={"BearerToken": "Bearer"})
    cfg.ssl_ca_cert = str(info.ca_file)

    async def go():
        b = KubernetesBackend(ns, cfg)
        assert await b.workload("bob", "echo-0a1b2c") is None
        assert await b.workload("alice", "other") is None
        target = await b.workload("alice", "echo-0a1b2c")
        assert target == "echo-0a1b2c"
        proc = _Process()
        script = "/bin/busybox cat /www/index.html; echo to-stderr >&2; exit 7"
        async with b._exec(target, ["/bin/busybox", "sh", "-c", script], tty=False) as ws:
            code = await _bridge(proc, ws)
        session = await b.tcp_session(target, "127.0.0.1", 8080)
        chan = _Channel()
        session.connection_made(chan)
        session.data_received(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n", None)
        await asyncio.wait_for(chan.closed.wait(), 60)
        return code, bytes(proc.out), bytes(proc.err), bytes(chan.data)

    try:
        code, out, err, page = run(go())
    finally:
        async def gone():
            async with kube(info) as kc:
                await delete_pods(kc, ns)

        run(gone())
    assert (code, out.decode().strip(), err.decode().strip()) == (7, token, "to-stderr")
    assert page.startswith(b"HTTP/1.1 200 OK") and page.rstrip().endswith(token.encode()), page


def test_a_service_s_name_reaches_its_pod_through_cluster_dns_and_kube_proxy(real_cluster):
    """A pod finds a Service by its name (CoreDNS behind the kubelet's clusterDNS) and
    reaches the Service's pod at its cluster IP (kube-proxy's rules, inside the node's
    namespace), from another pod and from the Service's own pod; the host's iptables
    hold none of those rules."""
    info, ns, token = real_cluster, "real-node-services", secrets.token_hex(8)
    assert info.cluster_dns == "10.0.0.10"
    try:
        _services_by_name(info, ns, token)
    finally:  # the node's 2 CPUs are for the other tests' pods too

        async def gone():
            async with kube(info) as kc:
                await delete_pods(kc, ns)

        run(gone())


def _services_by_name(info: ClusterInfo, ns: str, token: str) -> None:
    web = pinned_pod("web", info.real_node, SERVE.format(token=token))
    web["metadata"]["labels"] = {"app": "web"}
    run(_start_pod(info, ns, web))
    run(_start_pod(info, ns, pinned_pod("client", info.real_node,
                                        "exec /bin/busybox sleep 3600")))

    async def service():
        async with kube(info) as kc:
            return await kc.post(f"/api/v1/namespaces/{ns}/services", {
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})

    cluster_ip = run(service())["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network("10.0.0.0/24")

    resolv = kubectl(info, "-n", ns, "exec", "client", "--", "/bin/busybox", "cat",
                     "/etc/resolv.conf")
    assert "nameserver 10.0.0.10" in resolv, resolv
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in resolv, resolv

    def fetch(pod: str, host: str) -> str:
        """The page at http://HOST/ (busybox nc: its static wget cannot look up "http")."""
        try:
            return kubectl(info, "-n", ns, "exec", pod, "--", "/bin/busybox", "sh", "-c",
                           r"printf 'GET / HTTP/1.0\r\n\r\n' | /bin/busybox nc -w 5 "
                           f"{host} 80")
        except AssertionError as e:  # the Service's endpoints may not be written yet
            return str(e)

    # by its short name (the search path), from another pod; by its name in the namespace,
    # from the Service's own pod (back to itself through the cluster IP)
    for pod, host in (("client", "web"), ("web", f"web.{ns}.svc")):
        run(wait_until(_async(lambda pod=pod, host=host: fetch(pod, host).rstrip()
                              .endswith(token)), f"http://{host}/ from {pod}", timeout=60,
                       interval=1))
    looked_up = kubectl(info, "-n", ns, "exec", "client", "--", "/bin/busybox", "nslookup",
                        f"web.{ns}.svc.cluster.local")
    assert cluster_ip in looked_up, looked_up

    inside = subprocess.run(["nsenter", "-t", str(info.holder_pid), "-m", "-n", "iptables-save",
                             "-t", "nat"], capture_output=True, text=True, check=True).stdout
    assert cluster_ip in inside and "KUBE-SERVICES" in inside
    host = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=True).stdout
    assert "KUBE-SERVICES" not in host and cluster_ip not in host


def test_a_memory_hog_is_killed_at_its_limit(real_cluster):
    info = real_cluster
    # tail keeps every byte of a line, and /dev/zero's one line never ends: the kernel's
    # OOM killer ends the container at its 16 MiB.
    hog = pinned_pod("hog", info.real_node, "exec /bin/busybox tail /dev/zero", memory="16Mi")
    hog["spec"]["restartPolicy"] = "Never"

    async def terminated():
        async with kube(info) as kc:
            await create_namespace(kc, "real-node-oom")
            await default_service_account(kc, "real-node-oom")
            await kc.post("/api/v1/namespaces/real-node-oom/pods", hog)

            async def reason():
                p = await kc.get("/api/v1/namespaces/real-node-oom/pods/hog")
                for s in (p.get("status") or {}).get("containerStatuses") or []:
                    done = (s.get("state") or {}).get("terminated")
                    if done:
                        return done
                return None

            return await wait_until(reason, "the hog to end", timeout=120)

    done = run(terminated())
    assert done["reason"] == "OOMKilled", done


def test_a_second_run_beside_the_first_and_its_teardown_leaves_nothing(real_cluster,
                                                                       tmp_path):
    """A second real-node run on the same host (with kube-proxy and CoreDNS), with a pod
    running, while the first (the ``real_cluster`` fixture's) is up; after it stops: no
    process in its namespaces, no cgroup, no mount, no link, no host sysctl, iptables rule
    or /var/lib or /run state changed, and the first run still serves."""
    before = HostSnapshot.take()
    image = build_test_image(tmp_path / "busybox.tar")
    (tmp_path / "second").mkdir()
    cluster = TestCluster(nodes=0, real_node=True, cluster_dns=True, image_archives=(image,),
                          state_dir=tmp_path / "second")
    info = cluster.start()
    try:
        assert info.node_cgroup != real_cluster.node_cgroup
        assert info.holder_pid is not None
        netns, mntns = ns_inode(info.holder_pid, "net"), ns_inode(info.holder_pid, "mnt")
        assert netns and netns != ns_inode(real_cluster.holder_pid, "net")
        run(_start_pod(info, "second-run", pinned_pod("web", info.real_node,
                                                      SERVE.format(token="second")),
                       with_kcm=False))
        assert cgroup_dirs(info.node_cgroup), "the pod's cgroups exist while it runs"
        # holder, containerd, kubelet, kube-proxy, CoreDNS, a shim...
        assert len(pids_in(mntns, "mnt")) >= 6
    finally:
        cluster.stop()

    deadline = time.monotonic() + 10
    while pids_in(netns, "net") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_in(netns, "net") == [], "processes left in the node's network namespace"
    assert pids_in(mntns, "mnt") == [], "processes left in the node's mount namespace"
    assert cgroup_dirs(info.node_cgroup) == []
    assert not (tmp_path / "second" / "node").exists()
    after = HostSnapshot.take()
    assert after.sysctls == before.sysctls
    assert after.paths == before.paths
    assert after.links == before.links
    assert after.iptables == before.iptables
    assert {m for m in after.mounts if str(tmp_path) in m} == set()
    assert Path(f"/proc/{real_cluster.holder_pid}").exists()
    assert real_cluster.real_node in kubectl(real_cluster, "get", "nodes", "-o", "name")


def _async(pred):
    async def call():
        return pred()
    return call



# ------------------------------------------------------------- a workspace with 0.25 GPU
DECLARED_GPU = {"count": 1, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
FAKE_CUDA = REPO / "native" / "build" / "fake"  # the fake driver (libcuda.so.1) for no GPU
# In the container: the driver's allocations, 1 GiB at a time until one is refused, and
# what the process has loaded. CUDA_ERROR_OUT_OF_MEMORY is 2.
CAP_PROBE = r"""
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
rcs = []
while len(rcs) < 200 and (not rcs or rcs[-1] == 0):
    rcs.append(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 30))
print(json.dumps({"total": total.value, "rcs": rcs,
                  "env": {k: v for k, v in os.environ.items() if k.startswith(("GPUPOOL_", "LD_"))},
                  "maps": open("/proc/self/maps").read()}))
"""


@pytest.fixture(scope="module")
def workspace_image(real_cluster) -> str:
    """The chart's workspace image (scripts/build-images, cached), loaded into the node."""
    from tests.chart.imagelib import build_images

    built = build_images("workspace")["workspace"]
    subprocess.run([str(script_path()), "import", "--dir", str(real_cluster.state_dir),
                    str(built.archive)], check=True, capture_output=True, timeout=600)
    return built.image


def _node_agent_once(info: ClusterInfo) -> None:
    """gpupool-node-agent on the node (in its mount namespace, as its DaemonSet pod would
    be): one declared GPU with its capacity, and the interception library copied to the
    node's /var/lib/gpupool/lib."""
    subprocess.run(["nsenter", "-t", str(info.holder_pid), "-m", "-n", sys.executable, "-m",
                    "scheduler.kubernetes.node_agent", "--kubeconfig", str(info.kubeconfig),
                    "--node-name", str(info.real_node), "--declared-gpus",
                    json.dumps(DECLARED_GPU), "--advertise-capacity", "--once"],
                   check=True, capture_output=True, cwd=REPO, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def _home_volume(name: str, path: Path) -> dict:
    """A volume for the workspace's home claim (kube-controller-manager binds it)."""
    path.mkdir(mode=0o777, exist_ok=True)
    path.chmod(0o777)  # the image's user (1000) writes its home
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(path), "type": "Directory"}}}


@pytest.mark.images
def test_a_quarter_gpu_workspace_runs_with_the_interception_library_holding_its_cap(
        real_cluster, workspace_image, tmp_path, monkeypatch):
    """GpupoolKubeSpawner starts the workspace image with 0.25 GPU; gpupool-scheduler binds
    it to the real node with its ConfigMap; in the container the fraction's environment is
    set, the interception library is loaded, and the fake driver's allocations stop at the
    fraction's memory."""
    from .test_k8s_spawner import _kspawner, _stop_reflectors

    info, ns = real_cluster, "real-node-workspace"
    _node_agent_once(info)
    Spawner, c = _kspawner(info, ns, "p-real", monkeypatch)
    c.KubeSpawner.image = workspace_image
    c.KubeSpawner.image_pull_policy = "Never"
    # No hub runs here to serve the single-user server's logins: the container idles.
    c.KubeSpawner.cmd = ["python3", "-c", "import time; time.sleep(10**6)"]
    c.KubeSpawner.volumes = [{"name": "fake-cuda", "hostPath": {"path": str(FAKE_CUDA)}}]
    c.KubeSpawner.volume_mounts = [{"name": "fake-cuda", "mountPath": "/opt/fake-cuda",
                                    "readOnly": True}]
    c.KubeSpawner.environment = {"LD_LIBRARY_PATH": "/opt/fake-cuda"}
    sched = SchedulerProcess(info, tmp_path)

    async def go():
        async with kube(info) as kc:
            await create_namespace(kc, ns)
            await default_service_account(kc, ns)
            await kc.apply("/api/v1/persistentvolumes",
                           _home_volume("real-node-home", tmp_path / "home"))
            await create_org(kc, "d-real", 1, {"p-real": {"gpus": 1}})
            sched.start()
            sp = Spawner(config=c, _mock=True)
            try:
                sp.user_options = {"project": "p-real", "gpu_mode": "fraction",
                                   "gpu_fraction": 0.25, "cpu": 1, "memory_gib": 2}
                await asyncio.wait_for(sp.start(), 300)
                pod = await kc.get(f"/api/v1/namespaces/{ns}/pods/{sp.pod_name}")
                cm = await kc.get(f"/api/v1/namespaces/{ns}/configmaps/{sp.pod_name}-gpupool")
                probe = kubectl(info, "-n", ns, "exec", sp.pod_name, "--", "python3", "-c",
                                CAP_PROBE, timeout=120)
                await sp.stop(now=True)
                return pod, cm, json.loads(probe.strip().splitlines()[-1])
            finally:
                await delete_org(kc, "d-real", ["p-real"])
                await _stop_reflectors()

    try:
        pod, cm, probe = run(go())
    finally:
        sched.stop()
        print(f"--- gpupool-scheduler logs ---\n{sched.logs()}")
    assert pod["spec"]["nodeName"] == info.real_node
    assert pod["metadata"]["annotations"]["gpupool.io/gpu-milli"] == "250"
    for key, value in cm["data"].items():  # the fraction's environment, from the ConfigMap
        if key.startswith("GPUPOOL_") or key == "LD_PRELOAD":
            assert probe["env"].get(key) == value, key
    assert probe["env"]["GPUPOOL_GPU_MILLI"] == "250"
    assert cm["data"]["LD_PRELOAD"] in probe["maps"]  # loaded into the process
    limit = probe["total"]
    assert 0 < limit <= DECLARED_GPU["memory_mib"] * 2**20 // 4
    rcs = probe["rcs"]
    assert rcs[-1] == 2 and all(rc == 0 for rc in rcs[:-1]), rcs
    assert (len(rcs) - 1) * 2**30 <= limit < len(rcs) * 2**30
