"""The real node of the test cluster (``scripts/test-cluster up --real-node``) for tests:
its test image, pods pinned to it, ``kubectl`` through the API server, and a snapshot of
what a run may leave on the host."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scheduler.kubernetes.testcluster import REPO, ClusterInfo

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (scripts/setup-system)
TEST_IMAGE = "gpupool.local/busybox:test"
HOST_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
HOST_PATHS = ("/var/lib/cni", "/run/containerd", "/var/lib/kubelet", "/run/netns",
              "/var/log/pods")


def build_test_image(out: Path) -> Path:
    """A one-file image: static busybox (a shell, httpd, cat) as a docker-archive."""
    subprocess.run([str(REPO / "scripts" / "docker-archive"), "--tag", TEST_IMAGE,
                    "--entrypoint", "/bin/busybox", "--out", str(out),
                    f"{BUSYBOX}:/bin/busybox"], check=True)
    return out


PROBE_IMAGE = "gpupool.local/cuda-probe:test"
LIBC = (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/lib64/ld-linux-x86-64.so.2"))


def build_probe_image(out: Path, probe: Path, fake_dir: Path) -> Path:
    """busybox, glibc (the two files a C program linked with only libc needs), the native
    tests' CUDA probe at /opt/probe and the fake driver (``fake_dir``: libcuda.so.1,
    libnvidia-ml.so.1) as the system's: an image in which the interception library (mounted
    by the pod) loads into a real process."""
    subprocess.run([str(REPO / "scripts" / "docker-archive"), "--tag", PROBE_IMAGE,
                    "--entrypoint", "/bin/busybox", "--out", str(out),
                    f"{BUSYBOX}:/bin/busybox", f"{probe}:/opt/probe",
                    *(f"{fake_dir / so}:/lib/x86_64-linux-gnu/{so}"
                      for so in ("libcuda.so.1", "libnvidia-ml.so.1")),
                    *(f"{lib}:{lib}" for lib in LIBC)], check=True)
    return out


def pinned_pod(name: str, node: str, script: str, memory: str = "64Mi") -> dict:
    """A busybox pod bound to ``node`` directly (no scheduler needed) running ``script``."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sh", "-c", script],
                "resources": {"limits": {"memory": memory, "cpu": "500m"}},
            }],
        },
    }


def kubectl(info: ClusterInfo, *args: str, timeout: float = 60) -> str:
    proc = subprocess.run([str(info.kubernetes_bin / "kubectl"), *args], env=info.env(),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


@contextlib.contextmanager
def port_forward(info: ClusterInfo, ns: str, target: str, port: int,
                 local: int = 0) -> Iterator[str]:
    """``kubectl port-forward`` to ``target`` (``pod/NAME``, ``svc/NAME``) ``port`` through
    the API server, on local port ``local`` (0: a free one); yields
    ``http://127.0.0.1:LOCAL``. kubectl ends its forward when one forwarded connection breaks
    (a browser's websocket closed mid-stream does it): it is started again on the same local
    port, and its output is read so that it never blocks on a full pipe."""
    stopping = threading.Event()
    bound: list[int] = []

    def start(at: int) -> subprocess.Popen:
        return subprocess.Popen([str(info.kubernetes_bin / "kubectl"), "-n", ns, "port-forward",
                                 target, f"{at or ''}:{port}"], env=info.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def keep(pf: subprocess.Popen) -> None:
        while True:
            assert pf.stdout is not None
            for _ in pf.stdout:  # "Handling connection for ...": read, not kept
                pass
            pf.wait()
            if stopping.is_set():
                return
            time.sleep(0.5)
            if stopping.is_set():
                return
            pf = procs[0] = start(bound[0])
            assert pf.stdout is not None
            pf.stdout.readline()  # its forwarding line (or its error, and it ends again)

    procs = [start(local)]
    try:
        first = procs[0]
        assert first.stdout is not None
        line = first.stdout.readline()
        found = re.search(r"127\.0\.0\.1:(\d+) -> \d+", line)
        assert found, f"no forwarding line: {line!r} {first.stdout.read() if first.poll() is not None else ''}"
        bound.append(int(found.group(1)))
        threading.Thread(target=keep, args=(first,), daemon=True).start()
        yield f"http://127.0.0.1:{bound[0]}"
    finally:
        stopping.set()
        procs[0].terminate()
        procs[0].wait(timeout=10)


def ns_inode(pid: int, kind: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/ns/{kind}").readlink().name
    except OSError:
        return None


def pids_in(ns_link: str, kind: str) -> list[int]:
    """Every process whose ``kind`` (net, mnt) namespace is ``ns_link`` (e.g. net:[4026…])."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and ns_inode(int(p.name), kind) == ns_link:
            found.append(int(p.name))
    return found


def cgroup_dirs(cgroup: str) -> list[Path]:
    """``cgroup`` (e.g. /gpupool-0123456789) in each mounted hierarchy where it exists."""
    roots = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
             if line.split()[2] in ("cgroup", "cgroup2")]
    return [Path(r + cgroup) for r in roots if Path(r + cgroup).exists()]


@dataclass(frozen=True)
class HostSnapshot:
    """What a real-node run must leave as it found it on the host."""

    sysctls: dict[str, str]
    paths: dict[str, bool]
    links: frozenset[str]
    mounts: frozenset[str]
    iptables: str  # the host's rules (kube-proxy writes only inside the node's namespace)

    @classmethod
    def take(cls) -> HostSnapshot:
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                               check=True).stdout
        return cls(
            sysctls={s: Path("/proc/sys", s).read_text() for s in HOST_SYSCTLS},
            paths={p: Path(p).exists() for p in HOST_PATHS},
            links=frozenset(re.findall(r"^\d+: ([^:@]+)", links, re.M)),
            mounts=frozenset(line.split()[4] for line in
                             Path("/proc/self/mountinfo").read_text().splitlines()),
            iptables=_iptables(),
        )


def _iptables() -> str:
    """The host's iptables rules, without comments and packet counters."""
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return "\n".join(re.sub(r" \[\d+:\d+\]$", "", line) for line in out.splitlines()
                     if not line.startswith("#"))
