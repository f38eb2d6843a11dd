"""Inference services in gpupool's database, beside the hub's tables.

The service process (REST API) writes and deletes rows; the hub process (controller and
activator) reads them every ``poll_s`` and writes back ``status`` (replicas, their states
and pending reasons, the autoscaler's last decision) for ``describe``.
"""

from __future__ import annotations

import time

from sqlalchemy import JSON, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from hub_ext.db import Base


class InferenceRow(Base):
    __tablename__ = "inference_services"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    project: Mapped[str] = mapped_column(String(63), index=True)
    spec: Mapped[dict] = mapped_column(JSON, default=dict)  # ServiceSpec.to_dict()
    created: Mapped[float] = mapped_column(Float, default=time.time)
    status: Mapped[dict] = mapped_column(JSON, default=dict)  # Service.status()


__all__ = ["InferenceRow"]
