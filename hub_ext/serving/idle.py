"""The policy's idle timeout of inference services, hub side: read from the projects'
policies for the autoscaler (``IdleLimit``, the one rule), and recorded as an event when
it has scaled a service to zero.
"""

from __future__ import annotations

import time

from hub_ext.db.events import add_event
from hub_ext.org import policy
from inference.autoscaler import IdleLimit

from .db import InferenceRow


def idle_limits(s, rows) -> dict[str, IdleLimit | None]:
    """Per service row: its project's policy's idle timeout of an inference service
    (``idle_timeout_inference_s``), which the autoscaler applies over the service's own
    ``min_replicas`` and ``scale_to_zero_after_s``."""
    pols = policy.all_effective(s, {r.project for r in rows})
    out: dict[str, IdleLimit | None] = {}
    for r in rows:
        most = pols[r.project].idle_s("inference")
        out[r.name] = None if most is None else IdleLimit(
            most, pols[r.project].whose("idle_timeout_inference_s"))
    return out


def store_status(s, row: InferenceRow, st: dict) -> None:
    """A service's state (``Service.status()``) onto its row for describe, with a
    ``stopped`` event when the policy's idle limit has scaled it to zero since. Caller
    commits."""
    stop = st.get("idle_stop")
    if stop and stop != (row.status or {}).get("idle_stop"):
        add_event(s, "stopped", stop["message"], row.name, row.project)
    row.status = {**st, "updated": time.time()}


__all__ = ["idle_limits", "store_status"]
