"""Training jobs in the database: one ``TrainingRow`` per job beside the hub's
``WorkloadRow`` (which the scheduler loop and the hub's views read).

The service process writes new jobs and control requests (suspend, resume, delete); the
job runner in the hub process owns everything else. The WorkloadRow of a job stays in a
state the scheduler loop does not adopt by itself (``submitted``, ``backoff``,
``suspended``) whenever the runner is not holding it in the scheduler.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import JSON, Float, Integer, String, Text, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from ..attachments import attach
from ..db.events import add_event
from ..db.tables import Base, Submitted, WorkloadRow, bump_version
from .spec import TrainingSpec

# Job states a user sees (the names) and the WorkloadRow.state each maps to.
STATUSES = ("Pending", "Running", "Preempted", "Resuming", "Succeeded", "Failed", "Suspended")
FINAL = ("Succeeded", "Failed")
SUBMITTED = "submitted"  # WorkloadRow.state before the runner takes the job
# STATE_DIR/trainings/JOB/logs.json (the hub's): {"dir": the job's folder in its owner's
# home, "uid": that account}, written by the runner when the job starts
LOGS = "logs.json"


class TrainingRow(Submitted, Base):  # spec: TrainingSpec.to_dict()
    __tablename__ = "trainings"
    status: Mapped[str] = mapped_column(String(16), default="Pending", index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    request: Mapped[str] = mapped_column(String(16), default="")  # "" | suspend | resume | delete
    # why, when not a user's own request (a policy's idle timeout, its maximum runtime):
    # the status reason the job shows once the request is carried out
    request_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # gang starts so far
    failures: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    created: Mapped[float] = mapped_column(Float, default=time.time)
    updated: Mapped[float] = mapped_column(Float, default=time.time)
    transitions: Mapped[list] = mapped_column(JSON, default=list)  # [{ts, status, reason}]


def training_dict(t: TrainingRow, w: WorkloadRow | None) -> dict:
    spec = TrainingSpec.from_dict(t.spec)
    return {
        "name": t.name, "owner": t.owner, "project": t.project, "status": t.status,
        "reason": t.reason or (w.reason if w is not None and t.status in ("Pending", "Preempted") else ""),
        "queue_position": w.queue_position if w is not None else 0,
        "gpu": spec.gpu_label(), "workers": spec.workers, "spec": t.spec,
        "placement": (w.placement if w is not None else []),
        "over_quota": bool(w.over_quota) if w is not None else False,
        "attempt": t.attempt, "failures": t.failures, "preemptions": t.preemptions,
        "created": t.created, "updated": t.updated, "transitions": t.transitions,
    }


def add_training(s, owner: str, spec: TrainingSpec) -> None:
    """A new job (or one that replaces a finished job of the same name). Caller commits.
    FieldError for credentials or data sources the project does not have."""
    att = attach.check(s, spec.project, spec.credentials, spec.datasources,
                       {spec.checkpoint_dir or "/checkpoints": "checkpoint_dir"})
    now = time.time()
    s.execute(delete(WorkloadRow).where(WorkloadRow.name == spec.name))
    s.execute(delete(TrainingRow).where(TrainingRow.name == spec.name))
    s.add(WorkloadRow(name=spec.name, owner=owner, project=spec.project, kind="training",
                      spec=spec.request().to_dict(), state=SUBMITTED, submit_time=now))
    s.add(TrainingRow(name=spec.name, owner=owner, project=spec.project, spec=spec.to_dict(),
                      status="Pending", created=now, updated=now,
                      transitions=[{"ts": now, "status": "Pending", "reason": "submitted"}]))
    add_event(s, "submitted", f"{owner} submitted training {spec.name} ({spec.gpu_label()})",
              spec.name, spec.project)
    attach.record_use(s, owner, spec.name, att, "attach")
    bump_version(s)


def is_active(t: TrainingRow | None) -> bool:
    return t is not None and t.status not in FINAL


def set_status(s, name: str, status: str, reason: str = "", event: str | None = None,
               message: str = "", **fields) -> None:
    """Move a job to ``status`` (recording the transition and an event). Caller commits."""
    t = s.get(TrainingRow, name)
    if t is None:
        return
    now = time.time()
    if status != t.status or reason != t.reason:
        t.transitions = [*t.transitions, {"ts": now, "status": status, "reason": reason}]
    t.status, t.reason, t.updated = status, reason, now
    for k, v in fields.items():
        setattr(t, k, v)
    if event:
        add_event(s, event, message or f"{name}: {status.lower()}" + (f" ({reason})" if reason else ""),
                  name, t.project)


def take_requests(s) -> list[tuple[str, str, str]]:
    """The control requests written by the service process, as (job, request, reason),
    cleared in the rows. Caller commits."""
    reqs = s.query(TrainingRow).filter(TrainingRow.request != "").all()
    out = [(t.name, t.request, t.request_reason) for t in reqs]
    for t in reqs:
        t.request, t.request_reason = "", ""
    return out


def worker_region(job: str, rank: int) -> str:
    """The interception library's account of worker ``rank`` (GPUPOOL_SHARED_REGION via
    ``scheduler.embedded.adapter.gpu_env``), where the culler reads its GPU activity."""
    return f"{job}-{rank}"


def pending_requests(s) -> list[TrainingRow]:
    return list(s.scalars(select(TrainingRow).where(TrainingRow.request != "")).all())


def worker_log(state_dir: str | Path, name: str, rank: int) -> tuple[Path, int] | None:
    """Where worker ``rank`` of job ``name`` logs, and the account that owns the file;
    None before the job first started."""
    try:
        where = json.loads((Path(state_dir) / "trainings" / name / LOGS).read_text())
        return Path(where["dir"]) / f"worker-{rank}.log", int(where["uid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
