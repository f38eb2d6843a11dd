"""The five scenarios, each run the same way for every scheduler: the queues and pods come
from ``workload`` (one description), the scheduler starts, a watch on the pods records each
bind and delete, the scheduler stops, and everything the scenario made is deleted.

Each returns a dict of figures; ``None`` where a scheduler cannot do the work (kube-scheduler
has no queues, gangs or fractions: those scenarios are not run for it).
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import schedulers
from workload import (
    CEILING,
    GPUPOOL,
    GPUPOOL_API,
    KAI,
    KAI_API,
    KAI_PG_API,
    NS,
    PodSpec,
    Queue,
    gang_objects,
    pod_object,
    queue_objects,
)

from scheduler.kubernetes.client import ApiError, KubeClient
from scheduler.kubernetes.testcluster import ClusterInfo

CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Bench:
    kc: KubeClient
    info: ClusterInfo
    log_dir: Path
    nodes: list[str]
    gpus_per_node: int
    stall_s: float = 30.0

    @property
    def gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_node


@dataclass
class Pods:
    """What a watch on the bench's namespace saw: first bind and delete of each pod."""

    bound: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    objs: dict[str, dict] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def queue(self, name: str) -> str:
        return self.objs[name]["metadata"]["labels"].get("peers.gpupool.io/queue", "")

    def holding(self, queue: str | None = None) -> list[str]:
        """Bound pods not deleted since (of one queue)."""
        return [n for n in self.bound if n not in self.deleted
                and (queue is None or self.queue(n) == queue)]


async def watch_pods(kc: KubeClient, pods: Pods) -> None:
    def seen(kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        pods.objs[name] = obj
        if kind == "DELETED":
            pods.deleted.setdefault(name, time.perf_counter())
        elif obj["spec"].get("nodeName") and name not in pods.bound:
            pods.bound[name] = time.perf_counter()
        pods.changed.set()

    rv = ""
    while True:
        try:
            if not rv:  # (again) from a list: the watch's start was too old
                items, rv = await kc.list_all(f"/api/v1/namespaces/{NS}/pods")
                for obj in items:
                    seen("ADDED", obj)
            async for ev in kc.watch(f"/api/v1/namespaces/{NS}/pods", rv):
                rv = ev["object"]["metadata"].get("resourceVersion", rv)
                if ev["type"] != "BOOKMARK":
                    seen(ev["type"], ev["object"])
        except ApiError as e:
            if e.status == 410:
                rv = ""
            await asyncio.sleep(0.2)


async def until(pods: Pods, done, stall_s: float, what: str) -> bool:
    """Wait until ``done()``; False when nothing changed for ``stall_s``."""
    while not done():
        pods.changed.clear()
        try:
            await asyncio.wait_for(pods.changed.wait(), stall_s)
        except asyncio.TimeoutError:
            log(f"{what}: stalled")
            return False
    return True


async def create(kc: KubeClient, scheduler: str, specs: list[PodSpec], concurrency: int = 32) -> None:
    for path, obj in gang_objects(scheduler, specs):
        await kc.post(path, obj)
    it = iter(specs)

    async def worker() -> None:
        for p in it:
            await kc.post(f"/api/v1/namespaces/{NS}/pods", pod_object(scheduler, p))

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def make_queues(b: Bench, scheduler: str, queues: list[Queue]) -> None:
    for path, obj in queue_objects(scheduler, queues, b.gpus):
        await b.kc.post(path, obj)


async def clean(b: Bench) -> None:
    """Delete every pod, gang and queue the bench made, and KAI's reservation pods; wait
    until the pods and queues are gone."""
    paths = (f"/api/v1/namespaces/{NS}/pods", f"/api/v1/namespaces/{schedulers.RESERVATION_NS}/pods",
             f"{KAI_PG_API}/namespaces/{NS}/podgroups", f"{KAI_API}/queues",
             f"{GPUPOOL_API}/projects", f"{GPUPOOL_API}/departments")
    for _ in range(20):
        left = False
        for path in paths:
            try:  # thousands of pods outlast the API server's 60 s: delete again what is left
                if not (await b.kc.get(path, limit=1))["items"]:
                    continue
                left = True
                await b.kc.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                                    "gracePeriodSeconds": 0}, timeout=600)
            except ValueError:  # "404 page not found": KAI's CRDs are not installed
                continue
            except (ApiError, asyncio.TimeoutError) as e:
                if isinstance(e, ApiError) and e.status not in (404, 500, 504):
                    raise
                log(f"deleting {path}: {e}; again")
        if not left:
            return
        await asyncio.sleep(1)
    raise RuntimeError("the bench's pods and queues are still there after 20 rounds of deletes")


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK
        except OSError:
            pass
    return total


class Session:
    """One scheduler running for one scenario, with the pod watch; stops and cleans up."""

    def __init__(self, b: Bench, scheduler: str):
        self.b, self.scheduler = b, scheduler
        self.pods = Pods()
        self.run: schedulers.Running | None = None

    async def __aenter__(self) -> Session:
        self._watch = asyncio.create_task(watch_pods(self.b.kc, self.pods))
        return self

    async def start(self, **kw: bool) -> None:
        run = await schedulers.start(self.scheduler, self.b.info, self.b.log_dir,
                                     self.b.nodes, self.b.gpus_per_node, **kw)
        if self.run:  # KAI's podgrouper went first
            run.procs[:0] = self.run.procs
        self.run = run

    async def __aexit__(self, *exc: object) -> None:
        if self.run:
            await self.run.stop()
        self._watch.cancel()
        await clean(self.b)


# ------------------------------------------------------------------------------ scenarios
async def throughput(b: Bench, scheduler: str, n_pods: int) -> dict:
    """Backlog: every pod exists before the scheduler starts; pods/s from first to last bind,
    and the scheduler's CPU seconds (all its processes, start-up included) per 1,000 pods."""
    expect = min(n_pods, b.gpus)
    if scheduler != CEILING:
        await make_queues(b, scheduler, [Queue("team-a", b.gpus)])
    async with Session(b, scheduler) as s:
        specs = [PodSpec(f"t-{i:05d}", "team-a") for i in range(n_pods)]
        await create(b.kc, scheduler, specs, 64)
        grouper_cpu = None
        if scheduler == KAI:  # a backlog in KAI is pods with their PodGroups made already
            await s.start(grouper_only=True)
            await podgroups_made(b.kc, n_pods, b.stall_s)
            grouper_cpu = cpu_s(s.run.pids())
        t0 = time.perf_counter()
        await s.start(grouper=False)
        await until(s.pods, lambda: len(s.pods.bound) >= expect, b.stall_s, f"{scheduler} throughput")
        cpu = cpu_s(s.run.pids()) - (grouper_cpu or 0)
        times = sorted(s.pods.bound.values())
        n = len(times)
        return {
            "pods": n_pods, "bindable": expect, "bound": n,
            "pods_s": round((n - 1) / (times[-1] - times[0]), 1) if n > 1 else 0.0,
            "first_bind_s": round(times[0] - t0, 2) if n else None,
            "cpu_s_per_1000_pods": round(1000 * cpu / n, 2) if n else None,
            # KAI's podgrouper, before the clock: a PodGroup for each pod of the backlog
            "grouping_cpu_s_per_1000_pods": round(1000 * grouper_cpu / n_pods, 2)
            if grouper_cpu is not None else None,
        }


async def podgroups_made(kc: KubeClient, n: int, stall_s: float) -> None:
    last, t_last = -1, time.perf_counter()
    while True:
        have = len((await kc.list_all(f"{KAI_PG_API}/namespaces/{NS}/podgroups"))[0])
        if have >= n:
            return
        if have != last:
            last, t_last = have, time.perf_counter()
        elif time.perf_counter() - t_last > stall_s:
            raise RuntimeError(f"KAI's podgrouper stalled at {have} of {n} PodGroups")
        await asyncio.sleep(1)


async def reclaim(b: Bench, scheduler: str) -> dict:
    """Four queues, a quarter of the GPUs each. q1 and q2 fill their own quarter and borrow
    half of q3's idle one each, q4 fills its own; then q3 asks for its quarter."""
    g = b.gpus
    quarter = g // 4
    qs = [Queue(f"q{i}", quarter) for i in (1, 2, 3, 4)]
    await make_queues(b, scheduler, qs)
    async with Session(b, scheduler) as s:
        await s.start()
        first = ([PodSpec(f"q1-{i:04d}", "q1") for i in range(quarter + quarter // 2)]
                 + [PodSpec(f"q2-{i:04d}", "q2") for i in range(quarter + quarter // 2)]
                 + [PodSpec(f"q4-{i:04d}", "q4") for i in range(quarter)])
        await create(b.kc, scheduler, first)
        filled = await until(s.pods, lambda: len(s.pods.bound) >= len(first), b.stall_s,
                             f"{scheduler} reclaim fill")
        held = {q: len(s.pods.holding(q)) for q in ("q1", "q2", "q4")}
        t0 = time.perf_counter()
        await create(b.kc, scheduler, [PodSpec(f"q3-{i:04d}", "q3") for i in range(quarter)])
        ok = await until(s.pods, lambda: len(s.pods.holding("q3")) >= quarter, b.stall_s,
                         f"{scheduler} reclaim")
        t1 = time.perf_counter()
        await asyncio.sleep(2)  # evictions still on their way count too
        evicted = [n for n, t in s.pods.deleted.items() if t >= t0 and s.pods.queue(n) != "q3"]
        need = max(0, quarter - (g - sum(held.values())))
        return {
            "gpus": g, "filled": filled, "held_before": held,
            "returning_bound": len(s.pods.holding("q3")), "returning_asked": quarter,
            "time_to_all_bound_s": round(t1 - t0, 2) if ok else None,
            "evictions": len(evicted), "needed": need,
            "evictions_beyond_need": len(evicted) - need,
        }


def jain(xs: list[float]) -> float:
    return (sum(xs) ** 2) / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


async def fair_share(b: Bench, scheduler: str, sample_s: float = 0.5) -> dict:
    """Four queues with no quota and over-quota weights 1:1:2:4, each with a backlog of the
    whole cluster; every ``sample_s`` the GPUs each holds against what its weight deserves
    (Jain's index over allocation / deserved), until every GPU is bound and then 5 s more.
    ``series``: each sample's time from the scheduler's start, GPUs held per queue and index.
    A sample's index depends on how many binds have landed when the clock falls (fewer GPUs
    than the weights add up to cannot match them), so ``jain_min_per_change`` is also given:
    the lowest index after any bind or delete the watch saw, once that many GPUs are held;
    ``bind_order``: the queue of each bind, in the order the watch saw them."""
    g = b.gpus
    weights = {"w1a": 1, "w1b": 1, "w2": 2, "w4": 4}
    await make_queues(b, scheduler, [Queue(q, 0, w) for q, w in weights.items()])
    deserved = {q: g * w / sum(weights.values()) for q, w in weights.items()}
    async with Session(b, scheduler) as s:
        specs = [PodSpec(f"{q}-{i:04d}", q) for i in range(g) for q in weights]
        await create(b.kc, scheduler, specs, 64)
        t0 = time.perf_counter()
        await s.start()
        samples: list[float] = []
        series: list[list] = []
        full_at = None
        last_change = time.perf_counter()
        n_last = -1
        while True:
            await asyncio.sleep(sample_s)
            held = {q: len(s.pods.holding(q)) for q in weights}
            n = sum(held.values())
            now = time.perf_counter()
            if n:
                samples.append(jain([held[q] / deserved[q] for q in weights]))
                series.append([round(now - t0, 2), *held.values(), round(samples[-1], 4)])
            if n != n_last:
                n_last, last_change = n, now
            if n >= g and full_at is None:
                full_at = now
            if (full_at and now - full_at >= 5) or now - last_change > b.stall_s:
                break
        return {
            "gpus": g, "weights": weights, "held": held,
            "deserved": {q: round(v, 1) for q, v in deserved.items()},
            "jain_final": round(jain([held[q] / deserved[q] for q in weights]), 4),
            "jain_mean": round(sum(samples) / len(samples), 4) if samples else None,
            "jain_min": round(min(samples), 4) if samples else None,
            "samples": len(samples),
            "jain_min_per_change": jain_min_per_change(s.pods, weights, deserved),
            "evicted": len([n for n in s.pods.deleted if n in s.pods.bound]),
            "series": series,
            "bind_order": [s.pods.queue(n) for n in sorted(s.pods.bound, key=s.pods.bound.get)],
        }


def jain_min_per_change(pods: Pods, weights: dict[str, int], deserved: dict[str, float]) -> float | None:
    """The lowest Jain index after any bind or delete, once the queues hold at least as many
    GPUs as their weights add up to (the fewest that can match the weights)."""
    changes = sorted([(t, 1, n) for n, t in pods.bound.items()]
                     + [(t, -1, n) for n, t in pods.deleted.items() if n in pods.bound])
    held = dict.fromkeys(weights, 0)
    low = None
    for _, step, name in changes:
        held[pods.queue(name)] += step
        if sum(held.values()) >= sum(weights.values()):
            j = jain([held[q] / deserved[q] for q in weights])
            low = j if low is None else min(low, j)
    return None if low is None else round(low, 4)


async def gangs(b: Bench, scheduler: str, gang_size: int = 16, stream_gap_s: float = 0.02) -> dict:
    """Queue "stream" sends single pods one after another (more than the cluster holds); once
    it holds half the GPUs, queue "gang" (quota: half the GPUs) sends a gang of ``gang_size``.
    The time to bind the gang whole, and how long it was bound in part (a partial hold)."""
    g = b.gpus
    await make_queues(b, scheduler, [Queue("stream", g // 2), Queue("gang", g // 2)])
    async with Session(b, scheduler) as s:
        await s.start()
        stop = asyncio.Event()

        async def stream() -> None:
            i = 0
            while not stop.is_set() and i < 2 * g:
                await create(b.kc, scheduler, [PodSpec(f"s-{i:05d}", "stream")], 1)
                i += 1
                await asyncio.sleep(stream_gap_s)

        streamer = asyncio.create_task(stream())
        await until(s.pods, lambda: len(s.pods.holding("stream")) >= g // 2, b.stall_s,
                    f"{scheduler} gang stream")
        t0 = time.perf_counter()
        await create(b.kc, scheduler, [PodSpec(f"gang-{i:02d}", "gang", gang="gang-a",
                                               gang_size=gang_size) for i in range(gang_size)])
        partial_s = 0.0
        t_prev = time.perf_counter()
        whole_at = None
        while time.perf_counter() - t0 < b.stall_s * 2:
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            n = len(s.pods.holding("gang"))
            if 0 < n < gang_size:
                partial_s += now - t_prev
            t_prev = now
            if n >= gang_size:
                whole_at = now
                break
        stop.set()
        await streamer
        gang_bound = [s.pods.bound[n] for n in s.pods.holding("gang")]
        return {
            "gpus": g, "gang_size": gang_size, "gang_bound": len(gang_bound),
            "whole": len(gang_bound) == gang_size,
            "time_to_whole_s": round(whole_at - t0, 2) if whole_at else None,
            "bind_spread_s": round(max(gang_bound) - min(gang_bound), 3) if gang_bound else None,
            "partial_hold_s": round(partial_s, 2),
            "stream_held": len(s.pods.holding("stream")),
        }


def gpus_used(scheduler: str, pods: Pods) -> int:
    """Distinct GPUs the bound fractional pods share, as each scheduler records them."""
    used = set()
    for name in pods.holding():
        meta = pods.objs[name]["metadata"]
        node = pods.objs[name]["spec"].get("nodeName")
        if scheduler == GPUPOOL:
            idx = (meta.get("annotations") or {}).get("gpupool.io/gpu-indices")
        else:
            idx = (meta.get("labels") or {}).get("runai-gpu-group")
        used.add((node, idx))
    return len(used)


async def fractions(b: Bench, scheduler: str, quarters: int, halves: int) -> dict:
    """``quarters`` pods of 0.25 GPU and ``halves`` of 0.5, created interleaved: the GPUs
    they end up on (ideal: quarters/4 + halves/2) and the time until all are bound."""
    await make_queues(b, scheduler, [Queue("frac", b.gpus)])
    async with Session(b, scheduler) as s:
        await s.start()
        specs = []
        for i in range(max(quarters, halves)):
            if i < quarters:
                specs.append(PodSpec(f"f25-{i:04d}", "frac", gpus=0, fraction=0.25))
            if i < halves:
                specs.append(PodSpec(f"f50-{i:04d}", "frac", gpus=0, fraction=0.5))
        t0 = time.perf_counter()
        await create(b.kc, scheduler, specs, 8)
        ok = await until(s.pods, lambda: len(s.pods.holding()) >= len(specs), b.stall_s,
                         f"{scheduler} fractions")
        t1 = time.perf_counter()
        await asyncio.sleep(1)  # the last pods' GPU labels
        return {
            "pods": len(specs), "bound": len(s.pods.holding()),
            "gpus_used": gpus_used(scheduler, s.pods),
            "gpus_ideal": math.ceil(quarters / 4 + halves / 2),
            "time_to_all_bound_s": round(t1 - t0, 2) if ok else None,
        }


__all__ = ["Bench", "KAI", "fair_share", "fractions", "gangs", "reclaim", "throughput"]
