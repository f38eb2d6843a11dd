"""Scheduling throughput on the local cluster: kube-scheduler vs gpupool-scheduler vs a bare
binding loop, side by side on the same cluster in the same run.

    python bench/k8s_throughput.py [--nodes 500] [--gpus-per-node 8] [--pods 5000] [--json]

Each of the three runs twice over single-GPU pods:
  burst    the scheduler runs while the pods are created (``--create-concurrency``
           requests in flight): pods/s = bound / (last bind - first create), and each
           pod's latency runs from its create returning to its bind showing in a watch;
           on this 2-core machine every burst is capped by its CPU (kube-apiserver
           takes most of it; see cpu_ms_per_pod_by_process).
  backlog  all pods exist before the scheduler starts: pods/s = the binding rate from
           the first bind to the last (the scheduler's own speed).
All three are measured the same way: each runs in a process of its own (the bare binder
too), and in burst mode the clock starts only once a probe pod was bound (the scheduler is
up and synced; its start-up is not scheduling speed); the probe keeps its GPU, so a burst
has one bindable pod less. The pods are created the same way for all three: by
``--create-procs`` processes of their own (default 2, ``--create-concurrency`` requests in
flight in all over keep-alive connections, bodies serialised before the clock starts), so
the creator neither shares the bench's event loop nor favours any scheduler.
Each run reports the scheduler process's CPU seconds per bound pod (``cpu_ms_per_pod``:
its whole life; ``binding_cpu_ms_per_pod``: from its first bind to its last, what its
binding rate costs), the CPU per bound pod of every process on the machine in the measured
window (``cpu_ms_per_pod_by_process``: kube-apiserver, etcd, kwok, the creators, the bench,
the scheduler), how busy the machine's cores were (``machine_busy``, everyone's work
included: 1.0 means the cores were the limit), and what the API server was asked
(``api_requests_per_pod``, from its ``apiserver_request_total``). The load average is
printed. kube-scheduler runs with its defaults (``--leader-elect=false`` and its own
serving ports aside): its client's 50 QPS is what limits it, as in the published anchor.
The headline ``*_pods_s`` and ``ratio`` are the backlog rates, ``*_p99_bind_s`` the burst
latencies; ``burst_*`` and ``backlog_*`` keys hold everything. The ceiling is a client loop
that binds each pod to the next free GPU with no scheduling at all: what the API server
allows on this machine. Published anchors on KWOK (YuniKorn's docs): kube-scheduler
~50 pods/s (its default client QPS is 50), YuniKorn 833 pods/s.
``GPUPOOL_BENCH_PROFILE=DIR`` runs gpupool-scheduler under cProfile with the CPU clock
and writes DIR/gpupool-*.prof.
``--constraints`` adds a fourth run, gpupool-scheduler over pods that each carry a node
selector, one of 4 zones by required node affinity and a toleration of a taint that every
node has for that run: ``gpupool_constrained_pods_s`` against ``gpupool_pods_s`` (plain pods,
the same run) is what honouring constraints costs (``constrained_of_plain``).
Note 500 x 8 = 4,000 GPUs for 5,000 pods: the last 1,000 stay pending (as they would on a
full cluster); the rates count the pods that can be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.kubernetes.client import ApiError, KubeClient  # noqa: E402
from scheduler.kubernetes.testcluster import (  # noqa: E402
    ClusterInfo,
    TestCluster,
    apply_crds,
    client_for,
    script_path,
)

NS = "bench"
BIND_CONCURRENCY = 48  # Bindings in flight, gpupool and the bare loop alike (--bind-concurrency)
PROFILE = os.environ.get("GPUPOOL_BENCH_PROFILE", "")  # a folder: cProfile the scheduler
GROUP = "/apis/gpupool.io/v1alpha1"
# --constraints: the constrained pods' node selector, zones and toleration
BENCH_LABEL, ZONE_LABEL, BENCH_TAINT = "gpupool.io/bench-node", "gpupool.io/bench-zone", "gpupool.io/bench"
ZONES = 4


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pod(name: str, scheduler: str, constrained: bool = False, k: int = 0) -> dict:
    ann = {"gpupool.io/project": "bench", "gpupool.io/kind": "training"}
    obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": ann},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "busybox", "resources": {
                     "requests": {"cpu": "100m", "memory": "64Mi"},
                     "limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    if constrained:  # --constraints: a node selector, one zone of ZONES by affinity, a toleration
        obj["spec"].update(
            nodeSelector={BENCH_LABEL: "true"},
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [f"z{k % ZONES}"]}]}]}}},
            tolerations=[{"key": BENCH_TAINT, "operator": "Exists", "effect": "NoSchedule"}])
    return obj


async def constrain_nodes(kc: KubeClient, nodes: list[str], on: bool) -> None:
    """--constraints: label every node with a zone (ZONES of them, equal shares) and taint it
    (on), or take the taint off again (off): the constrained pods tolerate it, others not."""
    sem = asyncio.Semaphore(32)

    async def one(i: int, name: str) -> None:
        taints = [{"key": BENCH_TAINT, "value": "yes", "effect": "NoSchedule"}] if on else None
        async with sem:
            await kc.patch(f"/api/v1/nodes/{name}", {
                "metadata": {"labels": {BENCH_LABEL: "true", ZONE_LABEL: f"z{i % ZONES}"}},
                "spec": {"taints": taints}})

    await asyncio.gather(*(one(i, n) for i, n in enumerate(nodes)))


async def wait_empty(kc: KubeClient) -> None:
    while True:
        try:  # thousands of pods: on a busy machine this outlasts a request's timeout
            await kc.request("DELETE", f"/api/v1/namespaces/{NS}/pods",
                             {"apiVersion": "v1", "kind": "DeleteOptions",
                              "gracePeriodSeconds": 0}, timeout=600)
        except (asyncio.TimeoutError, ApiError) as e:
            if isinstance(e, ApiError) and e.status != 504:  # 504: the API server's timeout
                raise
            log("deleting the pods is slow; waiting, then deleting what is left")
        for _ in range(120):
            if not (await kc.get(f"/api/v1/namespaces/{NS}/pods", limit=1))["items"]:
                return
            await asyncio.sleep(0.5)


async def probe(kc: KubeClient, scheduler: str, constrained: bool, timeout_s: float = 180) -> None:
    """Create one pod and wait until it is bound: the scheduler is up and synced."""
    name = f"{scheduler[:8]}-probe"
    await kc.post(f"/api/v1/namespaces/{NS}/pods", pod(name, scheduler, constrained))
    end = time.monotonic() + timeout_s
    while not (await kc.get(f"/api/v1/namespaces/{NS}/pods/{name}"))["spec"].get("nodeName"):
        if time.monotonic() > end:
            raise RuntimeError(f"{scheduler} did not bind its probe pod in {timeout_s} s")
        await asyncio.sleep(0.1)


async def measure(kc: KubeClient, scheduler: str, n: int, expect: int, concurrency: int,
                  stall_s: float, start, backlog: bool, constrained: bool = False) -> dict:
    """Create n pods for ``scheduler`` and return the throughput and latency of their
    binds. burst: ``start()`` runs first, pods arrive while it schedules; pods/s is
    bound / (last bind - first create). backlog: every pod exists before ``start()``;
    pods/s is the binding rate from the first bind to the last."""
    bound: dict[str, float] = {}
    cpu_first = [0.0]  # the scheduler's CPU seconds when its first bind showed
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal rv
        while not done.is_set():
            try:
                async for ev in kc.watch(f"/api/v1/namespaces/{NS}/pods", rv,
                                         fieldSelector=f"spec.schedulerName={scheduler}"):
                    obj = ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    name = obj["metadata"].get("name")
                    if name and name not in bound and (obj.get("spec") or {}).get("nodeName") \
                            and not name.endswith("-probe"):
                        bound[name] = time.perf_counter()
                        if len(bound) == 1:
                            cpu_first[0] = cpu_s(WATCHED["scheduler"])
                        if len(bound) >= expect:
                            done.set()
                            return
            except ApiError as e:
                log(f"watch: {e}")
                await asyncio.sleep(0.2)

    if not backlog:
        await start()
        await probe(kc, scheduler, constrained)
        expect -= 1  # the probe holds one GPU
    _, rv = await kc.list_all(f"/api/v1/namespaces/{NS}/pods", limit=1)
    watcher = asyncio.create_task(watch())
    req0 = await api_requests(kc)
    cpu0 = cpu_now()
    t0 = time.perf_counter()
    created, creators_cpu = await create_pods(scheduler, n, concurrency, constrained)
    t_created = time.perf_counter()
    t_start = t0
    if backlog:
        req0 = await api_requests(kc)
        cpu0 = cpu_now()
        t_start = time.perf_counter()
        await start()
    last = len(bound)
    while not done.is_set():  # stop at `expect` binds, or when binds stop coming
        try:
            await asyncio.wait_for(done.wait(), timeout=stall_s)
        except asyncio.TimeoutError:
            if len(bound) == last:
                log(f"{scheduler}: stalled at {len(bound)} of {expect}")
                break
            last = len(bound)
    watcher.cancel()
    cpu1 = cpu_now()
    req1 = await api_requests(kc)
    if not backlog:
        cpu1["creators"] = creators_cpu
    if os.environ.get("GPUPOOL_BENCH_DUMP"):  # a folder: each pod's create and bind times
        Path(os.environ["GPUPOOL_BENCH_DUMP"], f"{scheduler}-{'backlog' if backlog else 'burst'}"
             ".json").write_text(json.dumps({"t0": t0, "created": created, "bound": bound}))
    lat = sorted(bound[k] - created[k] for k in bound if k in created)
    t_end = max(bound.values()) if bound else time.perf_counter()

    def p(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

    if backlog:
        t_first = min(bound.values()) if bound else t_end
        rate = (len(bound) - 1) / (t_end - t_first) if len(bound) > 1 else 0.0
    else:
        rate = len(bound) / (t_end - t0) if bound else 0.0
    return {
        "bound": len(bound),
        "pods_s": rate,
        "first_bind_s": (min(bound.values()) - t_start) if bound else None,
        "create_pods_s": n / (t_created - t0),
        "p50_bind_s": p(0.50),
        "p99_bind_s": p(0.99),
        "wall_s": t_end - t0,
        # CPU per bound pod of everything on the machine, from the first create (burst) or
        # the scheduler's start (backlog) to the end: who the two cores went to
        "cpu_ms_per_pod_by_process": {k: round(1000 * (cpu1[k] - cpu0.get(k, 0)) / len(bound), 3)
                                      for k in cpu1 if k != "machine"} if bound else None,
        # what the API server was asked in that time (its own metrics), per bound pod
        "api_requests_per_pod": {k: round((v - req0.get(k, 0)) / len(bound), 3)
                                 for k, v in sorted(req1.items())
                                 if (v - req0.get(k, 0)) >= 0.01 * len(bound)} if bound else None,
        # the scheduler's CPU from its first bind to its last: what its binding rate costs
        "binding_cpu_ms_per_pod": round(1000 * (cpu1["scheduler"] - cpu_first[0])
                                        / (len(bound) - 1), 3) if len(bound) > 1 else None,
        "machine_busy": round((cpu1["machine"] - cpu0["machine"])
                              / (os.cpu_count() * (time.perf_counter() - (t0 if not backlog else t_start))), 3),
    }


CREATOR_PROCS = 2  # processes creating pods in a burst (``--create-procs``)


async def create_pods(scheduler: str, n: int, concurrency: int, constrained: bool = False
                      ) -> tuple[dict[str, float], float]:
    """Create n pods from ``CREATOR_PROCS`` processes of their own (the same for every
    scheduler), ``concurrency`` requests in flight in all over keep-alive connections,
    bodies serialised before the clock starts; returns each pod's create-done time
    (time.perf_counter: CLOCK_MONOTONIC, the same clock in every process) and the
    creators' CPU seconds."""
    procs = []
    for k in range(CREATOR_PROCS):
        job = Path(CLUSTER.state_dir) / f"creator-{k}.json"
        job.write_text(json.dumps({
            "host": CLUSTER.host, "token": CLUSTER.token, "ca_file": str(CLUSTER.ca_file),
            "scheduler": scheduler, "indices": list(range(k, n, CREATOR_PROCS)), "constrained": constrained,
            "concurrency": max(1, concurrency // CREATOR_PROCS)}))
        procs.append((job, await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--creator", str(job))))
    created: dict[str, float] = {}
    cpu = 0.0
    for job, proc in procs:
        if await proc.wait() != 0:
            raise RuntimeError(f"pod creator {job} failed")
        out = json.loads(job.with_suffix(".out").read_text())
        created.update(out["created"])
        cpu += out["cpu_s"]
    return created, cpu


def run_creator(job_path: str) -> int:
    """One creator process (``--creator JOB.json``): POST pre-serialised pods."""
    job = json.loads(Path(job_path).read_text())
    sched = job["scheduler"]
    bodies = [(f"{sched[:8]}-{i:05d}", json.dumps(pod(f"{sched[:8]}-{i:05d}", sched, job["constrained"], i)).encode())
              for i in job["indices"]]
    done: dict[str, float] = {}

    async def go() -> None:
        async with KubeClient(job["host"], job["token"], job["ca_file"],
                              max_connections=job["concurrency"]) as kc:
            it = iter(bodies)

            async def worker() -> None:
                for name, body in it:
                    await kc.request("POST", f"/api/v1/namespaces/{NS}/pods", body, decode=False)
                    done[name] = time.perf_counter()

            await asyncio.gather(*(worker() for _ in range(job["concurrency"])))

    uvloop.run(go())
    cpu = time.process_time()
    Path(job_path).with_suffix(".out").write_text(json.dumps({"created": done, "cpu_s": cpu}))
    return 0


async def api_requests(kc: KubeClient) -> dict[str, float]:
    """The API server's ``apiserver_request_total`` by "VERB resource[/subresource]"."""
    text = (await kc.request("GET", "/metrics", decode=False, as_bytes=True)).decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")]
                      .replace('"', "").split(",") if "=" in kv)
        if not labels.get("resource"):
            continue
        key = f"{labels['verb']} {labels['resource']}" + \
            (f"/{labels['subresource']}" if labels.get("subresource") else "")
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


CLK = os.sysconf("SC_CLK_TCK")
CLUSTER: ClusterInfo | None = None
CLUSTER_PGID = -1
WATCHED: dict[str, int] = {}  # name -> pid of the scheduler process in this run


def cpu_now() -> dict[str, float]:
    """CPU seconds so far of the cluster's processes (by name), the bench, the creators
    and the scheduler under test, and of the whole machine (``machine``: busy jiffies of
    all cores, everyone's work included)."""
    out: dict[str, float] = {"bench": time.process_time()}
    pgid = CLUSTER_PGID
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK
        if int(fields[2]) == pgid and comm in ("etcd", "kube-apiserver", "kwok"):
            out[comm] = out.get(comm, 0.0) + cpu
    for name, pid in WATCHED.items():
        try:
            out[name] = cpu_s(pid)
        except OSError:
            pass
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    out["machine"] = (sum(v[:8]) - v[3] - v[4]) / CLK
    return out


async def bare_binder(kc: KubeClient, nodes: list[str], gpus: int, scheduler: str,
                      concurrency: int, ns: str = NS) -> None:
    """The ceiling: bind each new pod to the next node with a free GPU, nothing else."""
    free = {n: gpus for n in nodes}
    order = iter([n for n in nodes for _ in range(gpus)])
    sem = asyncio.Semaphore(concurrency)
    existing, rv = await kc.list_all(f"/api/v1/namespaces/{ns}/pods",
                                     fieldSelector=f"spec.schedulerName={scheduler}")

    async def bind(name: str, node: str) -> None:
        async with sem:
            await kc.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, decode=False)

    tasks = set()

    async def events():
        for obj in existing:
            yield {"type": "ADDED", "object": obj}
        async for ev in kc.watch(f"/api/v1/namespaces/{ns}/pods", rv,
                                 fieldSelector=f"spec.schedulerName={scheduler}"):
            yield ev

    async for ev in events():
        obj = ev["object"]
        if ev["type"] != "ADDED" or (obj.get("spec") or {}).get("nodeName"):
            continue
        node = next(order, None)
        if node is None:
            continue
        free[node] -= 1
        t = asyncio.create_task(bind(obj["metadata"]["name"], node))
        tasks.add(t)
        t.add_done_callback(tasks.discard)


async def setup(info: ClusterInfo, nodes: int, gpus: int) -> list[str]:
    async with client_for(info) as kc:
        try:
            await kc.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NS}})
        except ApiError as e:
            if e.status != 409:
                raise
        await apply_crds(info)
        total = nodes * gpus
        for path, body in [
            (f"{GROUP}/departments", {"apiVersion": "gpupool.io/v1alpha1", "kind": "Department",
                                      "metadata": {"name": "bench"},
                                      "spec": {"quotas": {"default": {"gpus": total}}}}),
            (f"{GROUP}/projects", {"apiVersion": "gpupool.io/v1alpha1", "kind": "Project",
                                   "metadata": {"name": "bench"},
                                   "spec": {"department": "bench",
                                            "quotas": {"default": {"gpus": total}}}}),
        ]:
            try:
                await kc.post(path, body)
            except ApiError as e:
                if e.status != 409:
                    raise
        have = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
        if len(have) < nodes:
            log(f"creating {nodes - len(have)} kwok nodes")
            subprocess.run([str(script_path()), "nodes", "--dir", str(info.state_dir),
                            "--start", str(len(have)), "--count", str(nodes - len(have)),
                            "--gpus-per-node", str(gpus)], check=True)
        while True:
            items = (await kc.get("/api/v1/nodes", labelSelector="type=kwok"))["items"]
            ready = [n["metadata"]["name"] for n in items if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions", []))]
            if len(ready) >= nodes:
                return sorted(ready)[:nodes]
            await asyncio.sleep(1)


def start_kube_scheduler(info: ClusterInfo, log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / "kube-scheduler.log", "wb")  # noqa: SIM115
    return subprocess.Popen([
        str(info.kubernetes_bin / "kube-scheduler"), f"--kubeconfig={info.kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
        f"--authentication-kubeconfig={info.kubeconfig}",
        f"--authorization-kubeconfig={info.kubeconfig}", "--profiling=false",
    ], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def start_gpupool(info: ClusterInfo, log_dir: Path) -> subprocess.Popen:
    out = open(Path(PROFILE or log_dir) / "gpupool-scheduler.log", "ab")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # cProfile with the CPU clock: wall time would charge the others' load to whatever
    # function was running when the scheduler was preempted
    prof = ["-c", ("import cProfile, sys, time; from scheduler.kubernetes.cli import main; "
            "p = cProfile.Profile(time.process_time); sys.argv[0] = 'gpupool-scheduler'; "
            "rc = p.runcall(main); "
            f"p.dump_stats({str(Path(PROFILE) / f'gpupool-{time.time():.0f}.prof')!r}); "
            "sys.exit(rc)")] if PROFILE else ["-m", "scheduler.kubernetes"]
    return subprocess.Popen([sys.executable, *prof, "--kubeconfig",
                             str(info.kubeconfig), "--lease-name", "gpupool-bench", "-v",
                             "--bind-concurrency", str(BIND_CONCURRENCY)],
                            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def start_bare_binder(info: ClusterInfo, log_dir: Path, nodes: list[str],
                      gpus: int) -> subprocess.Popen:
    out = open(log_dir / "bare-binder.log", "wb")  # noqa: SIM115
    job = log_dir / "bare-binder.json"
    job.write_text(json.dumps({"nodes": nodes, "host": info.host, "token": info.token,
                               "ca_file": str(info.ca_file), "concurrency": BIND_CONCURRENCY}))
    return subprocess.Popen([sys.executable, __file__, "--bare-binder", str(job),
                             "--gpus-per-node", str(gpus)], stdout=out, stderr=subprocess.STDOUT)


def run_bare_binder(args: argparse.Namespace) -> int:
    """The bare binder's own process (``--bare-binder JOB.json``), until SIGTERM."""
    job = json.loads(Path(args.bare_binder).read_text())

    async def go() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
        async with KubeClient(job["host"], job["token"], job["ca_file"],
                              max_connections=job["concurrency"] + 16) as kb:
            task = asyncio.create_task(bare_binder(
                kb, job["nodes"], args.gpus_per_node, job.get("scheduler", "bench-bare"),
                job["concurrency"], job.get("namespace", NS)))
            await asyncio.wait([task, asyncio.create_task(stopped.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            task.cancel()

    asyncio.run(go())
    return 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def main_async(args: argparse.Namespace, info: ClusterInfo) -> dict:
    nodes = await setup(info, args.nodes, args.gpus_per_node)
    expect = min(args.pods, args.nodes * args.gpus_per_node)
    out: dict = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods": args.pods,
                 "bindable_pods": expect}
    log_dir = info.state_dir / "logs"
    procs: list = []

    def started(p: subprocess.Popen) -> None:
        procs.append(p)
        WATCHED["scheduler"] = p.pid

    async def start_ks():
        started(start_kube_scheduler(info, log_dir))

    async def start_gp():
        started(start_gpupool(info, log_dir))

    async def start_bare():
        started(start_bare_binder(info, log_dir, nodes, args.gpus_per_node))

    async def stop_all():
        for p in procs:
            stop(p)
        procs.clear()
        WATCHED.clear()

    runners = [("gpupool", "gpupool", start_gp), ("ceiling", "bench-bare", start_bare)]
    if args.constraints:  # last: the taint it puts on the nodes is taken off after it
        runners.append(("gpupool_constrained", "gpupool", start_gp))
    if not args.skip_kube_scheduler:
        runners.insert(0, ("kube_scheduler", "default-scheduler", start_ks))
    runners = [r for r in runners if r[0] in args.only] if args.only else runners
    async with client_for(info, max_connections=args.create_concurrency + 8) as kc:
        await wait_empty(kc)
        for backlog in [m == "backlog" for m in args.modes]:
            mode = "backlog" if backlog else "burst"
            for key, sched_name, start in runners:
                log(f"{key}, {mode}")
                constrained = key == "gpupool_constrained"
                if constrained:
                    await constrain_nodes(kc, nodes, on=True)
                try:
                    r = await measure(kc, sched_name, args.pods, expect, args.create_concurrency,
                                      args.stall_s, start, backlog, constrained)
                    r["cpu_ms_per_pod"] = (1000 * cpu_s(procs[-1].pid) / r["bound"]
                                           if r["bound"] else None)
                finally:
                    await stop_all()
                    if constrained:
                        await constrain_nodes(kc, nodes, on=False)
                log(f"{key}, {mode}: {r}")
                out.update({f"{mode}_{key}_{k}": v for k, v in r.items()})
                await wait_empty(kc)

    # Headline: binding rate with a backlog (the scheduler's own speed, not the rate the
    # bench creates pods at); latency: create-to-bound in the burst.
    for key, _, _ in runners:
        out[f"{key}_pods_s"] = out.get(f"backlog_{key}_pods_s")
        out[f"{key}_p99_bind_s"] = out.get(f"burst_{key}_p99_bind_s")

    def ratio(a: str, b: str) -> float | None:
        return out[a] / out[b] if out.get(a) and out.get(b) else None

    out["ratio"] = ratio("gpupool_pods_s", "kube_scheduler_pods_s")
    out["gpupool_of_ceiling"] = ratio("gpupool_pods_s", "ceiling_pods_s")
    out["burst_ratio"] = ratio("burst_gpupool_pods_s", "burst_kube_scheduler_pods_s")
    out["burst_gpupool_of_ceiling"] = ratio("burst_gpupool_pods_s", "burst_ceiling_pods_s")
    out["constrained_of_plain"] = ratio("gpupool_constrained_pods_s", "gpupool_pods_s")
    out["constrained_of_ceiling"] = ratio("gpupool_constrained_pods_s", "ceiling_pods_s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--create-concurrency", type=int, default=64)
    ap.add_argument("--stall-s", type=float, default=20.0,
                    help="end a run when no pod was bound for this long")
    ap.add_argument("--skip-kube-scheduler", action="store_true")
    ap.add_argument("--modes", nargs="+", choices=("burst", "backlog"), default=["burst", "backlog"])
    ap.add_argument("--only", nargs="+", choices=("kube_scheduler", "gpupool", "ceiling", "gpupool_constrained"),
                    help="run only these (the ratios then need the others)")
    ap.add_argument("--constraints", action="store_true",
                    help="also gpupool-scheduler over pods with a node selector, a zone by node "
                         "affinity (4 zones) and a toleration of a taint every node then has")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--bind-concurrency", type=int, default=48,
                    help="Bindings in flight for gpupool-scheduler and the bare loop")
    ap.add_argument("--create-procs", type=int, default=2,
                    help="processes creating the pods (each with create-concurrency/N in flight)")
    ap.add_argument("--bare-binder", metavar="JOB.json", help=argparse.SUPPRESS)
    ap.add_argument("--creator", metavar="JOB.json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global BIND_CONCURRENCY
    BIND_CONCURRENCY = args.bind_concurrency
    if args.bare_binder:
        return run_bare_binder(args)
    if args.creator:
        return run_creator(args.creator)
    load0 = os.getloadavg()

    cluster = TestCluster(nodes=0, gpus_per_node=args.gpus_per_node)
    info = cluster.start()
    global CLUSTER, CLUSTER_PGID, CREATOR_PROCS
    CLUSTER, CLUSTER_PGID, CREATOR_PROCS = info, cluster._proc.pid, args.create_procs
    try:
        out = asyncio.run(main_async(args, info))
    finally:
        cluster.stop()
    out["cpus"] = os.cpu_count()
    out["loadavg_before"] = [round(x, 2) for x in load0]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if not args.json:
        for k in ("kube_scheduler_pods_s", "gpupool_pods_s", "ratio", "ceiling_pods_s",
                  "gpupool_of_ceiling", "gpupool_p99_bind_s", "kube_scheduler_p99_bind_s",
                  "burst_kube_scheduler_pods_s", "burst_gpupool_pods_s", "burst_ceiling_pods_s",
                  "gpupool_constrained_pods_s", "constrained_of_plain", "constrained_of_ceiling"):
            v = out.get(k)
            print(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
