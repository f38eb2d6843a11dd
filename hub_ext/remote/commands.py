"""The CLI's ``ssh``, ``exec``, ``port-forward`` and ``logs`` actions, shared by the
workspace, training (``--rank``) and inference (``--replica``) nouns (hub_ext/remote.py
does the work)."""

from __future__ import annotations

import sys

from . import connect as remote
from .common import ApiCall

REMOTE = ("ssh", "exec", "port-forward", "logs")


def remote_action(args, api: ApiCall, noun: str, target: str | None = None) -> int:
    """``target``: the workload the SSH gateway enters (default: ``args.name``)."""
    target = target or args.name
    args.rest = list(getattr(args, "rest", None) or [])
    if args.action == "logs":
        return remote.follow_logs(args, api, f"/workloads/{target}/logs", args.follow)
    if args.action == "exec" and not args.rest:
        sys.exit(f"gpupool: {noun} exec needs a command: gpupool {noun} exec NAME -- COMMAND...")
    gw = remote.gateway(args, api)
    tok = remote.token(args)
    if args.action == "ssh":
        argv = remote.ssh_command(gw, target)
        if getattr(args, "print", False):
            print(" ".join(argv))
            print(f"# password: a JupyterHub token (this CLI's $GPUPOOL_TOKEN); for ~/.ssh/config:\n"
                  f"{remote.config_block(gw, target, f'gpupool-{target}')}")
            return 0
        return remote.run_ssh(argv, tok)
    if args.action == "exec":
        return remote.exec_command(gw, target, tok, args.rest)
    if len(args.rest) != 1 or not _ports(args.rest[0]):
        sys.exit(f"gpupool: {noun} port-forward needs LOCAL:REMOTE ports (1-65535; LOCAL 0: any free port)")
    local, port = _ports(args.rest[0])
    return remote.port_forward(gw, target, tok, local, port)


def _ports(raw: str) -> tuple[int, int] | None:
    local, sep, port = raw.partition(":")
    if not sep or not local.isdigit() or not port.isdigit():
        return None
    lo, re_ = int(local), int(port)
    return (lo, re_) if 0 <= lo < 65536 and 0 < re_ < 65536 else None


__all__ = ["REMOTE", "remote_action"]
