"""What the inference activator adds: latency against calling the replica directly, and
cold start from zero against the model server's own start.

Three processes: the model server (tests/inference/model_server.py), the activator
(``python -m inference``: embedded scheduler + controller + activator) and this one, the
load generator (a bare keep-alive HTTP/1.1 client per simulated user, so the client's own
cost stays small and equal on both paths). At each concurrency the same number of
requests goes to the replica directly and through the activator, alternating in rounds;
added latency = p50/p99 through the activator minus p50/p99 direct.

Cold start: a service at zero replicas gets one request; the time to its response minus
the model server's own start (exec until it answers, measured by starting it directly
the same number of times). Targets: p50 < 1 ms and p99 < 5 ms added at 50 clients; cold
start added < 500 ms (Knative's published hello-world cold start: 2-4 s).

    python bench/activator.py [--json] [--requests 3000] [--delay-ms 5] [--startup-s 0.3]
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
                 str(spec_file), "--gpus", "4", "--quota", "4"])
    out: dict = {}
    try:
        await wait_http(aport, "/_status")
        await wait_http(aport, "/warm/health")
        r, w = await asyncio.open_connection("127.0.0.1", aport)
        w.write(b"GET /_status HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        status = json.loads((await r.read()).split(b"\r\n\r\n", 1)[1])
        endpoint = status["warm"]["replica_list"][0]["endpoint"]
        rport = int(endpoint.rsplit(":", 1)[1])

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
        for c in args.concurrency:
            direct: list[float] = []
            via: list[float] = []
            n = args.requests if c > 1 else max(200, args.requests // 10)
            for _ in range(args.rounds):
                direct += await load(rport, path, c, n // args.rounds)
                via += await load(aport, "/warm" + path, c, n // args.rounds)
            for q, key in ((0.5, "p50"), (0.99, "p99")):
                d, v = pct(direct, q), pct(via, q)
                out[f"direct_{key}_ms_c{c}"] = round(d, 3)
                out[f"activator_{key}_ms_c{c}"] = round(v, 3)
                out[f"added_{key}_ms_c{c}"] = round(v - d, 3)
    finally:
        stop(act)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--requests", type=int, default=3000, help="requests per path at c>1")
    ap.add_argument("--rounds", type=int, default=2, help="alternations direct/activator")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 50, 500])
    ap.add_argument("--delay-ms", type=float, default=5.0, help="model server's work per request")
    ap.add_argument("--startup-s", type=float, default=0.3, help="model server's start (model load)")
    ap.add_argument("--cold-runs", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    out = asyncio.run(main_async(args))
    out.update(cpus=os.cpu_count(), loadavg_before=round(load0, 2),
               loadavg_after=round(os.getloadavg()[0], 2), delay_ms=args.delay_ms)
    if not args.json:
        for k, v in out.items():
            print(f"{k:28} {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
