"""What the inference activator adds: latency against calling the replica directly, and
cold start from zero against the model server's own start.

Three processes: the model server (tests/inference/model_server.py), the activator
(``python -m hub_ext.serving``: embedded scheduler + controller + activator) and this one, the
load generator (a bare keep-alive HTTP/1.1 client per simulated user, so the client's own
cost stays small and equal on both paths). At each concurrency every user keeps one
connection per way (direct to the replica, through the activator) for the whole
measurement, warmed first (``--warmup`` untimed requests each: connections, the
activator's pool, caches); then ``--rounds`` rounds, each sending the same number of
requests along every way, the order reversed every other round (direct, activator,
activator, direct, ...) so that a load that drifts during the run weighs on both ways
alike. Added latency = p50/p99 of all rounds through the activator minus the same
direct; ``added_p50_ms_cN_round_quartiles`` says how much the per-round difference moved.
By default 20,000 requests per way at c > 1 (1,000 at c = 1) in 20 rounds: short rounds,
so that the two of a pair see nearly the same background load.

CPU: the machine this runs on has 2 cores shared with other work, and at 50 clients the
three processes saturate them, so added latency there is mostly the activator's CPU per
request times the queue in front of the cores. The bench therefore also reports each
process's CPU time per request (``activator_cpu_us_per_req_cN``, ``replica_cpu_us_...``,
``client_cpu_us_...``, from /proc/PID/task/*/schedstat and ``time.process_time``), which does not depend on the
others' load, and the load average before and after.

Two placements, each with its own interleaved direct/activated rounds: the headline keys
(``added_p50_ms_c50`` ...) let every process run on every core (the activator's CPU competes
with the client's and the replica's); ``own_core_*`` pins the activator to a core of its
own and the client and replica to the other(s) in both runs, as deployed (the activator in
its own pod), so the added latency is the activator's own and not the CPU it takes from the
replica. Other work on the machine still runs on all cores.

Before/after in one run: ``--baseline-rev REV`` also starts the activator of git revision
REV (its activator package unpacked to a temporary folder, with a replica of its own)
and measures it as a third way in the same rounds (``baseline_*`` keys).

Cold start: a service at zero replicas gets one request; the time to its response minus
the model server's own start (exec until it answers, measured by starting it directly
the same number of times). Targets: p50 < 1 ms and p99 < 5 ms added at 50 clients; cold
start added < 500 ms (Knative's published hello-world cold start: 2-4 s).

    python bench/activator.py [--json] [--requests 20000] [--rounds 20] [--delay-ms 5]
                              [--startup-s 0.3] [--loop uvloop|asyncio] [--baseline-rev REV]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "inference" / "model_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one(reader, writer, path: bytes) -> None:
    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: b\r\n\r\n")
    line = await reader.readline()
    if not line.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad answer {line!r}")
    length = 0
    while (h := await reader.readline()) not in (b"\r\n", b""):
        if h.lower().startswith(b"content-length:"):
            length = int(h.split(b":")[1])
    await reader.readexactly(length)


Users = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


async def connect(port: int, clients: int) -> Users:
    """One keep-alive connection per simulated user, kept for all the rounds."""
    return await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                  for _ in range(clients)))


async def run_round(users: Users, path: bytes, per: int) -> list[float]:
    """Every user sends ``per`` requests, one after the other; the latency of each."""
    lat: list[float] = []

    async def user(r, w):
        for _ in range(per):
            t = time.perf_counter()
            await one(r, w, path)
            lat.append(time.perf_counter() - t)

    await asyncio.gather(*(user(r, w) for r, w in users))
    return lat


def cpu_s(pid: int) -> float:
    """CPU seconds of one process, all its threads, not its children: schedstat's
    nanoseconds where the kernel has them, else /proc/PID/stat's clock ticks."""
    total, found = 0, False
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
            found = True
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    if found:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


async def wait_http(port: int, path: str, timeout: float = 60) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            await one(r, w, path.encode())
            w.close()
            return time.perf_counter() - t0
        except (OSError, RuntimeError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.002)
    raise RuntimeError(f"nothing answered on {port}{path}")


def start(cmd: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    p.wait()


class Way(NamedTuple):
    """One way to the model server: directly, or through an activator (its pid)."""

    label: str
    port: int
    path: bytes
    pid: int | None


async def measure(out: dict, prefix: str, c: int, args, ways: list[Way], rpid: int) -> None:
    """Rounds over every way (direct first), alternating the order (forward, then
    backward: a load that drifts during the run weighs on all ways alike); latency
    percentiles over all rounds, CPU per request of each process."""
    n = args.requests if c > 1 else args.requests_c1
    per = max(1, n // (args.rounds * c))
    users = {w.label: await connect(w.port, c) for w in ways}
    for w in ways:  # warm: connections, the activator's pool to the replica, caches
        await run_round(users[w.label], w.path, args.warmup)
    pids = [rpid] + [w.pid for w in ways if w.pid]
    lat: dict[str, list[float]] = {w.label: [] for w in ways}
    p50s: dict[str, list[float]] = {w.label: [] for w in ways}
    wall = dict.fromkeys(lat, 0.0)
    client = dict.fromkeys(lat, 0.0)
    used = {w.label: dict.fromkeys(pids, 0.0) for w in ways}  # CPU of each pid in w's rounds
    for i in range(args.rounds):
        for w in ways if i % 2 == 0 else ways[::-1]:
            before = {p: cpu_s(p) for p in pids}
            c0, t0 = time.process_time(), time.perf_counter()
            got = await run_round(users[w.label], w.path, per)
            wall[w.label] += time.perf_counter() - t0
            client[w.label] += time.process_time() - c0
            for p in pids:
                used[w.label][p] += cpu_s(p) - before[p]
            lat[w.label] += got
            p50s[w.label].append(pct(got, 0.5))
    for u in users.values():
        for _, wr in u:
            wr.close()

    direct = ways[0].label
    per_req = 1e6 / (per * c * args.rounds)
    out[f"{prefix}requests_per_way_c{c}"] = per * c * args.rounds
    out[f"{prefix}direct_client_plus_replica_cpu_us_per_req_c{c}"] = round(
        (client[direct] + used[direct][rpid]) * per_req, 1)
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        out[f"{prefix}direct_{key}_ms_c{c}"] = round(pct(lat[direct], q), 3)
    for w in ways[1:]:
        name = "activator" if w.label == "activator" else f"{w.label}_activator"
        added = "added" if w.label == "activator" else f"{w.label}_added"
        # the activator's own CPU in its rounds, less its idle ticking (controller,
        # scheduler), which is read from the other ways' rounds
        others = [o.label for o in ways if o.label != w.label]
        idle = sum(used[o][w.pid] for o in others) / max(1e-9, sum(wall[o] for o in others))
        own = max(0.0, used[w.label][w.pid] - idle * wall[w.label])
        out[f"{prefix}{name}_cpu_us_per_req_c{c}"] = round(own * per_req, 1)
        if w.label == "activator":
            out[f"{prefix}replica_cpu_us_per_req_c{c}"] = round(used[w.label][rpid] * per_req, 1)
            out[f"{prefix}client_cpu_us_per_req_c{c}"] = round(client[w.label] * per_req, 1)
        for q, key in ((0.5, "p50"), (0.99, "p99")):
            d, v = pct(lat[direct], q), pct(lat[w.label], q)
            out[f"{prefix}{name}_{key}_ms_c{c}"] = round(v, 3)
            out[f"{prefix}{added}_{key}_ms_c{c}"] = round(v - d, 3)
        # how much the added p50 moved from round to round (quartiles of round pairs)
        diffs = sorted(v - d for v, d in zip(p50s[w.label], p50s[direct]))
        out[f"{prefix}{added}_p50_ms_c{c}_round_quartiles"] = [
            round(diffs[len(diffs) // 4], 3), round(diffs[(3 * len(diffs)) // 4], 3)]


def baseline_tree(rev: str) -> tuple[Path, str]:
    """Another revision's activator package, unpacked where ``python -m PACKAGE`` run from
    that folder finds it before this checkout's, and the package's name: ``inference`` while
    it ran on its own, ``hub_ext.inference`` while it sat under the hub (whose whole tree then
    comes along), ``hub_ext.serving`` since the hub runs the top-level ``inference`` in it."""
    where = Path(tempfile.mkdtemp(prefix="activator-baseline-"))

    def has(path: str) -> bool:
        return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:{path}"],
                              capture_output=True).returncode == 0

    if has("hub_ext/serving"):
        trees, package = ["hub_ext", "inference"], "hub_ext.serving"
    elif has("hub_ext/inference"):
        trees, package = ["hub_ext"], "hub_ext.inference"
    else:
        trees, package = ["inference"], "inference"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *trees],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where, package


async def main_async(args) -> dict:
    model_cmd = [sys.executable, str(MODEL), "--startup-s", str(args.startup_s),
                 "--delay-ms", str(args.delay_ms)]
    # the model server's own start, measured directly
    own = []
    for _ in range(args.cold_runs):
        port = free_port()
        t = time.perf_counter()
        p = start([*model_cmd, "--port", str(port)])
        await wait_http(port, "/health")
        own.append(time.perf_counter() - t)
        stop(p)

    warm = {"name": "warm", "command": model_cmd, "ready_path": "/health",
            "min_replicas": 1, "max_replicas": 1, "gpu": 0.25}
    services = [warm] + [{"name": f"cold{i}", "command": model_cmd, "ready_path": "/health",
                          "max_replicas": 1, "gpu": 0.25} for i in range(args.cold_runs)]
    spec_dir = Path(tempfile.mkdtemp())
    (spec_dir / "services.json").write_text(json.dumps(services))
    (spec_dir / "warm.json").write_text(json.dumps([warm]))
    aport = free_port()
    act = start([sys.executable, "-m", "hub_ext.serving", "--port", str(aport), "--services",
                 str(spec_dir / "services.json"), "--gpus", "4", "--quota", "4", "--loop", args.loop])
    base = bport = None
    if args.baseline_rev:  # the same activator at another revision, with a replica of its own
        bport = free_port()
        tree, package = baseline_tree(args.baseline_rev)
        base = start([sys.executable, "-m", package, "--port", str(bport), "--services",
                      str(spec_dir / "warm.json"), "--loop", args.loop],
                     cwd=tree, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out: dict = {}
    try:
        await wait_http(aport, "/_status")
        await wait_http(aport, "/warm/health")
        if base is not None:
            await wait_http(bport, "/warm/health")
        r, w = await asyncio.open_connection("127.0.0.1", aport)
        w.write(b"GET /_status HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        status = json.loads((await r.read()).split(b"\r\n\r\n", 1)[1])
        endpoint = status["warm"]["replica_list"][0]["endpoint"]
        rport = int(endpoint.rsplit(":", 1)[1])
        r, w = await asyncio.open_connection("127.0.0.1", rport)
        w.write(b"GET /predict?ms=0 HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        rpid = json.loads((await r.read()).split(b"\r\n\r\n", 1)[1])["pid"]

        # cold starts first, while nothing else runs
        cold = []
        for i in range(args.cold_runs):
            t = time.perf_counter()
            await wait_http(aport, f"/cold{i}/health", timeout=120)
            cold.append(time.perf_counter() - t)
        own_med, cold_med = sorted(own)[len(own) // 2], sorted(cold)[len(cold) // 2]
        out["model_server_start_ms"] = round(own_med * 1000, 1)
        out["cold_start_total_ms"] = round(cold_med * 1000, 1)
        out["cold_start_added_ms"] = round((cold_med - own_med) * 1000, 1)

        ways = [Way("direct", rport, b"/predict", None),
                Way("activator", aport, b"/warm/predict", act.pid)]
        if base is not None:
            ways.append(Way("baseline", bport, b"/warm/predict", base.pid))
        acts = [w.pid for w in ways if w.pid]
        everyone = set(range(os.cpu_count() or 1))
        placements = {"": {}}  # shared: every process may run on every core
        if len(everyone) >= 2 and args.own_core:
            # the activator on a core of its own, as deployed (its own pod or machine);
            # client and replica share the rest, in both the direct and the activated runs
            rest = everyone - {max(everyone)}
            placements["own_core_"] = {**{a: {max(everyone)} for a in acts},
                                       rpid: rest, os.getpid(): rest}
        for c in args.concurrency:
            for prefix, pins in placements.items():
                for pid in (*acts, rpid, os.getpid()):
                    os.sched_setaffinity(pid, pins.get(pid, everyone))
                try:
                    await measure(out, prefix, c, args, ways, rpid)
                finally:
                    for pid in (*acts, rpid, os.getpid()):
                        os.sched_setaffinity(pid, everyone)
    finally:
        stop(act)
        if base is not None:
            stop(base)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--requests", type=int, default=20000, help="requests per way at c>1")
    ap.add_argument("--requests-c1", type=int, default=1000, help="requests per way at c=1")
    ap.add_argument("--rounds", type=int, default=20, help="rounds over the ways, order alternating")
    ap.add_argument("--warmup", type=int, default=5, help="untimed requests per user first")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="the activator's event loop")
    ap.add_argument("--baseline-rev", default="",
                    help="also measure the activator of this git revision (baseline_* keys)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 50, 500])
    ap.add_argument("--no-own-core", dest="own_core", action="store_false",
                    help="skip the second placement (the activator on a core of its own)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="model server's work per request")
    ap.add_argument("--startup-s", type=float, default=0.3, help="model server's start (model load)")
    ap.add_argument("--cold-runs", type=int, default=3)
    args = ap.parse_args()
    # every user keeps a connection per way: 500 users and a baseline need > 1024 files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    load0 = os.getloadavg()[0]
    out = asyncio.run(main_async(args))
    out.update(cpus=os.cpu_count(), loadavg_before=round(load0, 2),
               loadavg_after=round(os.getloadavg()[0], 2), delay_ms=args.delay_ms,
               loop=args.loop, rounds=args.rounds)
    if args.baseline_rev:
        out["baseline_rev"] = args.baseline_rev
    if not args.json:
        for k, v in out.items():
            print(f"{k:28} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
