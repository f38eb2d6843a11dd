"""The public keys each user uploaded for the SSH gateway (``PUT /me/ssh-keys``): one row
per user holding their whole ``authorized_keys`` list, replaced as a whole."""

from __future__ import annotations

import time

from sqlalchemy import JSON, Float, String, select
from sqlalchemy.orm import Mapped, mapped_column

from ..db.tables import Base


class SshKeysRow(Base):
    __tablename__ = "ssh_keys"
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    keys: Mapped[list] = mapped_column(JSON, default=list)
    updated: Mapped[float] = mapped_column(Float, default=time.time)


def keys_of(s, user: str) -> list[str]:
    return list(s.scalar(select(SshKeysRow.keys).where(SshKeysRow.user == user)) or [])


def set_keys(s, user: str, keys: list[str]) -> None:
    """Replace ``user``'s keys (already checked by validation.ssh_keys); the caller commits."""
    row = s.get(SshKeysRow, user)
    if row is None:
        s.add(SshKeysRow(user=user, keys=list(keys), updated=time.time()))
    else:
        row.keys, row.updated = list(keys), time.time()


__all__ = ["SshKeysRow", "keys_of", "set_keys"]
