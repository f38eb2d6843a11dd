"""GPU-hours accounting (hub_ext/db/accounting.py): unit tests on hand-built event logs, and
a real hub (tests/hub/hubproc.py) where workspaces start and stop and /usage, /usage.csv
and the Usage page must agree with the events' own timestamps."""

from __future__ import annotations

import csv
import io
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hub_ext.db import accounting
from hub_ext.db.accounting import Allocation, Utilization, allocations, parse_range, usage
from hub_ext.db.tables import EventRow, GpuSampleRow, NodeRow
from hub_ext.requests.rules import FieldError
from hub_ext.schema import make_sessionmaker
from tests import chromium
from tests.waits import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

H = 3600.0


def ev(ts, kind, workload, gpus=None, user="u1", project="p1", department="d1", placement=None):
    return SimpleNamespace(ts=ts, kind=kind, workload=workload, gpus=gpus, user=user, project=project,
                           department=department, placement=placement)


def hours(rows, name):
    return next(r["gpu_hours"] for r in rows if r["name"] == name)


# -- unit: hand-built event logs ----------------------------------------------------------
def test_fraction_counts_as_fraction():
    log = [ev(0, "submitted", "w"), ev(0, "placed", "w", 0.25), ev(2 * H, "released", "w")]
    rows = usage(allocations(log), 0, 10 * H, "user", now=10 * H)
    assert rows == [{"name": "u1", "gpu_hours": 0.5, "used_gpu_hours": None, "utilization_pct": None,
                     "workloads": 1}]


@pytest.mark.parametrize("start, end, expected", [
    pytest.param(0, 10 * H, 4.0, id="whole-range"),
    pytest.param(2 * H, 10 * H, 3.0, id="clipped-at-start"),
    pytest.param(0, 3 * H, 2.0, id="clipped-at-end"),
    pytest.param(1.5 * H, 2.5 * H, 1.0, id="inside"),
    pytest.param(5 * H, 6 * H, 0.0, id="after"),
])
def test_clipped_to_range(start, end, expected):
    log = [ev(H, "placed", "w", 1.0), ev(5 * H, "released", "w")]  # 4 hours of 1 GPU
    rows = usage(allocations(log), start, end, "project", now=100 * H)
    assert (hours(rows, "p1") if rows else 0.0) == pytest.approx(expected)


def test_running_workload_counts_up_to_range_end_or_now():
    log = [ev(0, "placed", "w", 2.0)]
    assert hours(usage(allocations(log), 0, 3 * H, "user", now=100 * H), "u1") == pytest.approx(6.0)
    # a range reaching into the future stops at now
    assert hours(usage(allocations(log), 0, 100 * H, "user", now=H), "u1") == pytest.approx(2.0)


def test_preempt_then_resume():
    log = [
        ev(0, "placed", "t", 1.0),
        ev(H, "preempted", "t"),  # still holds the GPU until the process exits ...
        ev(1.5 * H, "requeued", "t"),  # ... here
        ev(3 * H, "placed", "t", 0.5),  # resumed on half a GPU
        ev(5 * H, "released", "t"),
    ]
    allocs = allocations(log)
    assert [(a.start, a.end, a.gpus) for a in allocs] == [(0, 1.5 * H, 1.0), (3 * H, 5 * H, 0.5)]
    assert hours(usage(allocs, 0, 10 * H, "user", now=10 * H), "u1") == pytest.approx(1.5 + 1.0)


def test_grouping_by_user_project_department():
    log = [
        ev(0, "placed", "a", 1.0, user="ann", project="nlp", department="research"),
        ev(0, "placed", "b", 0.5, user="bob", project="vision", department="research"),
        ev(0, "placed", "c", 0.25, user="ann", project="serving", department="ops"),
        ev(H, "released", "a"), ev(H, "released", "b"), ev(H, "released", "c"),
    ]
    allocs = allocations(log)
    by_user = usage(allocs, 0, H, "user", now=H)
    assert [(r["name"], r["gpu_hours"], r["workloads"]) for r in by_user] == [("ann", 1.25, 2), ("bob", 0.5, 1)]
    assert {r["name"]: r["gpu_hours"] for r in usage(allocs, 0, H, "department", now=H)} == {
        "research": 1.5, "ops": 0.25}
    assert {r["name"]: r["gpu_hours"] for r in usage(allocs, 0, H, "project", now=H)} == {
        "nlp": 1.0, "vision": 0.5, "serving": 0.25}


def test_a_second_placed_closes_the_open_allocation():
    log = [ev(0, "placed", "w", 1.0), ev(H, "placed", "w", 1.0), ev(2 * H, "released", "w")]
    assert [(a.start, a.end) for a in allocations(log)] == [(0, H), (H, 2 * H)]


def test_utilization_beside_allocation():
    pl = [{"node": "n", "gpu_indices": [0], "gpu_milli": 1000}]
    log = [ev(0, "placed", "busy", 1.0, user="ann", placement=pl),
           ev(0, "placed", "idle", 1.0, user="bob", placement=[{**pl[0], "gpu_indices": [1]}]),
           ev(2 * H, "released", "busy"), ev(2 * H, "released", "idle")]
    samples = [SimpleNamespace(ts=t * 600.0, node="n", gpu_index=g, utilization_pct=u)
               for t in range(13) for g, u in ((0, 90.0), (1, 0.0))]
    rows = usage(allocations(log), 0, 2 * H, "user", now=3 * H, util=Utilization(samples))
    assert {r["name"]: (r["gpu_hours"], r["used_gpu_hours"], r["utilization_pct"]) for r in rows} == {
        "ann": (2.0, 1.8, 90.0), "bob": (2.0, 0.0, 0.0)}


@pytest.mark.parametrize("args, field", [
    ({"from": "yesterday"}, "from"),
    ({"to": "2026-13-01"}, "to"),
    ({"from": "2026-11-02", "to": "2026-11-01"}, "to"),
    ({"from": "2020-01-01", "to": "2026-01-01"}, "to"),
    ({"by": "team"}, "by"),
])
def test_bad_ranges_name_the_field(args, field):
    with pytest.raises(FieldError) as e:
        parse_range(args)
    assert e.value.field == field


def test_range_dates_are_utc_days_and_to_includes_its_day():
    start, end, by = parse_range({"from": "2026-11-01", "to": "2026-11-30", "by": "user"})
    assert (end - start) / 86400 == 30 and by == "user"
    start, end, _ = parse_range({"from": "2026-11-01T10:00:00Z", "to": "2026-11-01T14:00:00+02:00"})
    assert end - start == 2 * H
    assert start == parse_range({"from": "2026-11-01T10:00:00"})[0]  # no zone: UTC


def test_restart_closes_open_allocations_at_the_last_sample(tmp_path):
    from hub_ext.db.tables import SampleRow

    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with Session() as s:
        s.add(EventRow(ts=100.0, kind="placed", workload="w", project="p", user="u", department="d", gpus=1.0))
        s.add(EventRow(ts=100.0, kind="placed", workload="done", project="p", user="u", department="d", gpus=1.0))
        s.add(EventRow(ts=150.0, kind="released", workload="done", project="p"))
        s.add(SampleRow(ts=460.0, capacity_milli=1000, allocated_milli=1000))
        s.commit()
        assert accounting.close_open_allocations(s) == 1
        s.commit()
        rep = accounting.report(s, 0, 10_000, "user", now=10_000)
    assert rep["items"][0]["gpu_hours"] == pytest.approx((360 + 50) / H)
    assert rep["utilization_measured"] is False


def test_report_reads_nvml_samples(tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")
    pl = [{"node": "gpu-node", "gpu_indices": [0, 1], "gpu_milli": 1000}]
    with Session() as s:
        s.add(NodeRow(name="gpu-node", source="nvml", gpus=[]))
        s.add(EventRow(ts=0.0, kind="placed", workload="w", project="p", user="u", department="d",
                       gpus=2.0, placement=pl))
        for t in range(0, 3600, 60):
            s.add(GpuSampleRow(ts=float(t), node="gpu-node", gpu_index=0, utilization_pct=50.0))
            s.add(GpuSampleRow(ts=float(t), node="gpu-node", gpu_index=1, utilization_pct=10.0))
        s.commit()
        rep = accounting.report(s, 0, H, "project", now=H)
    (row,) = rep["items"]
    assert rep["utilization_measured"] is True
    assert (row["gpu_hours"], row["utilization_pct"], row["used_gpu_hours"]) == (2.0, 30.0, 0.6)


def test_csv_has_a_row_per_item():
    rep = {"by": "user", "from": "a", "to": "b", "items": [
        {"name": "ann", "gpu_hours": 1.5, "used_gpu_hours": None, "utilization_pct": None, "workloads": 2}]}
    rows = list(csv.DictReader(io.StringIO(accounting.to_csv(rep))))
    assert rows == [{"user": "ann", "gpu_hours": "1.5", "used_gpu_hours": "", "utilization_pct": "",
                     "workloads": "2", "from": "a", "to": "b"}]


def test_allocation_overlap_of_open_allocation():
    a = Allocation("w", "u", "p", "d", 1.0, 10.0, None)
    assert a.overlap_s(0, 100, now=50) == 40


# -- a real hub ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ahub(tmp_path_factory):
    from hubclient import HubClient
    from hubproc import ADMIN_PW, USER_PW, Hub

    h = Hub(tmp_path_factory.mktemp("acct"), config="c = get_config()  # noqa\nc.Gpupool.sample_period_s = 1\n")
    h.start()
    h.tokens = {u: HubClient(h.url).login(u, USER_PW).token(u) for u in ("alice", "dave")}
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    yield h
    h.stop()


def _api(hub, user, method, path, body=None, expect=None):
    from hubclient import call
    from openapi_check import validate

    status, data = call(hub.url, hub.tokens.get(user, ""), method, path, body)
    if "raw" not in (data or {}):
        validate(method, path, status, data)
    if expect is not None:
        assert status == expect, (status, data)
    return data




def _events(hub, workload):
    return _api(hub, "admin", "GET", f"/events?workload={workload}&limit=1000", expect=200)["items"]


def _ready(hub, user, server):
    from hubclient import call

    _, u = call(hub.url, hub.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
    return (u.get("servers") or {}).get(server, {}).get("ready")


WORKSPACES = [  # user, server, project, department, request, GPUs
    ("alice", "frac", "nlp", "research", {"gpu_mode": "fraction", "gpu_fraction": 0.25}, 0.25),
    ("dave", "whole", "serving", "ops", {"gpu_mode": "whole", "gpus": 1}, 1.0),
]


@pytest.mark.slow
def test_gpu_hours_of_workspaces_on_a_real_hub(ahub):
    t_from = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    for user, server, project, _, req, _ in WORKSPACES:
        _api(ahub, user, "POST", "/workloads",
             {"kind": "workspace", "project": project, "server_name": server, **req}, expect=202)
    for user, server, *_ in WORKSPACES:
        wait_for(lambda u=user, s=server: _ready(ahub, u, s), f"{user}/{server} ready", 180)
    time.sleep(3)  # some GPU-hours to count
    for user, server, *_ in WORKSPACES:
        _api(ahub, user, "DELETE", f"/workloads/ws-{user}-{server}", expect=204)
    expected = {}
    for user, server, project, dept, _, gpus in WORKSPACES:
        events = wait_for(lambda n=f"ws-{user}-{server}": (ev := _events(ahub, n))
                          and any(e["kind"] == "released" for e in ev) and ev,
                          f"ws-{user}-{server} released", 180)
        placed = min(e["ts"] for e in events if e["kind"] == "placed")
        released = max(e["ts"] for e in events if e["kind"] == "released")
        assert released > placed
        expected[(user, project, dept)] = gpus * (released - placed) / 3600
    t_to = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))

    for by, col in (("user", 0), ("project", 1), ("department", 2)):
        rep = _api(ahub, "admin", "GET", f"/usage?from={t_from}&to={t_to}&by={by}", expect=200)
        got = {r["name"]: r["gpu_hours"] for r in rep["items"]}
        want = {k[col]: v for k, v in expected.items()}
        assert got.keys() == want.keys(), (by, got, want)
        for name, hours_ in want.items():
            assert got[name] == pytest.approx(hours_, rel=1e-3, abs=1e-5), (by, name)
        assert all(r["workloads"] == 1 for r in rep["items"])
        assert rep["utilization_measured"] is False  # declared GPUs: no NVML here
        assert all(r["utilization_pct"] is None for r in rep["items"])
        # the CSV download says the same
        from hubclient import call

        status, body = call(ahub.url, ahub.tokens["admin"], "GET", f"/usage.csv?from={t_from}&to={t_to}&by={by}")
        assert status == 200
        rows = list(csv.DictReader(io.StringIO(body["raw"])))
        assert {r[by]: float(r["gpu_hours"]) for r in rows} == {r["name"]: r["gpu_hours"] for r in rep["items"]}

    # the fraction counts as a fraction: a quarter of the whole GPU's rate
    rate = {k[0]: v for k, v in expected.items()}
    assert rate["alice"] < rate["dave"]


@pytest.mark.slow
@pytest.mark.parametrize("query, field", [
    ("from=yesterday", "from"),
    ("to=2026-02-30", "to"),
    ("from=2026-11-02&to=2026-11-01", "to"),
    ("from=2024-01-01&to=2026-01-01", "to"),
    ("by=team", "by"),
])
def test_usage_bad_input_names_the_field(ahub, query, field):
    for path in ("/usage", "/usage.csv"):
        data = _api(ahub, "admin", "GET", f"{path}?{query}", expect=400)
        assert data["error"]["field"] == field, data


@pytest.mark.slow
def test_usage_is_for_admins(ahub):
    for path in ("/usage", "/usage.csv"):
        assert "admin" in _api(ahub, "alice", "GET", path, expect=403)["error"]["message"]


def _run_training(hub, name: str) -> None:
    """A 0.5 GPU training of alice in nlp that runs and is stopped: GPU-hours to show."""
    cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
    _api(hub, "alice", "POST", "/workloads", {"kind": "training", "project": "nlp", "name": name,
                                               "gpu_fraction": 0.5, "command": cmd}, expect=201)
    wait_for(lambda: _api(hub, "alice", "GET", f"/workloads/{name}")["state"] == "running", f"{name} running", 180)
    _api(hub, "alice", "DELETE", f"/workloads/{name}", expect=204)
    wait_for(lambda: any(e["kind"] == "released" for e in _events(hub, name)), f"{name} released", 180)


@pytest.mark.slow
def test_usage_page_chart_and_table(ahub):
    from hubclient import call

    _run_training(ahub, "acct-page")
    path = "/services/gpupool/usage?by=user"
    status, page = call(ahub.url, ahub.tokens["admin"], "GET", path, api=False)
    assert status == 200, page
    html = page["raw"]
    assert 'id="usage-chart"' in html and "<rect" in html and 'id="usage"' in html
    assert "Utilization is not measured on this hub" in html
    assert "usage.csv?by=user" in html
    status, page = call(ahub.url, ahub.tokens["admin"], "GET", "/services/gpupool/usage?from=nope", api=False)
    assert status == 400 and "from: must be an ISO 8601 date" in page["raw"]
    assert call(ahub.url, ahub.tokens["alice"], "GET", path, api=False)[0] == 403


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                    "(scripts/setup-system installs it)")
def test_usage_page_in_the_browser(ahub, tmp_path):
    """The admin opens Usage, sees a bar per table row, regroups by department and downloads
    the CSV, which says what the page says."""
    import re

    from hubproc import ADMIN_PW
    from playwright.sync_api import sync_playwright

    _run_training(ahub, "acct-browser")
    with sync_playwright() as p:
        b = chromium.launch(p)
        try:
            page = b.new_context(accept_downloads=True).new_page()
            page.set_default_timeout(60_000)
            page.goto(ahub.url + "/hub/login")
            page.fill("#username_input", "admin")
            page.fill("#password_input", ADMIN_PW)
            page.click("#login_submit")
            page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
            page.goto(ahub.url + "/services/gpupool/usage")
            assert page.locator("#no-nvml").is_visible()
            rows = page.locator("#usage tr").count() - 1
            assert rows >= 1 and page.locator("#usage-chart rect").count() == rows
            assert page.locator("#usage tr", has_text="nlp").count() == 1
            page.select_option("select[name=by]", "department")
            page.click("#range button")
            page.wait_for_url(re.compile(r".*by=department.*"))
            assert "GPU-hours by department" in page.locator("#usage-title").inner_text()
            shown = {tr.locator("td").nth(0).inner_text(): float(tr.locator("td").nth(1).inner_text())
                     for tr in page.locator("#usage tr").all()[1:]}
            assert "research" in shown
            with page.expect_download() as dl:
                page.click("#csv")
            rows_csv = list(csv.DictReader(io.StringIO(Path(dl.value.path()).read_text())))
            assert {r["department"]: round(float(r["gpu_hours"]), 3) for r in rows_csv} == shown
        finally:
            b.close()


def test_database_from_before_gets_the_new_event_columns(tmp_path):
    """A database made before the accounting fields keeps its events and gains the columns."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, ts FLOAT, kind VARCHAR(32), "
                "workload VARCHAR(255), project VARCHAR(63), message TEXT)")
    con.execute("INSERT INTO events VALUES (1, 3600.0, 'placed', 'w', 'p', "
                "'w placed on local GPU 1,2 (0.5 each); n2 GPU 0 (0.25 each) over quota')")
    con.commit()
    con.close()
    Session = make_sessionmaker(f"sqlite:///{path}")
    with Session() as s:
        (e,) = s.query(EventRow).all()
        assert (e.user, e.gpus, e.placement) == (None, None, None)
        s.add(EventRow(ts=3 * H, kind="released", workload="w", project="p", user="u"))
        s.commit()
        # the GPUs of an event from before come from its words: 2 x 0.5 + 0.25 for two hours
        (row,) = accounting.report(s, 0, 10 * H, "project", now=10 * H)["items"]
        assert (row["name"], row["gpu_hours"]) == ("p", 2.5)


def test_report_counts_allocations_held_when_the_range_starts(tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with Session() as s:
        for i, (ts, kind, w, gpus) in enumerate([
            (100.0, "placed", "held", 1.0), (200.0, "placed", "gone", 1.0), (300.0, "requeued", "gone", None),
            (400.0, "placed", "open", 0.5), (5000.0, "released", "held", None),
        ]):
            s.add(EventRow(id=i + 1, ts=ts, kind=kind, workload=w, project="p", user=w, department="d", gpus=gpus))
        s.commit()
        rep = accounting.report(s, 1000.0, 2000.0, "user", now=1500.0)
    assert {r["name"]: r["gpu_hours"] for r in rep["items"]} == {
        "held": pytest.approx(500 / H, abs=1e-6), "open": pytest.approx(0.5 * 500 / H, abs=1e-6)}
