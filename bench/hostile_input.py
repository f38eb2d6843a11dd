"""Hostile input against a real hub (``gpupool up`` in a temporary folder): the findings of
a fuzzing run (huge numbers, deep JSON, names ending in a newline, NUL bytes and lone
surrogates, 10 MB bodies, path tricks, commands that cannot start), then a bounded random
sweep over every operation of the OpenAPI document with a fixed seed, as a member and as an
admin. Measured in the same run: another user's ``GET /me`` latency while nothing else
happens (the baseline) and while 10 MB bodies arrive.

Prints one JSON object last: ``requests``; ``server_errors`` (gpupool's 5xx answers, and
requests left without an answer; must be 0); ``proxy_server_errors`` (5xx of
configurable-http-proxy itself, before gpupool sees the request: a malformed
percent-encoding in the URL); ``stored_invalid`` (rows or folders that break the
stored-data rules after the run, and workloads that hold GPUs with nothing running; must
be 0); ``p99_ms_other_users_during_10mb_request`` (target under 100 ms) beside
``p99_ms_other_users_idle``; ``scheduler_cycles_failed`` (must be 0).

    .venv/bin/python bench/hostile_input.py [--per-operation 12] [--seed 26] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import posixpath
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "hub"))

import yaml  # noqa: E402
from hubclient import HubClient  # noqa: E402
from hubproc import ADMIN_PW, USER_PW, Hub  # noqa: E402

API = "/services/gpupool/api/v1"
NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
USER = re.compile(r"[A-Za-z0-9._@-]{1,255}")
MAX_GPUS = 1e6
MAX_SPEC_BYTES = 1 << 20  # a stored spec above this is a finding (10 MB ones were)
DEEP = "[" * 1000 + "]" * 1000
HUGE_INT = "1" * 400
TEN_MB = 10 * 1024 * 1024


class Client:
    """Raw HTTP to the hub's proxy: any bytes as a body, every answer counted."""

    def __init__(self, url: str, tokens: dict[str, str]):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.tokens = u.hostname, u.port, tokens
        self.requests = 0
        self.errors: list[tuple[int, str, str, str]] = []  # gpupool's (JSON bodies) or no answer
        # 5xx that are not gpupool's: configurable-http-proxy answers a malformed
        # percent-encoding (%ED%A0%80, %FF) with 500 and the hub's error page before any
        # request reaches gpupool (its decodeURIComponent throws).
        self.proxy_errors: list[tuple[int, str, str, str]] = []
        self.ten_mb_statuses: list[int] = []  # what the 10 MB bodies were answered (0: cut off)

    def __call__(self, user: str, method: str, path: str, body: bytes | str | None = None,
                 timeout: float = 120) -> tuple[int, bytes]:
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"Authorization": f"token {self.tokens[user]}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, API + path, body=body, headers=headers)
            r = conn.getresponse()
            status, data = r.status, r.read()
        except (OSError, http.client.HTTPException) as e:  # refused mid-body, or no answer in time
            status, data = 0, str(e).encode()
            if not isinstance(e, ConnectionError):  # a timeout: the hub did not answer at all
                self.errors.append((0, method, path, repr(e)))
        finally:
            conn.close()
        self.requests += 1
        if status >= 500:
            ours = data.lstrip().startswith(b"{")  # the service answers every error in JSON
            (self.errors if ours else self.proxy_errors).append(
                (status, method, path, data[:300].decode(errors="replace")))
        return status, data


def dumps(obj) -> str:
    return json.dumps(obj)  # lone surrogates leave as \\udXXX escapes, as a client sends them


# -- the findings --------------------------------------------------------------------------
def findings(c: Client, python: str) -> None:
    """One request per finding of the fuzzing run (the issue lists them)."""
    nl = "x-nl\n"
    sent = [
        ("admin", "PATCH", "/projects/vision", dumps({"limit": 1e307})),
        ("admin", "PUT", "/users/alice/roles", dumps({"roles": [{"role": "viewer", "department": {}}]})),
        ("admin", "POST", "/workloads", dumps({"kind": "training", "project": "nlp", "owner": {},
                                                "command": ["true"]})),
        ("admin", "GET", "/usage?from=9999-12-31&to=9999-12-31", None),
        ("admin", "POST", "/projects/nlp/credentials",
         dumps({"name": "sur", "data": {"KEY": "\udc80"}})),
    ]
    for action in ("suspend", "resume"):
        sent += [("alice", m, f"/trainings/none/{action}", None) for m in ("GET", "DELETE")]
    for path, field in (("/projects", "gpus"), ("/departments", "gpus"), ("/trainings", "gpu"),
                        ("/workloads", "gpus"), ("/inferences", "gpu")):
        body = ('{"name": "big", "project": "nlp", "department": "ops", "command": ["x"], '
                f'"gpu_mode": "whole", "{field}": {HUGE_INT}}}')
        sent.append(("admin", "POST", path, body))
    for path in ("/departments", "/projects", "/workloads", "/trainings", "/inferences",
                 "/projects/nlp/credentials", "/projects/nlp/datasources"):
        sent.append(("admin", "POST", path, DEEP))
    sent += [("admin", "PATCH", p, DEEP) for p in ("/projects/nlp", "/departments/ops")]
    sent.append(("admin", "PUT", "/users/alice/roles", DEEP))
    # names ending in a newline, one per kind of name
    sent += [
        ("admin", "POST", "/departments", dumps({"name": nl, "gpus": 0})),
        ("admin", "POST", "/projects", dumps({"name": nl, "department": "ops"})),
        ("admin", "PATCH", "/projects/serving", dumps({"members": ["dave", "eve\n"]})),
        ("admin", "PUT", "/users/eve%0A/roles", dumps({"roles": [{"role": "viewer", "department": "ops"}]})),
        ("alice", "POST", "/trainings", dumps({"name": nl, "project": "nlp", "command": ["true"]})),
        ("alice", "POST", "/inferences", dumps({"name": nl, "project": "nlp", "command": ["true"]})),
        ("admin", "POST", "/projects/nlp/credentials", dumps({"name": nl, "data": {"K": "v"}})),
        ("admin", "POST", "/projects/nlp/datasources", dumps({"name": nl, "kind": "hostpath", "path": "/tmp"})),
    ]
    # NUL bytes and lone surrogates in commands and environments; 10 MB specs
    for bad in ("a\x00b", "\ud800"):
        sent += [
            ("alice", "POST", "/trainings", dumps({"name": "bad-cmd", "project": "nlp", "command": [python, bad]})),
            ("alice", "POST", "/trainings", dumps({"name": "bad-env", "project": "nlp", "command": ["true"],
                                                   "env": {"K": bad}})),
            ("alice", "POST", "/workloads", dumps({"kind": "training", "project": "nlp", "command": [bad]})),
        ]
    big = "x" * TEN_MB
    sent += [
        ("alice", "POST", "/trainings", dumps({"name": "big-spec", "project": "nlp", "command": ["true"],
                                               "env": {"K": big}})),
        ("alice", "POST", "/inferences", dumps({"name": "big-spec", "project": "nlp", "command": [big]})),
    ]
    # paths around the reserved-path and '..' checks; unbounded lengths
    for mount in ("//etc", "//var/run/gpupool/credentials", "/data/../etc"):
        sent.append(("admin", "POST", "/projects/nlp/datasources",
                     dumps({"name": "mnt", "kind": "hostpath", "path": "/tmp", "mount_path": mount})))
    sent += [
        ("alice", "POST", "/trainings", dumps({"name": "dots", "project": "nlp", "command": ["true"],
                                               "checkpoint_dir": "/tmp/../tmp/x/../../etc/gp"})),
        ("alice", "POST", "/trainings", dumps({"name": "long-env", "project": "nlp", "command": ["true"],
                                               "env": {"K" * 100_000: "v"}, "image": "i" * 100_000,
                                               "checkpoint_dir": "/" + "c" * 100_000})),
        ("alice", "POST", "/inferences", dumps({"name": "long-ready", "project": "nlp", "command": ["true"],
                                                "ready_path": "/" + "r" * 100_000})),
    ]
    for user, method, path, body in sent:
        c(user, method, path, body)


def phantoms(c: Client) -> None:
    """A training through POST /workloads whose command cannot start, deleted afterwards,
    then its project deleted: nothing of it may keep GPUs."""
    c("admin", "POST", "/departments", dumps({"name": "phantom", "gpus": 2}))
    c("admin", "POST", "/projects", dumps({"name": "phantom", "department": "phantom", "gpus": 2,
                                           "members": ["alice"]}))
    c("alice", "POST", "/workloads", dumps({"name": "phantom-job", "kind": "training", "project": "phantom",
                                            "gpu_mode": "whole", "gpus": 2, "command": ["/nonexistent/train"]}))
    time.sleep(3)
    c("alice", "DELETE", "/workloads/phantom-job")
    c("admin", "DELETE", "/projects/phantom")


# -- another user's latency while 10 MB bodies arrive --------------------------------------
def latencies(c: Client, seconds: float) -> list[float]:
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t = time.perf_counter()
        c("carol", "GET", "/me")
        out.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
    return out


def send_10mb(c: Client, done: threading.Event, times: int = 3) -> None:
    """A 10 MB member list (about 870,000 names), sent in pieces over about two seconds."""
    names = [f"u{i:06d}" for i in range(TEN_MB // 12)]
    body = json.dumps({"members": names}).encode()
    for _ in range(times):
        conn = http.client.HTTPConnection(c.host, c.port, timeout=300)
        try:
            conn.putrequest("PATCH", API + "/projects/nlp")
            conn.putheader("Authorization", f"token {c.tokens['admin']}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            step = len(body) // 40
            for i in range(0, len(body), step):
                conn.send(body[i:i + step])
                time.sleep(0.05)
            status = conn.getresponse().status
        except (ConnectionError, http.client.HTTPException):  # refused before the end: fine
            status = 0
        except OSError as e:  # no answer in time
            status = 0
            c.errors.append((0, "PATCH", "/projects/nlp", repr(e)))
        finally:
            conn.close()
        c.requests += 1
        c.ten_mb_statuses.append(status)
        if status >= 500:
            c.errors.append((status, "PATCH", "/projects/nlp", "10 MB member list"))
    done.set()


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)] if values else 0.0


def under_load(c: Client) -> list[float]:
    done = threading.Event()
    sender = threading.Thread(target=send_10mb, args=(c, done))
    sender.start()
    samples = []
    while not done.is_set():
        samples += latencies(c, 0.5)
    sender.join()
    return samples


# -- the random sweep ----------------------------------------------------------------------
ATOMS = [None, True, -1, 0, 0.5, 1e307, -1e307, 10**30, "", "a\n", "\x00", "\ud800", "x" * 5000,
         "//etc", "../..", "nlp", "vision", "alice", {}, [], [[]], {"a": {}}, ["\x00"], [1e307]]
RAW = ["NaN", "Infinity", "-Infinity", HUGE_INT, "1e999", DEEP, '{"a":' * 200 + "1" + "}" * 200,
       "{", "\"\\ud800\"", "[]"]
PATH_VALUES = ["nlp", "vision", "ops", "research", "alice", "none", "a%0A", "..", "%00", "x" * 300, "%ED%A0%80"]


def random_value(rnd: random.Random, depth: int = 0):
    if depth < 2 and rnd.random() < 0.2:
        return {rnd.choice(["name", "gpus", "x"]): random_value(rnd, depth + 1)} if rnd.random() < 0.5 \
            else [random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return rnd.choice(ATOMS)


def properties(schema: dict, spec: dict) -> list[str]:
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    names = list(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        names += properties(part, spec)
    return names


def sweep(c: Client, spec: dict, per_op: int, rnd: random.Random) -> None:
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            body_schema = (op.get("requestBody", {}).get("content", {})
                           .get("application/json", {}).get("schema", {}))
            fields = properties(body_schema, spec) if body_schema else []
            query = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
            for _ in range(per_op):
                url = re.sub(r"\{[^}]+\}", lambda _m: rnd.choice(PATH_VALUES), path)
                if query:
                    pairs = {q: str(rnd.choice(ATOMS + ["9999-12-31", "0001-01-01", HUGE_INT]))
                             for q in rnd.sample(query, rnd.randint(1, len(query)))}
                    url += "?" + urllib.parse.urlencode(pairs, errors="surrogatepass")
                body = None
                if method in ("post", "put", "patch"):
                    if rnd.random() < 0.25:
                        body = rnd.choice(RAW)
                    else:
                        keys = rnd.sample(fields, min(len(fields), rnd.randint(1, 4))) if fields else ["x"]
                        body = dumps({k: random_value(rnd) for k in keys})
                c(rnd.choice(["alice", "admin"]), method.upper(), url, body)


# -- what the run left stored --------------------------------------------------------------
def alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


def bad_text(s: str) -> bool:
    return "\x00" in s or any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)


def stored_invalid(state: Path) -> list[str]:
    found = []
    db = sqlite3.connect(state / "gpupool.sqlite", timeout=30)
    db.text_factory = lambda b: b.decode("utf-8", "surrogatepass")

    def rows(sql):
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError:  # a table this build does not have
            return []

    for table in ("departments", "projects"):
        for name, *nums in rows(f'SELECT name, gpus, over_quota_weight, "limit" FROM {table}'):
            if not NAME.fullmatch(name):
                found.append(f"{table} name {name!r}")
            for v in nums[:2] + [n for n in nums[2:] if n is not None]:
                if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_GPUS:
                    found.append(f"{table} {name!r} quota value {v!r}")
    for (user,) in rows("SELECT user FROM members") + rows("SELECT user FROM role_assignments"):
        if not USER.fullmatch(user):
            found.append(f"user name {user!r}")
    for table in ("credentials", "data_sources"):
        for (name,) in rows(f"SELECT name FROM {table}"):
            if not NAME.fullmatch(name):
                found.append(f"{table} name {name!r}")
    for (mount,) in rows("SELECT mount_path FROM data_sources"):
        if posixpath.normpath(mount) != mount or mount.startswith("//"):
            found.append(f"mount path {mount!r}")
    for table in ("workloads", "trainings", "inference_services"):
        for name, spec in rows(f"SELECT name, spec FROM {table}"):
            if not NAME.fullmatch(name) and not (table == "workloads" and name.startswith("ws-")):
                found.append(f"{table} name {name!r}")
            if len(spec.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
                found.append(f"{table} {name!r} spec of {len(spec)} bytes")
            data = json.loads(spec)
            if any(bad_text(s) for s in strings(data)):
                found.append(f"{table} {name!r} spec with a NUL byte or a lone surrogate")
            ckpt = data.get("checkpoint_dir") if isinstance(data, dict) else None
            if ckpt and ".." in Path(ckpt).parts:
                found.append(f"{table} {name!r} checkpoint_dir {ckpt!r}")
    # Trainings and inferences record their process; a workspace is JupyterHub's server.
    for name, kind, state_, pid, placement in rows("SELECT name, kind, state, pid, placement FROM workloads"):
        holds = json.loads(placement or "[]")
        dead = kind != "workspace" and not alive(pid)
        if state_ == "stopping" or (state_ == "running" and holds and dead):
            found.append(f"workload {name!r} {state_} holding {holds} with nothing running")
    db.close()
    for folder in ("workloads", "trainings"):
        for d in (state / folder).glob("*"):
            if not NAME.fullmatch(d.name) and not d.name.startswith("ws-"):
                found.append(f"folder {d}")
    return found


def settle(state: Path, timeout: float = 45.0) -> None:
    """Let stopping work end (the grace period of a workload is 30 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(state / "gpupool.sqlite", timeout=30) as db:
            if not db.execute("SELECT count(*) FROM workloads WHERE state = 'stopping'").fetchone()[0]:
                return
        time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-operation", type=int, default=12, help="random requests per operation")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-hostile-") as tmp:
        # The hub runs this checkout's code, whichever one the environment has installed.
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        hub = Hub(Path(tmp), config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n",
                  extra_env={"PYTHONPATH": path}).start()
        try:
            tokens = {u: HubClient(hub.url).login(u, USER_PW).token(u) for u in ("alice", "carol")}
            tokens["admin"] = HubClient(hub.url).login("admin", ADMIN_PW).token("admin")
            c = Client(hub.url, tokens)
            latencies(c, 1.0)  # warm-up: the service's first token checks ask the hub
            idle = latencies(c, 3.0)
            loaded = under_load(c)
            findings(c, sys.executable)
            phantoms(c)
            spec = yaml.safe_load(c("alice", "GET", "/openapi.json")[1])
            sweep(c, spec, args.per_operation, random.Random(args.seed))
            settle(hub.workdir / "state")
            invalid = stored_invalid(hub.workdir / "state")
            log = hub.log.read_text(errors="replace")
        finally:
            hub.stop()
    out = {
        "requests": c.requests,
        "server_errors": len(c.errors),
        "proxy_server_errors": len(c.proxy_errors),
        "stored_invalid": len(invalid),
        "p99_ms_other_users_during_10mb_request": round(p99(loaded), 1),
        "p99_ms_other_users_idle": round(p99(idle), 1),
        "median_ms_other_users_during_10mb_request": round(statistics.median(loaded), 1),
        "ten_mb_answers": c.ten_mb_statuses,
        "scheduler_cycles_failed": log.count("scheduler cycle failed"),
        "tracebacks_in_hub_log": log.count("Traceback (most recent call last)"),
        "seed": args.seed,
        "per_operation": args.per_operation,
    }
    if not args.json:
        for status, method, path, body in c.errors:
            print(f"{status} {method} {path[:120]!r}: {body[:200]}")
        for status, method, path, _ in c.proxy_errors:
            print(f"{status} from the proxy: {method} {path[:120]!r}")
        for what in invalid:
            print("stored:", what[:200])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
