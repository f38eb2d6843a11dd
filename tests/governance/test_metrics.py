"""Prometheus metrics: the scheduler's (embedded, at the hub's /hub/metrics; gpupool-scheduler
with --metrics-port on the local Kubernetes cluster), the service's (/services/gpupool/metrics)
and the Grafana dashboard (chart/dashboards/gpupool.json), whose every query must name
metrics that a scrape of those real endpoints shows. Scrapes are parsed with
prometheus_client.parser."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.metrics.prometheus import pending_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "chart" / "dashboards" / "gpupool.json"
ACTIVATOR_NAMES = ("gpupool_activator_",)  # the activator's (inference/metrics.py)


# -- parsing ----------------------------------------------------------------------------
class Scrape:
    """One endpoint's exposition: sample values by (name, labels) and the names it offers."""

    def __init__(self, text: str):
        self.families = list(text_string_to_metric_families(text))
        self.samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in self.families for s in f.samples}

    def names(self) -> set[str]:
        """Series names a query can use: every sample's, and for a family without samples
        yet the names its type implies (a counter's _total, a histogram's _bucket ...)."""
        out = {name for name, _ in self.samples}
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                    "summary": ("_count", "_sum")}
        for f in self.families:
            out.add(f.name)
            out.update(f.name + s for s in suffixes.get(f.type, ()))
        return out

    def value(self, name: str, **labels) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def total(self, name: str, **labels) -> float:
        return sum(v for (n, ls), v in self.samples.items()
                   if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def scrape(url: str, token: str = "") -> Scrape:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return Scrape(r.read().decode())


_PROMQL_WORDS = {"sum", "by", "without", "rate", "increase", "histogram_quantile", "max", "min", "avg",
                 "count", "label_values", "le", "on", "ignoring", "group_left", "group_right", "and",
                 "or", "unless", "bool", "offset", "irate", "topk", "bottomk"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a label_values() query) reads."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)", r"\1", expr)
    words = [m.group(1) for m in re.finditer(r"([a-zA-Z_:][\w:]*)(\s*\()?", expr) if not m.group(2)]
    return {w for w in words if w not in _PROMQL_WORDS}


def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            exprs.append(q["query"])
    return exprs


# -- unit -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind", [
    ("project nlp is at its quota 1/1 GPUs and over-quota is off for workspaces", "quota"),
    ("department ops is at its quota 1/1 GPUs and over-quota is off for workspaces", "quota"),
    ("project nlp is at its limit 3 GPUs", "limit"),
    ("department research is at its limit 4 GPUs", "limit"),
    ("project nlp is over its quota (3 GPUs in use) and its fair share of idle GPUs (1) is taken", "fair_share"),
    ("no node in pool default has 1 GPU free; 2 workloads ahead", "capacity"),
    ("project nlp is at its CPU quota (3 of 4 CPUs in use, 2 more asked)", "quota"),
    ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.", "node_constraints"),
    ("something new", "other"),
])
def test_pending_reason_labels(text, kind):
    assert pending_reason(text) == kind


def test_metric_names_of_promql():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="y"}[5m])))') == {"a_bucket"}
    assert metric_names("sum(a) / sum(b_total)") == {"a", "b_total"}
    assert metric_names("label_values(gpupool_guaranteed_gpus, project)") == {"gpupool_guaranteed_gpus"}


def test_dashboard_is_grafana_json_with_queries():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["panels"] and all(p["type"] in ("row", "timeseries", "stat") for p in d["panels"])
    names = set().union(*(metric_names(e) for e in dashboard_queries()))
    assert all(n.startswith("gpupool_") for n in names), names
    for needed in ("gpupool_queue_length", "gpupool_pending_workloads", "gpupool_allocated_gpus",
                   "gpupool_guaranteed_gpus", "gpupool_preemptions_total",
                   "gpupool_scheduler_cycle_seconds_bucket", "gpupool_spawn_duration_seconds_bucket",
                   "gpupool_activator_requests_total", "gpupool_activator_held_requests",
                   "gpupool_activator_cold_start_seconds_bucket", "gpupool_activator_replicas"):
        assert needed in names


# -- a real hub (embedded scheduler) ----------------------------------------------------------
@pytest.fixture(scope="module")
def mhub(tmp_path_factory):
    from hubclient import HubClient
    from hubproc import ADMIN_PW, USER_PW, Hub

    h = Hub(tmp_path_factory.mktemp("metrics")).start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "carol", "dave")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    yield h
    h.stop()


def _post(hub, user, body):
    from hubclient import call

    status, data = call(hub.url, hub.tokens[user], "POST", "/workloads", body)
    assert status in (201, 202), (status, data)
    return data


def _until(what, check, timeout=180):
    """Poll ``check`` (returns a list of mismatches) until it returns none."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if not last:
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: {last}")


def _state(hub, name: str) -> str | None:
    from hubclient import call

    status, w = call(hub.url, hub.tokens["admin"], "GET", f"/workloads/{name}")
    return w.get("state") if status == 200 else None


def _hub_scrape(hub) -> Scrape:
    return scrape(hub.url + "/hub/metrics", hub.tokens["admin"])


def _svc_scrape(hub) -> Scrape:
    return scrape(hub.url + "/services/gpupool/metrics")


@pytest.mark.slow
def test_embedded_scheduler_and_service_metrics(mhub):
    # 4 declared GPUs. dave (serving, quota 1) takes 1; alice's trainings in nlp (quota 1,
    # limit 3) take 1 in quota and 2 over it; carol's workspace (vision, quota 2) reclaims the
    # over-quota one (nlp keeps its quota): one preemption in nlp, and that training waits
    # again. dave's second workspace waits at serving's quota.
    _post(mhub, "dave", {"kind": "workspace", "project": "serving", "server_name": "one", "gpu_mode": "whole", "gpus": 1})
    cmd = [sys.executable, "-c", "import time; time.sleep(600)"]
    for name, gpus in (("t-in", 1), ("t-over", 2)):
        _post(mhub, "alice", {"kind": "training", "project": "nlp", "name": name, "gpu_mode": "whole",
                              "gpus": gpus, "command": cmd})
        _until(f"{name} placed", lambda n=name: [] if _state(mhub, n) == "running" else [n])
    _until("dave's workspace and alice's trainings hold 4 GPUs",
           lambda: [] if _hub_scrape(mhub).total("gpupool_allocated_gpus") == 4 else ["allocated != 4"])
    _post(mhub, "carol", {"kind": "workspace", "project": "vision", "server_name": "v", "gpu_mode": "whole", "gpus": 1})
    _post(mhub, "dave", {"kind": "workspace", "project": "serving", "server_name": "two", "gpu_mode": "whole", "gpus": 1})

    expected = [  # (metric, labels, value)
        ("gpupool_allocated_gpus", {"project": "serving", "department": "ops"}, 1),
        ("gpupool_allocated_gpus", {"project": "vision", "department": "research"}, 1),
        ("gpupool_allocated_gpus", {"project": "nlp", "department": "research"}, 1),
        ("gpupool_guaranteed_gpus", {"project": "nlp", "department": "research"}, 1),
        ("gpupool_guaranteed_gpus", {"project": "vision", "department": "research"}, 2),
        ("gpupool_guaranteed_gpus", {"project": "serving", "department": "ops"}, 1),
        ("gpupool_department_allocated_gpus", {"department": "research"}, 2),
        ("gpupool_department_allocated_gpus", {"department": "ops"}, 1),
        ("gpupool_department_guaranteed_gpus", {"department": "research"}, 3),
        ("gpupool_department_guaranteed_gpus", {"department": "ops"}, 1),
        ("gpupool_capacity_gpus", {"pool": "default"}, 4),
        ("gpupool_queue_length", {"project": "serving"}, 1),
        ("gpupool_queue_length", {"project": "nlp"}, 1),
        ("gpupool_queue_length", {"project": "vision"}, 0),
        ("gpupool_pending_workloads", {"project": "serving", "reason": "quota"}, 1),
        ("gpupool_running_workloads", {"project": "vision"}, 1),
        ("gpupool_running_workloads", {"project": "nlp"}, 1),
        ("gpupool_preemptions_total", {"project": "nlp"}, 1),
        ("gpupool_binds_total", {"project": "nlp"}, 2),
        ("gpupool_spawn_duration_seconds_count", {"project": "serving", "outcome": "started"}, 1),
        ("gpupool_spawn_duration_seconds_count", {"project": "vision", "outcome": "started"}, 1),
        ("gpupool_spawn_queue_seconds_count", {"project": "vision"}, 1),
        ("gpupool_scheduler_leader", {}, 1),
    ]

    def check_hub():
        s = _hub_scrape(mhub)
        bad = [(n, lb, s.value(n, **lb), v) for n, lb, v in expected if s.value(n, **lb) != v]
        if s.total("gpupool_pending_workloads", project="nlp") != 1:
            bad.append(("gpupool_pending_workloads", {"project": "nlp"}, "sum", 1))
        return bad

    _until("the hub's scheduler metrics", check_hub)
    hub = _hub_scrape(mhub)
    assert hub.value("gpupool_scheduler_cycle_seconds_count") > 0
    assert hub.value("gpupool_scheduler_cycle_seconds_bucket", le="+Inf") == hub.value(
        "gpupool_scheduler_cycle_seconds_count")

    def check_service():
        s = _svc_scrape(mhub)
        want = {("running", "workspace"): 2, ("pending", "workspace"): 1, ("pending", "training"): 1,
                ("running", "training"): 1}
        return [(k, s.value("gpupool_workloads", state=k[0], kind=k[1]), v) for k, v in want.items()
                if s.value("gpupool_workloads", state=k[0], kind=k[1]) != v]

    _until("the service's workload metrics", check_service)
    svc = _svc_scrape(mhub)
    # declared GPUs: no NVML, so no utilization series (the family is there, empty)
    assert svc.total("gpupool_gpu_utilization_percent") == 0
    assert not any(n == "gpupool_gpu_utilization_percent" for n, _ in svc.samples)

    # The dashboard: every metric its queries read is in these scrapes (the scheduler's
    # names are the same on gpupool-scheduler: test_scheduler_metrics_on_kubernetes).
    offered = hub.names() | svc.names() | _activator_names()
    for expr in dashboard_queries():
        for name in metric_names(expr):
            if name.startswith(ACTIVATOR_NAMES) and not _activator_names():
                continue  # the activator's metrics are not there yet
            assert name in offered, f"dashboard query {expr!r} reads {name}, which no endpoint exports"


def _activator_names() -> set[str]:
    """The names the activator exports: its real registry's exposition (inference.metrics),
    empty where that module does not exist."""
    try:
        from inference import metrics as activator
    except ImportError:
        return set()
    return Scrape(activator.exposition().decode()).names()


# -- gpupool-scheduler on the local Kubernetes cluster ---------------------------------------
try:
    from tests.k8s.conftest import k8s_cluster, ns  # noqa: F401  (fixtures)
except ImportError:  # pragma: no cover
    pass


@pytest.mark.slow
def test_scheduler_metrics_on_kubernetes(k8s_cluster, ns, tmp_path):  # noqa: F811
    from hubproc import free_ports

    from tests.k8s.helpers import (
        REPO,
        bound,
        create_org,
        delete_org,
        kube,
        list_pods,
        make_pod,
        run,
        wait_until,
    )

    (port,) = free_ports(1)
    log = open(tmp_path / "scheduler.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.kubernetes", "--kubeconfig", str(k8s_cluster.kubeconfig),
         "--lease-name", "gpupool-metrics-test", "--lease-duration", "3", "--lease-renew", "0.5",
         "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    pods = {"m-a": ("fraction", 0.5), "m-b": ("fraction", 0.25), "m-c": ("gpus", 1)}

    async def go():
        async with kube(k8s_cluster) as kc:
            await create_org(kc, "d-metrics", 4, {"p-metrics": {"gpus": 2}})
            try:
                for name, (how, n) in pods.items():
                    pod = make_pod(name).ns(ns).project("p-metrics").kind("workspace")
                    pod = pod.fraction(n) if how == "fraction" else pod.gpus(n)
                    await kc.post(f"/api/v1/namespaces/{ns}/pods", pod.obj())
                # a workspace over the project's quota waits (workspaces stay in quota)
                await kc.post(f"/api/v1/namespaces/{ns}/pods",
                              make_pod("m-wait").ns(ns).project("p-metrics").kind("workspace").gpus(2).obj())

                async def all_bound():
                    return len(bound(await list_pods(kc, ns))) >= len(pods)

                await wait_until(all_bound, "the three pods bound")
                want = {
                    ("gpupool_allocated_gpus", (("department", "d-metrics"), ("project", "p-metrics"))): 1.75,
                    ("gpupool_guaranteed_gpus", (("department", "d-metrics"), ("project", "p-metrics"))): 2,
                    ("gpupool_department_guaranteed_gpus", (("department", "d-metrics"),)): 4,
                    ("gpupool_binds_total", (("project", "p-metrics"),)): 3,
                    ("gpupool_queue_length", (("project", "p-metrics"),)): 1,
                    ("gpupool_pending_workloads", (("project", "p-metrics"), ("reason", "quota"))): 1,
                    ("gpupool_scheduler_leader", ()): 1,
                }

                async def metrics_match():
                    s = scrape(url)
                    return all(s.samples.get(k) == v for k, v in want.items()) and s

                return await wait_until(metrics_match, "gpupool-scheduler's metrics")
            finally:
                await delete_org(kc, "d-metrics", ["p-metrics"])

    try:
        _until("the metrics port", lambda: [] if _reachable(url) else ["not up"], timeout=60)
        s = run(go())
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert s.value("gpupool_scheduler_cycle_seconds_count") > 0
    assert s.value("gpupool_capacity_gpus", pool="default") > 0
    # the dashboard's scheduler queries read names this process exports
    scheduler_names = {n for e in dashboard_queries() for n in metric_names(e)
                       if n.startswith(("gpupool_scheduler_", "gpupool_queue_", "gpupool_pending_",
                                        "gpupool_allocated_", "gpupool_guaranteed_", "gpupool_department_",
                                        "gpupool_preemptions", "gpupool_binds", "gpupool_running_",
                                        "gpupool_capacity_"))}
    assert scheduler_names and scheduler_names <= s.names(), scheduler_names - s.names()


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False
