"""Admin panel pages, one module per page; each exports ``routes(prefix)``."""

from __future__ import annotations

from . import events, governance, nodes, org, overview, policies, queue, sshkeys, usage


def routes(prefix: str) -> list:
    out = []
    for mod in (overview, org, policies, nodes, queue, events, governance, usage, sshkeys):
        out += mod.routes(prefix)
    return out
