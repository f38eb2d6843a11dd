"""Spawn latency of gpupool's spawner against JupyterHub's stock local spawner, and the
admin panel's time to first render with a large organisation.

1. Two hubs on this machine, one after the other, in the same run: gpupool's (`gpupool
   up`, embedded mode: form rules, scheduler queue and placement, GPU environment) and a
   stock JupyterHub with SimpleLocalProcessSpawner (LocalProcessSpawner without switching
   to a system user, since the test users are not system users) and the same proxy and
   single-user command. For each: spawn through the hub's REST API, time until
   /user/NAME/lab answers 200, stop, repeat. Median and p95 per spawner; target ratio
   <= 1.2.
2. The admin service (in-process, same code as under the hub) over a database with 1,000
   projects and 10,000 workloads: time to the first full render of the overview and the
   organisation page (the larger); target < 1 s.

3. The per-user set-up on the host (as root; hub_ext.host): making a user's Unix account on
   first use, looking it up again (cached), making and removing a workload's cgroup, and a
   workload's start under its root monitor until its process runs, against a bare
   subprocess.Popen of the same command (median of --runs each).

    python bench/spawn.py [--runs 5] [--json] [--skip-spawn] [--host-only]
Prints one JSON object as its last line: gpupool_p50_s, gpupool_p95_s, stock_p50_s,
stock_p95_s, ratio, admin_render_s (and the per-page times), and as root account_create_s,
account_lookup_cached_s, cgroup_create_remove_s, cgroup_backend, monitor_start_s,
popen_start_s, monitor_start_ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "hub"))

from hubclient import HubClient, call  # noqa: E402
from hubproc import USER_PW, Hub, free_ports  # noqa: E402

STOCK_CONFIG = """
import sys
from pathlib import Path
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{state}/cookie_secret"
c.JupyterHub.pid_file = "{state}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{state}/proxy.pid"
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {pw!r}
c.Authenticator.allowed_users = {{"alice"}}
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = "{state}/home/{{username}}"
c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
c.Spawner.args = ["--allow-root"] if __import__("os").getuid() == 0 else []
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 180
c.JupyterHub.default_url = "/hub/home"  # as gpupool: logging in does not spawn
"""


class StockHub(Hub):
    def start(self, timeout: float = 120):
        port, hub_port, api_port = self.port, *free_ports(2)
        state = self.workdir / "state"
        state.mkdir(parents=True, exist_ok=True)
        chp = str(ROOT / ".tools" / "bin" / "configurable-http-proxy")
        if not os.path.exists(chp):
            chp = shutil.which("configurable-http-proxy") or chp
        cfg = self.workdir / "jupyterhub_config.py"
        cfg.write_text(STOCK_CONFIG.format(port=port, hub_port=hub_port, api_port=api_port, chp=chp,
                                           state=state, pw=USER_PW))
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(cfg)], cwd=self.workdir,
            env=self.env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + "/hub/api", timeout=2)
                return self
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(self.log.read_text()[-2000:])


def spawn_once(hub, token: str, user: str, options: dict | None) -> float:
    t0 = time.perf_counter()
    status, body = call(hub.url, token, "POST", f"/hub/api/users/{user}/server", options or {}, api=False)
    assert status in (201, 202), (status, body)
    while True:
        s, _ = call(hub.url, token, "GET", f"/user/{user}/lab", api=False)
        if s == 200:
            elapsed = time.perf_counter() - t0
            break
        if time.perf_counter() - t0 > 300:
            raise RuntimeError("spawn timed out")
        time.sleep(0.05)
    call(hub.url, token, "DELETE", f"/hub/api/users/{user}/server", api=False)
    while True:  # wait until fully stopped
        s, u = call(hub.url, token, "GET", f"/hub/api/users/{user}", api=False)
        if not u.get("servers"):
            break
        time.sleep(0.2)
    return elapsed


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def spawn_bench(runs: int, workdir: Path) -> dict:
    """Both hubs run side by side and the spawns alternate, so that load from anything
    else on the machine falls on both alike."""
    times: dict[str, list[float]] = {"gpupool": [], "stock": []}
    hubs = {"gpupool": Hub(workdir / "gpupool"), "stock": StockHub(workdir / "stock")}
    options = {"gpupool": {"project": "nlp", "gpu_fraction": 0.25}, "stock": None}
    tokens = {}
    try:
        for name, hub in hubs.items():
            hub.start()
            tokens[name] = HubClient(hub.url).login("alice", USER_PW).token("alice")
            spawn_once(hub, tokens[name], "alice", options[name])  # warm-up
        for i in range(runs):
            order = ("gpupool", "stock") if i % 2 == 0 else ("stock", "gpupool")
            for name in order:
                times[name].append(spawn_once(hubs[name], tokens[name], "alice", options[name]))
    finally:
        for hub in hubs.values():
            hub.stop()
    g, s = statistics.median(times["gpupool"]), statistics.median(times["stock"])
    return {"gpupool_p50_s": round(g, 3), "gpupool_p95_s": round(p95(times["gpupool"]), 3),
            "stock_p50_s": round(s, 3), "stock_p95_s": round(p95(times["stock"]), 3),
            "ratio": round(g / s, 3), "runs": runs}


def populate(Session, projects: int = 1000, workloads: int = 10_000) -> None:
    from hub_ext.db.tables import DepartmentRow, MemberRow, ProjectRow, WorkloadRow

    with Session() as s:
        s.add_all(DepartmentRow(name=f"dept-{d}", gpus=1000.0) for d in range(10))
        s.flush()
        s.add_all(ProjectRow(name=f"proj-{i:04d}", department=f"dept-{i % 10}", gpus=1.0) for i in range(projects))
        s.flush()
        s.add_all(MemberRow(project=f"proj-{i:04d}", user=f"user-{i % 300}") for i in range(projects))
        spec = {"project": "", "kind": "training", "gpu_mode": "fraction", "gpu_fraction": 0.5,
                "command": ["true"]}
        rows = []
        for i in range(workloads):
            running = i % 2 == 0
            rows.append(WorkloadRow(
                name=f"wl-{i:05d}", owner=f"user-{i % 300}", project=f"proj-{i % projects:04d}",
                kind="training", spec={**spec, "project": f"proj-{i % projects:04d}"},
                state="running" if running else "pending",
                placement=[{"node": f"node-{i % 500}", "gpu_indices": [i % 8], "gpu_milli": 500}] if running else [],
                reason="" if running else "waiting for capacity", queue_position=0 if running else i // projects + 1,
                submit_time=time.time() - i,
            ))
        s.add_all(rows)
        s.commit()


def admin_bench(workdir: Path) -> dict:
    import asyncio

    from tornado.httpserver import HTTPServer

    from hub_ext.config import Gpupool
    from hub_ext.schema import make_sessionmaker
    from hub_ext.service.app import make_app

    cfg = Gpupool(state_dir=str(workdir / "admin"))
    Session = make_sessionmaker(cfg.db_url)
    populate(Session)
    port = free_ports(1)[0]
    admin = {"name": "admin", "scopes": ["custom:gpupool:admin", "custom:gpupool:use"]}
    ready = threading.Event()
    loop_box = {}

    def serve():
        async def main():
            app = make_app(cfg, "/services/gpupool/", Session, user_for_tests=admin)
            HTTPServer(app).listen(port, "127.0.0.1")
            loop_box["loop"] = asyncio.get_running_loop()
            loop_box["stop"] = asyncio.Event()
            ready.set()
            await loop_box["stop"].wait()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ready.wait(30)
    out = {}
    try:
        for page in ("", "org", "queue", "nodes", "events"):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/services/gpupool/{page}", timeout=60) as r:
                r.read()
            out[page or "overview"] = round(time.perf_counter() - t0, 3)
    finally:
        loop_box["loop"].call_soon_threadsafe(loop_box["stop"].set)
        t.join(10)
    return {"admin_render_s": max(out["overview"], out["org"]), "admin_pages_s": out}


def host_bench(runs: int, workdir: Path) -> dict:
    """Per-user set-up on this host: accounts, cgroups, a monitor's start (root only)."""
    import asyncio

    from hub_ext.host.accounts import Accounts
    from hub_ext.host.cgroups import Limits, detect
    from hub_ext.host.process import Launcher, Spec

    home_root = workdir / "homes"
    home_root.mkdir(mode=0o755)
    accounts = Accounts(mode="create", prefix=f"bench{os.getpid() % 10000}-", home_root=home_root)
    users = [f"user{i}" for i in range(runs)]
    create, lookup = [], []
    try:
        for user in users:
            t0 = time.perf_counter()
            account = accounts.for_user(user)
            create.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            accounts.for_user(user)
            lookup.append(time.perf_counter() - t0)
        cgroups = detect()
        groups = []
        for i in range(runs):
            t0 = time.perf_counter()
            cgroups.create(f"bench-{os.getpid()}-{i}", Limits(cpu=1.0, memory_bytes=2**30)).remove()
            groups.append(time.perf_counter() - t0)
        launcher = Launcher(workdir / "run", cgroups)
        env = {"PATH": "/usr/bin:/bin"}

        async def monitor_starts() -> list[float]:
            out = []
            for i in range(runs):
                t0 = time.perf_counter()
                h = await launcher.start(Spec(f"bench-{i}", ["sleep", "60"], env, None, account,
                                              Limits(cpu=1.0, memory_bytes=2**30)))
                out.append(time.perf_counter() - t0)
                await h.terminate(grace_s=2)
                launcher.forget(h.name)
            return out

        starts = asyncio.run(monitor_starts())
        popens = []
        for _ in range(runs):  # the baseline: fork and exec of the same command, nothing else
            t0 = time.perf_counter()
            p = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
            popens.append(time.perf_counter() - t0)
            p.kill()
            p.wait()
    finally:
        for user in users:
            accounts.remove(user)
    med = statistics.median
    return {"account_create_s": round(med(create), 4), "account_lookup_cached_s": round(med(lookup), 7),
            "cgroup_create_remove_s": round(med(groups), 4), "cgroup_backend": cgroups.kind,
            "monitor_start_s": round(med(starts), 4), "popen_start_s": round(med(popens), 4),
            "monitor_start_ratio": round(med(starts) / med(popens), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="timed spawns per spawner (after one warm-up)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result line")
    ap.add_argument("--skip-spawn", action="store_true", help="leave out the spawn latency part")
    ap.add_argument("--host-only", action="store_true", help="only the per-user host set-up part")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as d:
        work = Path(d)
        os.chmod(work, 0o755)  # the bench accounts' homes are under it
        result = {} if args.skip_spawn or args.host_only else spawn_bench(args.runs, work)
        if not args.host_only:
            result.update(admin_bench(work))
        if os.geteuid() == 0:
            result.update(host_bench(args.runs, work))
    if not args.json:
        for k, v in result.items():
            print(f"{k:>16}: {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
