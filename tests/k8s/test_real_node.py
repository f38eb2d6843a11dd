"""A real node in the test cluster: containerd and a kubelet in a network namespace of the
run's own (scripts/test-cluster up --real-node). Pods run as real containers; `logs`,
`exec` and `port-forward` go through the API server; a run leaves nothing on the host."""

from __future__ import annotations

import ipaddress
import re
import secrets
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from scheduler.kubernetes.testcluster import ClusterInfo, TestCluster

from .helpers import create_namespace, kube, run, wait_until
from .realnode import (
    HostSnapshot,
    build_test_image,
    cgroup_dirs,
    kubectl,
    ns_inode,
    pids_in,
    pinned_pod,
)

POD_SUBNET = ipaddress.ip_network("10.88.0.0/16")
SERVE = ("/bin/busybox mkdir -p /www && echo {token} > /www/index.html && echo started {token}"
         " && exec /bin/busybox httpd -f -p 8080 -h /www")


async def _start_pod(info: ClusterInfo, ns: str, pod: dict) -> dict:
    """Create ``pod`` in a new namespace ``ns`` and wait until it runs."""
    async with kube(info) as kc:
        await create_namespace(kc, ns)
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

    # Without kube-proxy, the node's own DNAT rule takes the pod to the API server.
    ready = kubectl(info, "-n", "real-node-basics", "exec", "web", "--", "/bin/busybox", "sh",
                    "-c", "/bin/busybox wget -q -O - --no-check-certificate "
                    "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/readyz")
    assert ready.strip() == "ok"

    # port-forward: the pod's address exists only inside the node's namespace, so the
    # page comes through the API server and the kubelet.
    pf = subprocess.Popen([str(info.kubernetes_bin / "kubectl"), "-n", "real-node-basics",
                           "port-forward", "pod/web", ":8080"], env=info.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert pf.stdout is not None
        line = pf.stdout.readline()
        port = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert port, f"no forwarding line: {line!r} {pf.stderr.read() if pf.poll() else ''}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/", timeout=30) as r:
            assert r.read().decode().strip() == token
    finally:
        pf.terminate()
        pf.wait(timeout=10)


def test_a_memory_hog_is_killed_at_its_limit(real_cluster):
    info = real_cluster
    # tail keeps every byte of a line, and /dev/zero's one line never ends: the kernel's
    # OOM killer ends the container at its 16 MiB.
    hog = pinned_pod("hog", info.real_node, "exec /bin/busybox tail /dev/zero", memory="16Mi")
    hog["spec"]["restartPolicy"] = "Never"

    async def terminated():
        async with kube(info) as kc:
            await create_namespace(kc, "real-node-oom")
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
    """A second real-node run on the same host, with a pod running, while the session's
    run is up; after it stops: no process in its namespaces, no cgroup, no mount, no link,
    no host sysctl or /var/lib or /run state changed, and the first run still serves."""
    before = HostSnapshot.take()
    image = build_test_image(tmp_path / "busybox.tar")
    cluster = TestCluster(nodes=0, real_node=True, image_archives=(image,),
                          state_dir=tmp_path / "second")
    info = cluster.start()
    try:
        assert info.node_cgroup != real_cluster.node_cgroup
        assert info.holder_pid is not None
        netns, mntns = ns_inode(info.holder_pid, "net"), ns_inode(info.holder_pid, "mnt")
        assert netns and netns != ns_inode(real_cluster.holder_pid, "net")
        run(_start_pod(info, "second-run", pinned_pod("web", info.real_node,
                                                      SERVE.format(token="second"))))
        assert cgroup_dirs(info.node_cgroup), "the pod's cgroups exist while it runs"
        assert len(pids_in(mntns, "mnt")) >= 4  # holder, containerd, kubelet, a shim...
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
    assert {m for m in after.mounts if str(tmp_path) in m} == set()
    assert Path(f"/proc/{real_cluster.holder_pid}").exists()
    assert real_cluster.real_node in kubectl(real_cluster, "get", "nodes", "-o", "name")


def _async(pred):
    async def call():
        return pred()
    return call


pytestmark = pytest.mark.timeout(600)
