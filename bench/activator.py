"""What the inference activator adds: latency against calling the replica directly, and
cold start from zero against the model server's own start.

Three processes: the model server (tests/inference/model_server.py), the activator
(``python -m inference``: embedded scheduler + controller + activator) and this one, the
load generator (a bare keep-alive HTTP/1.1 client per simulated user, so the client's own
cost stays small and equal on both paths). At each concurrency the same number of
requests goes to the replica directly and through the activator, alternating in rounds
(so both see the same background load); added latency = p50/p99 through the activator
minus p50/p99 direct.

CPU: the machine this runs on has 2 cores shared with other work, and at 50 clients the
three processes saturate them, so added latency there is mostly the activator's CPU per
request times the queue in front of the cores. The bench therefore also reports each
process's CPU time per request (``activator_cpu_us_per_req_cN``, ``replica_cpu_us_...``,
``client_cpu_us_...``, from /proc and ``time.process_time``), which does not depend on the
others' load, and the load average before and after.

Two placements, each with its own interleaved direct/activated rounds: the headline keys
(``added_p50_ms_c50`` ...) let every process run on every core (the activator's CPU competes
with the client's and the replica's); ``own_core_*`` pins the activator to a core of its
own and the client and replica to the other(s) in both runs, as deployed (the activator in
its own pod), so the added latency is the activator's own and not the CPU it takes from the
replica. Other work on the machine still runs on all cores.

Cold start: a service at zero replicas gets one request; the time to its response minus
the model server's own start (exec until it answers, measured by starting it directly
the same number of times). Targets: p50 < 1 ms and p99 < 5 ms added at 50 clients; cold
start added < 500 ms (Knative's published hello-world cold start: 2-4 s).

    python bench/activator.py [--json] [--requests 3000] [--delay-ms 5] [--startup-s 0.3]
                              [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


async def load(port: int, path: str, clients: int, total: int) -> list[float]:
    lat: list[float] = []
    per = max(1, total // clients)
    p = path.encode()

    async def user():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        await one(r, w, p)  # warm the connection (and the activator's pool)
        for _ in range(per):
            t = time.perf_counter()
            await one(r, w, p)
            lat.append(time.perf_counter() - t)
        w.close()

    await asyncio.gather(*(user() for _ in range(clients)))
    return lat


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (not its children)."""
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


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    p.wait()


async def measure(out: dict, prefix: str, c: int, args, apid: int, rpid: int, rport: int,
                  aport: int, path: str) -> None:
    """Direct and through the activator, alternating in rounds; CPU per request of each."""
    direct: list[float] = []
    via: list[float] = []
    cpu = {"act": 0.0, "rep_d": 0.0, "rep_v": 0.0, "cli_d": 0.0, "cli_v": 0.0}
    n = args.requests if c > 1 else max(200, args.requests // 10)
    for _ in range(args.rounds):
        a0, r0, c0 = cpu_s(apid), cpu_s(rpid), time.process_time()
        direct += await load(rport, path, c, n // args.rounds)
        a1, r1, c1 = cpu_s(apid), cpu_s(rpid), time.process_time()
        via += await load(aport, "/warm" + path, c, n // args.rounds)
        a2, r2, c2 = cpu_s(apid), cpu_s(rpid), time.process_time()
        cpu["act"] += (a2 - a1) - (a1 - a0)  # minus its idle ticking meanwhile
        cpu["rep_d"] += r1 - r0
        cpu["rep_v"] += r2 - r1
        cpu["cli_d"] += c1 - c0
        cpu["cli_v"] += c2 - c1
    per = 1e6 / len(via)
    out[f"{prefix}activator_cpu_us_per_req_c{c}"] = round(cpu["act"] * per, 1)
    out[f"{prefix}replica_cpu_us_per_req_c{c}"] = round(cpu["rep_v"] * per, 1)
    out[f"{prefix}client_cpu_us_per_req_c{c}"] = round(cpu["cli_v"] * per, 1)
    out[f"{prefix}direct_client_plus_replica_cpu_us_per_req_c{c}"] = round(
        (cpu["rep_d"] + cpu["cli_d"]) * per, 1)
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        d, v = pct(direct, q), pct(via, q)
        out[f"{prefix}direct_{key}_ms_c{c}"] = round(d, 3)
        out[f"{prefix}activator_{key}_ms_c{c}"] = round(v, 3)
        out[f"{prefix}added_{key}_ms_c{c}"] = round(v - d, 3)


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

    services = [{"name": "warm", "command": model_cmd, "ready_path": "/health",
                 "min_replicas": 1, "max_replicas": 1, "gpu": 0.25}]
    services += [{"name": f"cold{i}", "command": model_cmd, "ready_path": "/health",
                  "max_replicas": 1, "gpu": 0.25} for i in range(args.cold_runs)]
    spec_file = Path(tempfile.mkdtemp()) / "services.json"
    spec_file.write_text(json.dumps(services))
    aport = free_port()
    act = start([sys.executable, "-m", "inference", "--port", str(aport), "--services",
                 str(spec_file), "--gpus", "4", "--quota", "4", "--loop", args.loop])
    out: dict = {}
    try:
        await wait_http(aport, "/_status")
        await wait_http(aport, "/warm/health")
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

        path = "/predict"
        everyone = set(range(os.cpu_count() or 1))
        placements = {"": {}}  # shared: every process may run on every core
        if len(everyone) >= 2 and args.own_core:
            # the activator on a core of its own, as deployed (its own pod or machine);
            # client and replica share the rest, in both the direct and the activated runs
            rest = everyone - {max(everyone)}
            placements["own_core_"] = {act.pid: {max(everyone)}, rpid: rest, os.getpid(): rest}
        for c in args.concurrency:
            for prefix, pins in placements.items():
                for pid in (act.pid, rpid, os.getpid()):
                    os.sched_setaffinity(pid, pins.get(pid, everyone))
                try:
                    await measure(out, prefix, c, args, act.pid, rpid, rport, aport, path)
                finally:
                    for pid in (act.pid, rpid, os.getpid()):
                        os.sched_setaffinity(pid, everyone)
    finally:
        stop(act)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--requests", type=int, default=3000, help="requests per path at c>1")
    ap.add_argument("--rounds", type=int, default=6, help="alternations direct/activator")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="the activator's event loop")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 50, 500])
    ap.add_argument("--no-own-core", dest="own_core", action="store_false",
                    help="skip the second placement (the activator on a core of its own)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="model server's work per request")
    ap.add_argument("--startup-s", type=float, default=0.3, help="model server's start (model load)")
    ap.add_argument("--cold-runs", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    out = asyncio.run(main_async(args))
    out.update(cpus=os.cpu_count(), loadavg_before=round(load0, 2),
               loadavg_after=round(os.getloadavg()[0], 2), delay_ms=args.delay_ms,
               loop=args.loop)
    if not args.json:
        for k, v in out.items():
            print(f"{k:28} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
