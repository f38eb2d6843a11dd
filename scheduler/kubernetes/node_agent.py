"""``gpupool-node-agent``: publishes a node's GPUs on its Node object (one per GPU node, a
DaemonSet in a cluster).

It reads the GPUs from an inventory source (NVML through pynvml, or an injected inventory:
a JSON/YAML file or a Python callable, for tests and machines without GPUs) and writes
(``--declared-gpus``: where NVML finds no GPU, the declared ones, as embedded mode's
``declared_gpus``):

- labels ``nvidia.com/gpu.present``, ``nvidia.com/gpu.count``, ``nvidia.com/gpu.product``
  (the model, as GPU feature discovery spells it: spaces become ``-``) and
  ``nvidia.com/gpu.memory`` (MiB): what gpupool-scheduler's ``parse_node`` reads;
- annotations ``gpupool.io/gpu-uuids`` (comma list by index, read by the scheduler for
  ``NVIDIA_VISIBLE_DEVICES``), ``gpupool.io/gpus`` (JSON list: index, uuid, model, memory
  MiB, NVLink peers) and ``gpupool.io/gpu-usage`` (JSON list: index, memory used MiB,
  utilization %, refreshed every ``--period``);
- annotation ``gpupool.io/gpu-activity`` (JSON: pod uid -> [launches, allocations, last
  active s]): the interception library's counters of each pod with a share on the node,
  read from the account in the pod's emptyDir under ``--pods-dir`` (the kubelet's folder of
  pods, mounted read-only), refreshed every ``--period``; the hub's culler judges a
  fraction idle by them, as NVML cannot tell two shares of one GPU apart;
- optionally (``--advertise-capacity``, for nodes without the NVIDIA device plugin) the
  ``nvidia.com/gpu`` capacity and allocatable in the node's status.

It also copies the interception library (``--preload-src``, default
``native/build/libgpupool-cuda.so`` when present) to ``--host-lib-dir``/``libgpupool.so``
(write then rename, only when the content changed) for workloads to mount; the workspace
spawner mounts that directory at ``/usr/local/lib/gpupool`` (gpupool-scheduler's default
``--preload-path`` is ``/usr/local/lib/gpupool/libgpupool.so``).

Inventory file format (JSON or YAML)::

    gpus:  [{index: 0, uuid: GPU-..., model: NVIDIA H100 80GB HBM3, memory_mib: 81559,
             nvlink_peers: [1]}, ...]
    usage: [{index: 0, memory_used_mib: 1024, utilization: 37}, ...]   # optional
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import json
import logging
import os
import re
import signal
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..contract import (
    GPU_RESOURCE,
    KUBELET_PODS_DIR,
    REGION_HEAD,
    A,
    Preload,
    region_counters,
    region_host_path,
)

__all__ = [
    "GpuInfo",
    "pod_activity",
    "GpuUsage",
    "NodeAgent",
    "copy_preload",
    "declared_gpus",
    "declared_inventory",
    "inventory_from",
    "main",
    "node_patch",
    "parser",
]

log = logging.getLogger("gpupool.node_agent")

LABEL_PRESENT = "nvidia.com/gpu.present"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
ANN_UUIDS = A.NODE_GPU_UUIDS
ANN_GPUS = "gpupool.io/gpus"
ANN_USAGE = "gpupool.io/gpu-usage"
ANN_ACTIVITY = A.NODE_GPU_ACTIVITY
PRELOAD_NAME = Preload().name
DEFAULT_HOST_LIB_DIR = Preload().host_dir
REPO = Path(__file__).resolve().parents[2]
# embedded mode's declared_gpus defaults (hub_ext.config)
DECLARED_MODEL = "NVIDIA H100 80GB HBM3"
DECLARED_MEMORY_MIB = 81559


@dataclass
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_peers: list[int] = field(default_factory=list)


@dataclass
class GpuUsage:
    index: int
    memory_used_mib: int
    utilization: int  # percent


@dataclass
class Inventory:
    gpus: list[GpuInfo]
    usage: list[GpuUsage] = field(default_factory=list)


# --------------------------------------------------------------------------- inventories
def inventory_from_dict(doc: dict) -> Inventory:
    gpus = [GpuInfo(index=int(g.get("index", i)), uuid=str(g.get("uuid", "")),
                    model=str(g.get("model", "unknown")), memory_mib=int(g.get("memory_mib", 0)),
                    nvlink_peers=[int(p) for p in g.get("nvlink_peers") or []])
            for i, g in enumerate(doc.get("gpus") or [])]
    usage = [GpuUsage(index=int(u["index"]), memory_used_mib=int(u.get("memory_used_mib", 0)),
                      utilization=int(u.get("utilization", 0)))
             for u in doc.get("usage") or []]
    return Inventory(sorted(gpus, key=lambda g: g.index), usage)


def file_inventory(path: str | Path) -> Callable[[], Inventory]:
    """Re-read on every call, so a test (or an operator) can change the usage."""
    import yaml

    def read() -> Inventory:
        return inventory_from_dict(yaml.safe_load(Path(path).read_text()) or {})

    return read


def nvml_inventory() -> Inventory:
    import pynvml as nv

    nv.nvmlInit()
    try:
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        uuids = [_s(nv.nvmlDeviceGetUUID(h)) for h in handles]
        bus = {}
        for i, h in enumerate(handles):
            try:
                bus[_s(nv.nvmlDeviceGetPciInfo(h).busId).lower()] = i
            except nv.NVMLError:
                pass
        gpus, usage = [], []
        for i, h in enumerate(handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            gpus.append(GpuInfo(i, uuids[i], _s(nv.nvmlDeviceGetName(h)), mem.total // 2**20,
                                _nvlink_peers(nv, h, bus, i)))
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            except nv.NVMLError:
                util = 0
            usage.append(GpuUsage(i, mem.used // 2**20, int(util)))
        return Inventory(gpus, usage)
    finally:
        nv.nvmlShutdown()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvlink_peers(nv: Any, h: Any, bus: dict[str, int], me: int) -> list[int]:
    peers: set[int] = set()
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                continue
            remote = _s(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
        except nv.NVMLError:
            continue  # no NVLink on this GPU (or this link): not an error
        if remote in bus and bus[remote] != me:
            peers.add(bus[remote])
    return sorted(peers)


def declared_gpus(text: str) -> dict:
    """``--declared-gpus`` JSON: ``{"count": N, "model": ..., "memory_mib": ...}`` (count 1+,
    model and memory_mib optional, as embedded mode's ``declared_gpus`` entries)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--declared-gpus: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError("--declared-gpus: a JSON object {count, model, memory_mib}")
    unknown = set(doc) - {"count", "model", "memory_mib"}
    if unknown:
        raise argparse.ArgumentTypeError(f"--declared-gpus: unknown fields {sorted(unknown)} "
                                         "(allowed: count, model, memory_mib)")
    out = {"count": doc.get("count", 1), "model": doc.get("model", DECLARED_MODEL),
           "memory_mib": doc.get("memory_mib", DECLARED_MEMORY_MIB)}
    for k in ("count", "memory_mib"):
        if not isinstance(out[k], int) or isinstance(out[k], bool) or not 1 <= out[k] <= 1024 * 1024:
            raise argparse.ArgumentTypeError(f"--declared-gpus: {k} must be an integer from 1 to "
                                             f"{1024 * 1024}, not {out[k]!r}")
    if not isinstance(out["model"], str) or not out["model"].strip():
        raise argparse.ArgumentTypeError("--declared-gpus: model must be a non-empty string")
    return out


def declared_inventory(node: str, declared: dict,
                       nvml: Callable[[], Inventory] = nvml_inventory) -> Callable[[], Inventory]:
    """NVML's GPUs where it finds any, else the declared ones, with embedded mode's UUIDs
    (``GPU-declared-<node>-<index>``): a node without GPUs (a test cluster, a demo) then
    offers GPUs to gpupool-scheduler as an embedded hub's declared node does."""
    gpus = [GpuInfo(j, f"GPU-declared-{node}-{j}", declared["model"], declared["memory_mib"])
            for j in range(declared["count"])]

    def read() -> Inventory:
        try:
            inv = nvml()
        except Exception as e:  # no driver, no pynvml: this node has no NVML to ask
            log.debug("NVML unavailable (%s): declared GPUs", e)
        else:
            if inv.gpus:
                return inv
        return Inventory(list(gpus), [GpuUsage(g.index, 0, 0) for g in gpus])

    return read


def inventory_from(spec: str | None) -> Callable[[], Inventory]:
    """``None``/``nvml``: NVML; a ``.json``/``.yaml``/``.yml`` path: that file;
    ``module:function``: a callable returning an ``Inventory`` or a dict in the file format."""
    if not spec or spec == "nvml":
        return nvml_inventory
    if re.search(r"\.(json|ya?ml)$", spec) or Path(spec).exists():
        return file_inventory(spec)
    mod, _, fn = spec.partition(":")
    obj = getattr(importlib.import_module(mod), fn)

    def call() -> Inventory:
        v = obj()
        return v if isinstance(v, Inventory) else inventory_from_dict(v)

    return call


# ---------------------------------------------------------------------- inventory -> node
def product_label(model: str) -> str:
    """GPU feature discovery's spelling: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``
    (a valid label value: 63 characters at most, alphanumerics and ``-_.``)."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "", re.sub(r"\s+", "-", model.strip()))[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", v) or "unknown"


def node_patch(inv: Inventory) -> dict:
    """The merge patch (labels and annotations) that publishes ``inv`` on a Node."""
    gpus = inv.gpus
    if gpus:
        model = Counter(g.model for g in gpus).most_common(1)[0][0]
        labels: dict[str, str | None] = {
            LABEL_PRESENT: "true", LABEL_COUNT: str(len(gpus)),
            LABEL_PRODUCT: product_label(model),
            # The scheduler gives each GPU of a node this memory: the smallest is safe.
            LABEL_MEMORY: str(min(g.memory_mib for g in gpus)),
        }  # fmt: skip
    else:
        labels = {LABEL_PRESENT: "false", LABEL_COUNT: "0", LABEL_PRODUCT: None,
                  LABEL_MEMORY: None}
    return {"metadata": {"labels": labels, "annotations": {
        ANN_UUIDS: ",".join(g.uuid for g in gpus),
        ANN_GPUS: json.dumps([asdict(g) for g in gpus], separators=(",", ":")),
        ANN_USAGE: usage_json(inv),
    }}}


def usage_json(inv: Inventory) -> str:
    return json.dumps([asdict(u) for u in inv.usage], separators=(",", ":"))


def capacity_patch(inv: Inventory) -> dict:
    n = str(len(inv.gpus))
    return {"status": {"capacity": {GPU_RESOURCE: n}, "allocatable": {GPU_RESOURCE: n}}}


def pod_activity(pods_dir: str | Path) -> dict[str, list]:
    """pod uid -> [launches, allocations, last active s] of every pod under ``pods_dir`` (the
    kubelet's) whose emptyDir holds an account the library wrote."""
    out: dict[str, list] = {}
    try:
        uids = sorted(p.name for p in Path(pods_dir).iterdir())
    except OSError:
        return out
    for uid in uids:
        try:
            with open(region_host_path(str(pods_dir), uid), "rb") as f:
                head = f.read(REGION_HEAD.size)
        except OSError:  # no share, or gone
            continue
        counters = region_counters(head)
        if counters is not None:
            out[uid] = list(counters)
    return out


def activity_json(activity: dict[str, list]) -> str:
    return json.dumps(activity, separators=(",", ":"), sort_keys=True)


# ------------------------------------------------------------------------------- preload
def copy_preload(src: str | Path, host_dir: str | Path, name: str = PRELOAD_NAME) -> bool:
    """Copy ``src`` to ``host_dir/name`` atomically (temporary file in the same directory,
    fsync, rename); nothing is written when the content is already there. True if copied."""
    src, dst = Path(src), Path(host_dir) / name
    data = src.read_bytes()
    if dst.exists() and hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def default_preload_src() -> Path | None:
    p = REPO / "native" / "build" / "libgpupool-cuda.so"
    return p if p.exists() else None


# --------------------------------------------------------------------------------- agent
@dataclass
class NodeAgent:
    """``await agent.sync()`` publishes the whole inventory; ``await agent.run(stop)``
    does so, then refreshes the usage every ``period_s`` (and the rest when it changed)."""

    kc: Any  # scheduler.kubernetes.client.KubeClient
    node: str
    inventory: Callable[[], Inventory]
    period_s: float = 10.0
    advertise_capacity: bool = False
    preload_src: Path | None = None
    host_lib_dir: Path | None = None
    pods_dir: Path | None = None  # the kubelet's folder of pods: the shares' activity
    _published: dict | None = None
    _activity: str | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.node}"

    async def sync(self) -> Inventory:
        inv = await asyncio.to_thread(self.inventory)
        patch = node_patch(inv)
        static = {k: v for k, v in patch["metadata"]["annotations"].items() if k != ANN_USAGE}
        key = {"labels": patch["metadata"]["labels"], "ann": static}
        if key != self._published:
            await self.kc.patch(self.path, patch)
            if self.advertise_capacity:
                await self.kc.patch(f"{self.path}/status", capacity_patch(inv))
            self._published = key
            log.info("node %s: %d GPUs published", self.node, len(inv.gpus))
        else:
            await self.kc.patch(self.path, {"metadata": {"annotations": {ANN_USAGE: usage_json(inv)}}})
        if self.pods_dir is not None:
            seen = activity_json(await asyncio.to_thread(pod_activity, self.pods_dir))
            if seen != self._activity:
                await self.kc.patch(self.path, {"metadata": {"annotations": {ANN_ACTIVITY: seen}}})
                self._activity = seen
        if self.preload_src is not None and self.host_lib_dir is not None:
            if await asyncio.to_thread(copy_preload, self.preload_src, self.host_lib_dir):
                log.info("interception library copied to %s", self.host_lib_dir)
        return inv

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:  # keep going: the next period tries again
                log.exception("node %s: sync failed", self.node)
            try:
                await asyncio.wait_for(stop.wait(), self.period_s)
            except asyncio.TimeoutError:
                pass


# ----------------------------------------------------------------------------------- CLI
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpupool-node-agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                    help="kubeconfig file; in-cluster configuration when unset")
    ap.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                    help="the Node to write (default $NODE_NAME, from the downward API)")
    ap.add_argument("--inventory", default=os.environ.get("GPUPOOL_INVENTORY", "nvml"),
                    help="nvml (default), a JSON/YAML file, or module:function")
    ap.add_argument("--declared-gpus", type=declared_gpus,
                    default=os.environ.get("GPUPOOL_DECLARED_GPUS") or None,
                    help='with --inventory=nvml: the GPUs to publish where NVML finds none, '
                         'as JSON {"count": N, "model": ..., "memory_mib": ...}')
    ap.add_argument("--period", type=float, default=10.0, help="seconds between usage updates")
    ap.add_argument("--advertise-capacity", action="store_true",
                    help=f"also set {GPU_RESOURCE} capacity in the node status (no device plugin)")
    ap.add_argument("--preload-src", default=None,
                    help="interception library to copy (default native/build/libgpupool-cuda.so "
                         "when present)")
    ap.add_argument("--host-lib-dir", default=DEFAULT_HOST_LIB_DIR,
                    help=f"host directory the library is copied to as {PRELOAD_NAME}")
    ap.add_argument("--pods-dir", default=KUBELET_PODS_DIR,
                    help="the kubelet's folder of pods, where the shares' accounts are read "
                         "('' to publish no activity)")
    ap.add_argument("--once", action="store_true", help="publish once and exit")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="more log output (repeatable)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    from .client import KubeClient

    if not args.node_name:
        raise SystemExit("gpupool-node-agent: --node-name (or $NODE_NAME) is required")
    src = Path(args.preload_src) if args.preload_src else default_preload_src()
    kc = await KubeClient.from_kubeconfig(args.kubeconfig)
    inventory = inventory_from(args.inventory)
    if args.declared_gpus:
        if args.inventory != "nvml":
            raise SystemExit("gpupool-node-agent: --declared-gpus goes with --inventory=nvml "
                             f"(not {args.inventory})")
        inventory = declared_inventory(args.node_name, args.declared_gpus)
    agent = NodeAgent(kc, args.node_name, inventory, args.period,
                      args.advertise_capacity, src, Path(args.host_lib_dir),
                      Path(args.pods_dir) if args.pods_dir else None)
    async with kc:
        if args.once:
            await agent.sync()
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose > 1 else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_amain(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
