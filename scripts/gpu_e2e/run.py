"""Steps 2 to 7 of ``scripts/gpu-e2e`` (step 1, the set-up, is the shell script's): a hub in
embedded mode with its inventory from NVML, two fractional workspaces whose kernels check
the caps, a training preempted and resumed, an inference service called from zero, the
per-fraction idle counters, and every share back at the end. Prints one JSON line, one key
per step with its checks (``ok``) and measured values; exits 1 when a step fails.

    .venv/bin/python scripts/gpu_e2e/run.py --mode real|fake [--setup-s S] [--keep]

With ``--mode fake`` the hub reads the fake NVML and the workloads the fake driver that
``make native`` builds (native/build/fake/); everything else is the same. The hub runs on
free ports in a temporary folder, its OS accounts carry a prefix of their own
(GPUPOOL_TEST_ACCOUNT_PREFIX, default ``e2e<pid>-``), and the folder, the accounts and the
interception library's accounts of its workloads are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
os.environ.setdefault("GPUPOOL_TEST_ACCOUNT_PREFIX", f"e2e{os.getpid() % 100000}-")
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "hub")]

from hubclient import HubClient, call  # noqa: E402
from hubkernel import run_code  # noqa: E402
from hubproc import ADMIN_PW, USER_PW, Hub, free_ports  # noqa: E402

from hub_ext.host import regions  # noqa: E402
from hub_ext.humanize import gib  # noqa: E402
from scheduler.contract import share_env  # noqa: E402
from tests.waits import wait_for as wait  # noqa: E402

FAKE_DIR = ROOT / "native" / "build" / "fake"
FAKE_MODEL, FAKE_MEM_MIB, FAKE_GPUS = "NVIDIA H100 80GB HBM3", 81559, 1
IDLE_S = 15  # the idle timeout: the usage page marks a fraction idle after it
RATE_S = 2.0  # seconds of the matmul loop per measure
WINDOW_SLACK = 0.05  # of the period: the scheduler between the library's check and the launch
USERS = {"ann": 0.25, "ben": 0.5}  # each user's workspace, a fraction of one GPU
TRAIN, URGENT, SERVICE = "e2e-train", "e2e-urgent", "e2e-serve"
ORG = """admins: [admin]
users: []
departments:
  - name: e2e
    gpus: {n}
    projects:
      - name: interactive   # in quota: the workspaces, the urgent request, the service
        gpus: {n}
        members: [ann, ben, admin]
      - name: batch         # no quota: its training borrows a GPU nobody uses
        gpus: 0
        members: [ann, admin]
"""


def log(msg: str) -> None:
    print(f"[gpu-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def expected_gpus(mode: str) -> list[dict]:
    """The GPUs as the driver reports them: nvidia-smi, or what the fake NVML is told."""
    if mode == "fake":
        return [{"model": FAKE_MODEL, "memory_mib": FAKE_MEM_MIB,
                 "uuid": f"GPU-fa4e0000-0000-0000-0000-00000000000{i}"} for i in range(FAKE_GPUS)]
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,uuid", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    rows = [[c.strip() for c in ln.split(",")] for ln in out.splitlines() if ln.strip()]
    return [{"model": name, "memory_mib": int(mem), "uuid": uuid} for name, mem, uuid in rows]


def gpu_memory_used_mib() -> list[int] | None:
    """nvidia-smi's memory in use per GPU (real mode only)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def process_memory_mib(pid: int) -> int | None:
    """nvidia-smi's memory of one process, None where it does not list it (a PID
    namespace of its own hides the pids)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for ln in out.splitlines():
        p, _, mib = ln.partition(",")
        if p.strip() == str(pid):
            return int(mib)
    return None


class E2E:
    def __init__(self, mode: str, workdir: Path):
        self.mode = mode
        self.expected = expected_gpus(mode)
        self.n = len(self.expected)
        (workdir / "org.yaml").write_text(ORG.format(n=self.n))
        env = {"GPUPOOL_SERVE_PORT": str(free_ports(1)[0])}
        if mode == "fake":  # pynvml loads libnvidia-ml.so.1: the fake one comes first
            env.update(LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(FAKE_DIR), os.environ.get("LD_LIBRARY_PATH")])),
                       FAKE_NVML_DEVICES=str(FAKE_GPUS), FAKE_NVML_MEM=str(FAKE_MEM_MIB << 20),
                       FAKE_NVML_NAME=FAKE_MODEL)
        self.hub = Hub(workdir, extra_env=env, config=(
            "c = get_config()  # noqa\n"
            f"c.Gpupool.org_file = {str(workdir / 'org.yaml')!r}\n"
            f"c.Gpupool.cull_idle_s = {IDLE_S}\n"
            "c.Gpupool.cull_every_s = 3600  # the culler must not stop the idle workspace first\n"))
        self.tokens: dict[str, str] = {}
        self.gpus: list[dict] = []  # the hub's, from GET /nodes
        self.busy_pid = 0

    # ---- helpers
    @property
    def url(self) -> str:
        return self.hub.url

    def api(self, user: str, method: str, path: str, body=None, expect: tuple[int, ...] = (200,)):
        code, data = call(self.url, self.tokens[user], method, path, body)
        if code not in expect:
            raise RuntimeError(f"{method} {path} as {user}: {code} {data}")
        return data

    def cap(self, gpu_index: int, milli: int) -> int:
        """The memory cap the hub gives a share (the scheduler's own rule)."""
        return int(share_env(self.gpus[gpu_index]["memory_mib"], milli)["GPUPOOL_MEMORY_LIMIT"])

    def workspace_ready(self, user: str) -> bool:
        _, u = call(self.url, self.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
        return bool((u.get("servers") or {}).get("", {}).get("ready"))

    def logs(self, name: str, user: str) -> list[str]:
        """A training's log; RuntimeError with its end when the training failed."""
        lines = self.api(user, "GET", f"/trainings/{name}/logs?tail=10000")["lines"]
        if self.api(user, "GET", f"/trainings/{name}")["status"] == "Failed":
            raise RuntimeError(f"training {name} failed: " + "\n".join(lines[-20:]))
        return lines

    def fraction_rows(self) -> dict[str, dict]:
        """The usage page's table of running fractions: workload -> launches, idle."""
        code, page = call(self.url, self.tokens["admin"], "GET", "/services/gpupool/usage", api=False)
        html = page.get("raw", "") if code == 200 else ""
        table = html.partition('id="fraction-activity"')[2].partition("</table>")[0]
        rows = {}
        for tr in re.findall(r"<tr(.*?)</tr>", table, re.S):
            cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
            if len(cells) == 7:
                rows[cells[0]] = {"launches": cells[4], "allocs": cells[5], "last": cells[6],
                                  "idle": 'class="err"' in tr.split(">", 1)[0]}
        return rows

    # ---- the steps
    def start(self) -> None:
        self.hub.start(timeout=240)
        for user in (*USERS, "admin"):
            pw = ADMIN_PW if user == "admin" else USER_PW
            self.tokens[user] = HubClient(self.url).login(user, pw).token(user)

    def nodes(self) -> dict:
        items = self.api("admin", "GET", "/nodes")["items"]
        self.gpus = [g for n in items for g in n["gpus"]]
        seen = [{"model": g["model"], "memory_mib": g["memory_mib"], "uuid": g.get("uuid", "")} for g in self.gpus]
        code, page = call(self.url, self.tokens["admin"], "GET", "/services/gpupool/nodes", api=False)
        html = page.get("raw", "") if code == 200 else ""
        on_page = [e["model"] in html and e["uuid"] in html and gib(e["memory_mib"] / 1024) in html
                   for e in self.expected]
        source = sorted({n["source"] for n in items})
        return {"ok": source == ["nvml"] and seen == self.expected and all(on_page),
                "source": source, "gpus": seen, "page_shows_each": all(on_page)}

    def caps(self) -> dict:
        for user, frac in USERS.items():
            self.api(user, "POST", "/workloads", {"kind": "workspace", "project": "interactive",
                                                  "gpu_mode": "fraction", "gpu_fraction": frac}, expect=(202,))
        for user in USERS:
            wait(lambda user=user: self.workspace_ready(user), f"{user}'s workspace is ready", 240)
        out: dict = {}
        places = {}
        for user, frac in USERS.items():
            place = self.api(user, "GET", f"/workloads/ws-{user}")["placement"]
            places[user] = place
            code = (f"import json, sys\nsys.path.insert(0, {str(HERE)!r})\nimport gpu\n"
                    f"print('E2E ' + json.dumps(gpu.kernel_checks({self.mode!r}, {RATE_S})))\n")
            text = run_code(self.url, f"/user/{user}/", self.tokens[user], code, timeout=240)
            line = next((ln for ln in text.splitlines() if ln.startswith("E2E ")), None)
            if line is None:
                raise RuntimeError(f"{user}'s kernel: {text[-2000:]}")
            k = json.loads(line[4:])
            idx, milli = place[0]["gpu_indices"][0], place[0]["gpu_milli"]
            out[user] = {"fraction": frac, "gpu_milli": milli, "gpu": idx, "cap": self.cap(idx, milli), **k}
        base_gpu = out["ann"]["gpu"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "LD_PRELOAD", "CUDA_VISIBLE"))}
        env["CUDA_VISIBLE_DEVICES"] = self.gpus[base_gpu]["uuid"]
        p = subprocess.run([sys.executable, str(HERE / "gpu.py"), "rate", self.mode, str(RATE_S)],
                           env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"the loop alone failed: {p.stderr[-2000:]}")
        alone = json.loads(p.stdout)["rate"]
        kernels = list(out.values())
        for u in kernels:
            u["share"] = round(u["rate"] / alone, 3)
            u["ok_memory"] = u["total"] == u["cap"] and u["half_ok"] and u["past_cap_refused"]
            if self.mode == "fake":  # the launches inside the share's window of the period
                # (99% of them: a process the machine's scheduler delays between the
                # library's check and the launch lands a little later)
                u["ok_compute"] = u["window"] <= u["fraction"] + WINDOW_SLACK
            else:  # the loop's rate against the same loop alone, without the library
                u["ok_compute"] = 0.5 * u["fraction"] <= u["share"] <= 1.5 * u["fraction"]
        same_gpu = len({(p[0]["node"], p[0]["gpu_indices"][0]) for p in places.values()}) == 1
        return {"ok": same_gpu and all(u["ok_memory"] and u["ok_compute"] for u in kernels),
                "same_gpu": same_gpu, "rate_alone": round(alone, 1), **out}

    def idle(self) -> dict:
        """ann's workspace launches a step every half second; ben's launches nothing."""
        code = ("import subprocess, sys\n"
                f"p = subprocess.Popen([sys.executable, {str(HERE / 'gpu.py')!r}, 'busy', {self.mode!r}],"
                " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                "print('E2E', p.pid)\n")
        text = run_code(self.url, "/user/ann/", self.tokens["ann"], code, timeout=120)
        self.busy_pid = int(re.search(r"E2E (\d+)", text).group(1))
        rows = wait(lambda: (r := self.fraction_rows()).get("ws-ben", {}).get("idle") and r,
                    "ben's workspace is reported idle", IDLE_S * 6)
        ann, ben = rows.get("ws-ann", {}), rows["ws-ben"]
        busy = ann.get("idle") is False and ann.get("launches", "0").isdigit() and int(ann["launches"]) > 0
        return {"ok": bool(busy and ben["idle"]), "idle_timeout_s": IDLE_S, "ws-ann": ann, "ws-ben": ben}

    def stop_workspaces(self) -> None:
        if self.busy_pid:
            try:
                os.kill(self.busy_pid, 9)
            except ProcessLookupError:
                pass
        for user in USERS:
            call(self.url, self.tokens[user], "DELETE", f"/workloads/ws-{user}")
        wait(lambda: not any(self.workspace_ready(u) for u in USERS), "the workspaces stop", 120)
        wait(lambda: self.allocated() == 0, "the workspaces' shares are back", 120)

    def allocated(self) -> float:
        return sum(g["allocated"] for n in self.api("admin", "GET", "/nodes")["items"] for g in n["gpus"])

    def training(self) -> dict:
        env = {"E2E_MODE": self.mode, "EVERY": "10", "STEP_SLEEP": "0.05"}
        self.api("ann", "POST", "/trainings", {
            "name": TRAIN, "project": "batch", "command": [sys.executable, str(HERE / "train.py")],
            "gpu": 1, "env": env, "grace_period_s": 60}, expect=(201,))
        wait(lambda: any(ln == "step 25" for ln in self.logs(TRAIN, "ann")), "the training passes step 25", 240)
        # in quota, every GPU: the over-quota training must give its GPU back
        self.api("ben", "POST", "/trainings", {
            "name": URGENT, "project": "interactive", "gpu": self.n,
            "command": [sys.executable, str(HERE / "gpu.py"), "hold", self.mode, "3"]}, expect=(201,))
        wait(lambda: self.api("ann", "GET", f"/trainings/{TRAIN}")["preemptions"] >= 1, "the training is preempted", 120)
        wait(lambda: self.logs(URGENT, "ben") and self.api("ben", "GET", f"/trainings/{URGENT}")["status"]
             == "Succeeded", "the urgent request runs and ends", 240)
        starts = wait(lambda: len(s := [ln for ln in self.logs(TRAIN, "ann") if ln.startswith("start ")]) >= 2 and s,
                      "the training starts again", 240)
        wait(lambda: any(ln.startswith("step ") and int(ln.split()[1]) >= 5 + int(starts[1].split()[1][5:])
                         for ln in self.logs(TRAIN, "ann")), "the resumed training runs 5 steps", 120)
        t = self.api("ann", "GET", f"/trainings/{TRAIN}")
        lines = self.logs(TRAIN, "ann")
        second = [i for i, ln in enumerate(lines) if ln.startswith("start ")][1]
        last_before = max(int(ln.split()[1]) for ln in lines[:second] if ln.startswith("step "))
        resumed_from = int(starts[1].split()[1][5:])
        kinds = [e["kind"] for e in t["events"]]
        self.api("ann", "DELETE", f"/trainings/{TRAIN}", expect=(202,))
        on_gpu = [" device=" in s and not s.endswith("CUDA_VISIBLE_DEVICES=)") for s in starts[:2]]
        return {"ok": resumed_from == last_before > 0 and all(on_gpu) and t["status"] == "Running"
                and "preempted" in kinds and "resumed" in kinds,
                "preemptions": t["preemptions"], "last_step_before": last_before,
                "resumed_from": resumed_from, "attempts": starts[:2], "events": kinds}

    def inference(self) -> dict:
        frac = 0.25
        svc = self.api("ben", "POST", "/inferences", {
            "name": SERVICE, "project": "interactive", "gpu": frac, "min_replicas": 0, "max_replicas": 1,
            "command": [sys.executable, str(HERE / "serve.py"), self.mode], "ready_path": "/health",
            "scale_to_zero_after_s": 300}, expect=(201,))
        before = self.replicas()
        url = self.url + svc["url"] + "predict"
        req = urllib.request.Request(url, headers={"Authorization": f"token {self.tokens['ben']}"})

        def served():
            try:
                with urllib.request.urlopen(req, timeout=240) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                if e.code != 404:  # the hub follows its table every second: 404 until then
                    raise
                return None

        t0 = time.monotonic()
        body = wait(served, "the service answers", 300)
        cold_s = time.monotonic() - t0
        replicas = self.replicas()
        place = replicas[0]["placement"][0] if replicas else {"gpu_indices": [0], "gpu_milli": round(frac * 1000)}
        cap = self.cap(place["gpu_indices"][0], place["gpu_milli"])
        out = {"replicas_before": len(before), "replicas_after": len(replicas), "cold_start_s": round(cold_s, 1),
               "cap": cap, "gpu_total": body["gpu_total"], "gpu_used": body["gpu_used"],
               "output": body["output"], "device": body["device"]}
        ok = len(before) == 0 and len(replicas) == 1 and body["gpu_total"] == cap and 0 < body["gpu_used"] <= cap
        if self.mode == "real":  # the driver's own count of the replica, where it lists pids
            mib = process_memory_mib(body["pid"])
            out["nvidia_smi_mib"] = mib
            ok = ok and (mib is None or mib * 2**20 <= cap)
        self.api("ben", "DELETE", f"/inferences/{SERVICE}", expect=(200, 202, 204))
        return {"ok": ok, **out}

    def replicas(self) -> list[dict]:
        items = self.api("admin", "GET", "/workloads?kind=inference")["items"]
        return [w for w in items if w["state"] == "running" and w["name"].startswith(SERVICE)]

    def released(self) -> dict:
        for user in USERS:
            call(self.url, self.tokens[user], "DELETE", f"/workloads/ws-{user}")
        call(self.url, self.tokens["ann"], "DELETE", f"/trainings/{TRAIN}")
        call(self.url, self.tokens["ben"], "DELETE", f"/trainings/{URGENT}")
        call(self.url, self.tokens["ben"], "DELETE", f"/inferences/{SERVICE}")
        wait(lambda: self.allocated() == 0, "every share is back", 180)
        nodes = self.api("admin", "GET", "/nodes")["items"]
        gpus = [{"allocated": g["allocated"], "workloads": len(g["workloads"])} for n in nodes for g in n["gpus"]]
        cap = self.api("admin", "GET", "/capacity")
        free = {p: (v["free"], v["gpus"]) for p, v in cap["pools"].items()}
        # the GPU accounts of its workloads go once the hub has seen each process end, which
        # may come a little after its share is back
        folder = regions.of_state(self.hub.workdir / "state")

        def accounts_left() -> list[str]:
            return sorted(f.name for f in folder.iterdir()) if folder.exists() else []

        with contextlib.suppress(AssertionError):
            wait(lambda: not accounts_left(), "the workloads' GPU accounts are removed", 60)
        left = accounts_left()
        out = {"ok": all(g["allocated"] == 0 and g["workloads"] == 0 for g in gpus)
               and all(f == n for f, n in free.values()) and not left,
               "gpus": gpus, "pools_free": free, "gpu_accounts_left": left}
        if self.mode == "real":
            out["nvidia_smi_used_mib"] = gpu_memory_used_mib()
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("real", "fake"), required=True)
    p.add_argument("--setup-s", type=float, default=None, help="seconds the set-up took (step 1)")
    p.add_argument("--keep", action="store_true", help="keep the hub's folder (its log) afterwards")
    a = p.parse_args()
    t0 = time.monotonic()
    result: dict = {"mode": a.mode, "setup": {"ok": True, "seconds": a.setup_s}}
    if a.mode == "real":
        try:
            import torch

            result["setup"].update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                                   ok=torch.cuda.is_available())
        except ImportError as e:
            result["setup"].update(ok=False, error=str(e))
    workdir = Path(tempfile.mkdtemp(prefix="gpupool-e2e-"))
    e2e = None
    failed_start = ""
    try:
        e2e = E2E(a.mode, workdir)
        log(f"hub in {workdir}, accounts {os.environ['GPUPOOL_TEST_ACCOUNT_PREFIX']}*")
        e2e.start()
    except Exception as e:
        failed_start = f"the hub did not start: {type(e).__name__}: {str(e)[-1500:]}"
    steps = [("nodes", "nodes"), ("caps", "caps"), ("idle", "idle"), ("stop_workspaces", None),
             ("training", "training"), ("inference", "inference"), ("released", "released")]
    try:
        for method, key in steps:
            if failed_start:
                if key:
                    result[key] = {"ok": False, "error": failed_start}
                continue
            log(f"step {key or method}")
            try:
                got = getattr(e2e, method)()
                if key:
                    result[key] = got
            except Exception as ex:
                traceback.print_exc()
                result[key or method] = {"ok": False, "error": f"{type(ex).__name__}: {str(ex)[-1500:]}"}
    finally:
        if e2e is not None:
            e2e.hub.stop()
            if a.keep or not all(v.get("ok") for v in result.values() if isinstance(v, dict)):
                log(f"the hub's log: {e2e.hub.log}")
        if not a.keep and all(v.get("ok") for v in result.values() if isinstance(v, dict)):
            shutil.rmtree(workdir, ignore_errors=True)
    order = ["mode", "setup", "nodes", "caps", "training", "inference", "idle", "released", "stop_workspaces"]
    result = {k: result[k] for k in order if k in result}
    result["seconds"] = round(time.monotonic() - t0 + (a.setup_s or 0), 1)
    result["ok"] = all(v.get("ok") for v in result.values() if isinstance(v, dict))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
