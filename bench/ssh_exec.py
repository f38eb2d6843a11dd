"""SSH gateway latency: a real hub with the gateway, alice's workspace running, then for
--runs rounds: a new connection with a token (the hub checks it) running ``true`` in the
workspace (through hub_ext.host.enter), and a command on one kept connection; also a local
forward's round trip to her JupyterLab against a direct request to the same port.

    python bench/ssh_exec.py [--runs 20]        (as root: the hub makes OS accounts)

Prints one JSON object as its last line: connect_exec_p50_s, connect_exec_p95_s,
exec_p50_s, exec_p95_s, forward_get_p50_s, direct_get_p50_s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hub_ext.ssh import asyncssh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "hub"))

from hubclient import call  # noqa: E402
from hubkernel import run_code  # noqa: E402
from hubproc import Hub, free_ports  # noqa: E402
from test_embedded_accounts import login, start_workspace  # noqa: E402


def p(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 4)


async def measure(h: Hub, runs: int, jport: int) -> dict:
    known = h.workdir / "known_hosts"
    _, me = call(h.url, h.tokens["alice"], "GET", "/me")
    known.write_text(f"[127.0.0.1]:{h.ssh_port} {me['ssh_host_key']}\n")
    opts = dict(username="alice", password=h.tokens["alice"], known_hosts=str(known), client_keys=None,
                preferred_auth="password")
    connect_exec = []
    for _ in range(runs):
        t0 = time.perf_counter()
        async with asyncssh.connect("127.0.0.1", h.ssh_port, **opts) as conn:
            assert (await conn.run("true")).exit_status == 0
        connect_exec.append(time.perf_counter() - t0)
    exec_only, forward_get, direct_get = [], [], []
    async with asyncssh.connect("127.0.0.1", h.ssh_port, **opts) as conn:
        for _ in range(runs):
            t0 = time.perf_counter()
            await conn.run("true")
            exec_only.append(time.perf_counter() - t0)
        listener = await conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", jport)
        request = b"GET /user/alice/api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        for port, out in ((listener.get_port(), forward_get), (jport, direct_get)):
            for _ in range(runs):
                t0 = time.perf_counter()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                assert b"200 OK" in await reader.read()
                writer.close()
                out.append(time.perf_counter() - t0)
        listener.close()
    return {"runs": runs, "connect_exec_p50_s": p(connect_exec, 0.5), "connect_exec_p95_s": p(connect_exec, 0.95),
            "exec_p50_s": p(exec_only, 0.5), "exec_p95_s": p(exec_only, 0.95),
            "forward_get_p50_s": p(forward_get, 0.5), "direct_get_p50_s": round(statistics.median(direct_get), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    (ssh_port,) = free_ports(1)
    h = Hub(Path(tempfile.mkdtemp(prefix="bench-ssh-")), extra_env={"GPUPOOL_SSH_PORT": str(ssh_port)},
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\nc.Gpupool.ssh_ip = '127.0.0.1'\n")
    h.start()
    try:
        h.ssh_port = ssh_port
        login(h)
        start_workspace(h, "alice", "nlp")
        url = run_code(h.url, "/user/alice/", h.tokens["alice"],
                       "import os; print(os.environ['JUPYTERHUB_SERVICE_URL'])").strip()
        jport = int(url.rsplit(":", 1)[1].split("/")[0])
        print(json.dumps(asyncio.run(measure(h, args.runs, jport))))
    finally:
        h.stop()


if __name__ == "__main__":
    main()
