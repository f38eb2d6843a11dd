"""Reaching a running workload from the CLI, as ``runai bash|exec|port-forward|logs`` do:
through the hub's SSH gateway (hub_ext/ssh), logged in with the same JupyterHub token the
CLI uses for the REST API, the gateway's host key pinned from ``GET /me``.

- ``ssh_command``: the OpenSSH command line (printed, or run with the token handed to ssh
  through ``SSH_ASKPASS``, never on its command line or on disk);
- ``exec_command``: run a command, stream its output, return its exit status (asyncssh);
- ``port_forward``: a local port to a port of the workload's on its localhost;
- ``follow_logs``: the REST API's ``/workloads/NAME/logs``, asked again with the offset.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from .common import ApiCall


@dataclass(frozen=True)
class Gateway:
    host: str
    port: int
    host_key: str
    user: str

    def login(self, target: str) -> str:
        """The SSH user name for ``target`` (a server name, a training worker, a replica)."""
        return f"{self.user}+{target}" if target else self.user


def gateway(args, api: ApiCall) -> Gateway:
    me = api(args, "GET", "/me")
    if not me.get("ssh_port"):
        sys.exit("gpupool: this hub has no SSH gateway (ask its admin to set Gpupool.ssh_port)")
    host = me.get("ssh_host") or urlparse(args.url).hostname or "127.0.0.1"
    return Gateway(host, int(me["ssh_port"]), me.get("ssh_host_key", ""), me["name"])


def token(args) -> str:
    return args.token or os.environ.get("GPUPOOL_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")


def known_hosts(gw: Gateway) -> Path:
    """A known_hosts file holding the gateway's key (in ~/.config/gpupool)."""
    folder = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "gpupool"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / "known_hosts"
    line = f"[{gw.host}]:{gw.port} {gw.host_key}\n"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    kept = [x for x in lines if not x.startswith(f"[{gw.host}]:{gw.port} ")]
    if line not in lines:
        path.write_text("".join([*kept, line]))
    return path


def ssh_command(gw: Gateway, target: str, extra: list[str] | None = None) -> list[str]:
    return ["ssh", "-p", str(gw.port), "-o", f"UserKnownHostsFile={known_hosts(gw)}",
            "-o", "PreferredAuthentications=publickey,password", *(extra or []), f"{gw.login(target)}@{gw.host}"]


def config_block(gw: Gateway, target: str, alias: str) -> str:
    """The ``~/.ssh/config`` entry VS Code Remote-SSH connects with."""
    return (f"Host {alias}\n  HostName {gw.host}\n  Port {gw.port}\n  User {gw.login(target)}\n"
            f"  UserKnownHostsFile {known_hosts(gw)}\n")


def run_ssh(argv: list[str], tok: str) -> int:
    """Run OpenSSH with the token as its password, handed over by an askpass helper."""
    with tempfile.TemporaryDirectory(prefix="gpupool-") as d:
        helper = Path(d) / "askpass"
        helper.write_text('#!/bin/sh\nprintf "%s\\n" "$GPUPOOL_SSH_TOKEN"\n')
        helper.chmod(0o700)
        env = {**os.environ, "GPUPOOL_SSH_TOKEN": tok, "SSH_ASKPASS": str(helper),
               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": os.environ.get("DISPLAY", ":0")}
        return subprocess.call(argv, env=env)


async def _connect(gw: Gateway, target: str, tok: str):
    from ..ssh import asyncssh

    try:
        return await asyncssh.connect(gw.host, gw.port, username=gw.login(target), password=tok,
                                      known_hosts=str(known_hosts(gw)), client_keys=None,
                                      preferred_auth="password", agent_path=None)
    except asyncssh.PermissionDenied:
        sys.exit(f"gpupool: the SSH gateway refused the login as {gw.login(target)} (bad token, "
                 "or locked out after failed logins)")
    except (OSError, asyncssh.Error) as e:
        sys.exit(f"gpupool: cannot reach the SSH gateway at {gw.host}:{gw.port}: {e}")


def exec_command(gw: Gateway, target: str, tok: str, command: list[str]) -> int:
    from ..ssh import asyncssh

    async def run() -> int:
        async with await _connect(gw, target, tok) as conn:
            proc = await conn.create_process(shlex.join(command), encoding=None, stdin=asyncssh.DEVNULL)

            async def pump(stream, out) -> None:
                while chunk := await stream.read(65536):
                    out.write(chunk)
                    out.flush()

            await asyncio.gather(pump(proc.stdout, sys.stdout.buffer), pump(proc.stderr, sys.stderr.buffer))
            result = await proc.wait()
            return result.exit_status if result.exit_status is not None else 255

    return asyncio.run(run())


def port_forward(gw: Gateway, target: str, tok: str, local: int, remote: int, ready=None) -> int:
    async def run() -> int:
        async with await _connect(gw, target, tok) as conn:
            listener = await conn.forward_local_port("127.0.0.1", local, "127.0.0.1", remote)
            print(f"Forwarding 127.0.0.1:{listener.get_port()} -> {gw.login(target)}:{remote} "
                  "(Ctrl-C to stop)", flush=True)
            if ready is not None:
                ready(listener.get_port())
            await listener.wait_closed()
        return 0

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 0


def follow_logs(args, api: ApiCall, path: str, follow: bool, every_s: float = 1.0) -> int:
    out = api(args, "GET", f"{path}?tail={args.tail}")
    for line in out["lines"]:
        print(line, flush=True)
    offset = out["offset"]
    try:
        while follow:
            time.sleep(every_s)
            out = api(args, "GET", f"{path}?offset={offset}")
            for line in out["lines"]:
                print(line, flush=True)
            offset = out["offset"]
    except KeyboardInterrupt:
        pass
    return 0


__all__ = ["Gateway", "config_block", "exec_command", "follow_logs", "gateway", "port_forward", "run_ssh",
           "ssh_command", "token"]
