"""The embedded scheduler's database side (``scheduler.embedded.adapter.Store``) and the
workload rows the spawner and the service write."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, func, select, true, update

from scheduler.model import MILLI, PodPlacement, State, Workload

from ..db.events import add_event
from ..db.tables import EventRow, NodeRow, WorkloadRow, bump_version, get_meta, set_meta, version
from ..org import projects as org
from .rules import WorkloadRequest

ACTIVE = ("pending", "running", "releasing")  # what the scheduler loop holds


def to_workload(row: WorkloadRow) -> Workload:
    req = WorkloadRequest(**{**row.spec, "project": row.project, "kind": row.kind})
    w = req.workload(row.name, row.submit_time,
                     float(row.spec.get("grace_period_s", 30.0)) if isinstance(row.spec, dict) else 30.0)
    if row.state in ("running", "releasing") and row.placement:
        w.state = State.RUNNING if row.state == "running" else State.RELEASING
        w.placement = placement_from_json(row.placement)
        w.over_quota = row.over_quota
    return w


def placement_json(pods) -> list[dict]:
    return [{"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_milli": p.gpu_milli} for p in pods]


def placement_from_json(items: list[dict]) -> tuple[PodPlacement, ...]:
    return tuple(PodPlacement(p["node"], tuple(p["gpu_indices"]), p["gpu_milli"]) for p in items)


class DbStore:
    def __init__(self, sessionmaker):
        self.Session = sessionmaker

    # -- scheduler.embedded.adapter.Store --------------------------------------------------------
    def version(self) -> int:
        with self.Session() as s:
            return version(s)

    def load_org(self):
        with self.Session() as s:
            return org.model_departments(s), org.model_projects(s)

    def load_workloads(self) -> list[Workload]:
        """The active workloads. A row whose stored spec no longer makes a workload (an
        older release, a hand edit) fails with the reason instead of stopping the loop."""
        out = []
        with self.Session() as s:
            for r in s.scalars(select(WorkloadRow).where(WorkloadRow.state.in_(ACTIVE))).all():
                try:
                    out.append(to_workload(r))
                except (TypeError, ValueError, KeyError, AttributeError) as e:
                    r.state, r.placement, r.reason = "failed", [], f"its stored spec is invalid: {e}"
                    add_event(s, "failed", f"{r.name} failed: {r.reason}", r.name, r.project)
            s.commit()
        return out

    def record(self, decisions, snapshot) -> None:
        with self.Session() as s:
            now = time.time()
            for b in decisions.binds:
                if b.workload not in snapshot.workloads:  # its launch failed: released already
                    continue
                s.execute(
                    update(WorkloadRow).where(WorkloadRow.name == b.workload,
                                              WorkloadRow.state.in_(("pending", "running"))).values(
                        state="running", placement=placement_json(b.pods), over_quota=b.over_quota,
                        reason="", queue_position=0, start_time=now,
                    )
                )
                self._record_allocation(s, b)
            if decisions.pending:
                names = [p.workload for p in decisions.pending]
                current = dict(
                    s.execute(
                        select(WorkloadRow.name, WorkloadRow.reason).where(WorkloadRow.name.in_(names))
                    ).all()
                )
                for p in decisions.pending:
                    if current.get(p.workload) != p.reason:
                        s.execute(
                            update(WorkloadRow).where(WorkloadRow.name == p.workload).values(
                                reason=p.reason, queue_position=p.queue_position
                            )
                        )
            s.commit()

    @staticmethod
    def _record_allocation(s, b) -> None:
        """Put the GPUs a bind took on its "placed" event (the loop wrote it just before):
        the event log is what GPU-hours are computed from (hub_ext/db/accounting.py)."""
        latest = (select(func.max(EventRow.id))
                  .where(EventRow.workload == b.workload, EventRow.kind == "placed").scalar_subquery())
        s.execute(update(EventRow).where(EventRow.id == latest).values(
            gpus=sum(p.gpu_milli * len(p.gpu_indices) for p in b.pods) / MILLI,
            placement=placement_json(b.pods)))

    def set_state(self, name: str, state: str, **fields) -> None:
        with self.Session() as s:
            s.execute(update(WorkloadRow).where(WorkloadRow.name == name).values(state=state, **fields))
            s.commit()

    def finish_stop(self, name: str) -> None:
        with self.Session() as s:
            s.execute(update(WorkloadRow).where(WorkloadRow.name == name, WorkloadRow.state == "stopping")
                      .values(state="stopped", placement=[], pid=None, reason="stopped"))
            s.commit()

    def event(self, kind: str, message: str, workload: str = "", project: str = "") -> None:
        with self.Session() as s:
            add_event(s, kind, message, workload, project)
            s.commit()

    def cancelled_since(self, workload: str, since: float) -> EventRow | None:
        """The "cancelled" event of ``workload``'s latest request, if that request was
        cancelled after ``since`` (the spawn form names it)."""
        with self.Session() as s:
            last = s.scalars(select(EventRow).where(
                EventRow.workload == workload, EventRow.kind.in_(("submitted", "cancelled")),
                EventRow.ts >= since).order_by(EventRow.id.desc()).limit(1)).first()
            return last if last is not None and last.kind == "cancelled" else None

    # -- spawner / service ---------------------------------------------------------------
    def add_workload(self, name: str, owner: str, req: WorkloadRequest, notify: bool,
                     server: str = "") -> float:
        """Store a pending workload's row; return its submit time."""
        submitted = time.time()
        with self.Session() as s:
            s.execute(delete(WorkloadRow).where(WorkloadRow.name == name))
            s.add(WorkloadRow(name=name, owner=owner, project=req.project, kind=req.kind,
                              spec=req.to_dict(), state="pending", submit_time=submitted,
                              server=server))
            add_event(s, "submitted", f"{owner} asked for {req.gpu_label()} ({req.kind})", name, req.project)
            if notify:
                bump_version(s)
            s.commit()
        return submitted

    def remove_workload(self, name: str) -> None:
        with self.Session() as s:
            s.execute(delete(WorkloadRow).where(WorkloadRow.name == name))
            s.commit()

    def get(self, name: str) -> WorkloadRow | None:
        with self.Session() as s:
            return s.get(WorkloadRow, name)

    def set_nodes(self, nodes, source: str) -> None:
        with self.Session() as s:
            s.execute(delete(NodeRow))
            for n in nodes:
                s.add(NodeRow(
                    name=n.name, pool=n.pool, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib,
                    source=source,
                    gpus=[{"index": g.index, "model": g.model, "memory_mib": g.memory_mib,
                           "uuid": g.uuid} for g in n.gpus],
                ))
            s.commit()

    def reset_after_restart(self, running: set[str] = frozenset()) -> None:
        """After a hub restart: a workspace whose server did not outlive the hub (not in
        ``running``) is dropped. Other work is settled by its owner as it starts (the job
        runner, the inference controller, ``EmbeddedMode.recover_processes``): taken back,
        reported as ended, or queued again."""
        gone = WorkloadRow.name.not_in(running) if running else true()
        with self.Session() as s:
            s.execute(delete(WorkloadRow).where(WorkloadRow.kind == "workspace", gone))
            bump_version(s)
            s.commit()

    def last_options(self, user: str) -> dict:
        with self.Session() as s:
            try:
                return json.loads(get_meta(s, f"last-options:{user}", "{}"))
            except ValueError:
                return {}

    def save_options(self, user: str, options: dict) -> None:
        with self.Session() as s:
            set_meta(s, f"last-options:{user}", options)
            s.commit()
