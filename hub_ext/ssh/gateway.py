"""The SSH gateway: ``ssh USER[+NAME]@HUB -p Gpupool.ssh_port`` reaches workload NAME of
hub user USER (their default workspace without ``+NAME``).

It runs in the gpupool service process: that process runs as the hub's user (root in
embedded mode, so it can enter an account and a cgroup), holds the database (audit log,
uploaded keys) and can ask the hub's API who owns a token.

- **Login**: the password is a JupyterHub API token, checked against the hub's API
  (``GET /user`` with that token); it must belong to USER and carry ``access:servers`` for
  USER (or for that server). A key uploaded with ``PUT /me/ssh-keys`` logs in too.
- **Failures** are throttled per user and per source address (``Throttle``).
- **Every login** and every refusal before a lockout is written to the audit log
  (``ssh.login``, ``ssh.refused``).
- **Sessions** (shell with or without a pty, exec, SFTP) and local port forwards go to the
  ``Backend``: the host's processes in embedded mode (``embedded.py``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR
from asyncssh.stream import SSHReader, SSHWriter
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..db import audit
from ..org import sshkeys
from .throttle import Throttle

log = logging.getLogger("gpupool.ssh")
_USER = re.compile(r"^([^+\s]{1,255})(?:\+([A-Za-z0-9][A-Za-z0-9_.-]{0,99}))?$")
HOST_KEY = "ssh_host_ed25519_key"


@dataclass(frozen=True)
class Login:
    user: str
    name: str  # the server name ('' for the default workspace), or a workload's name
    source: str


class Backend(Protocol):
    async def workload(self, user: str, name: str) -> str | None:
        """The running workload USER may reach as NAME (None: none, or not theirs)."""

    async def session(self, process: asyncssh.SSHServerProcess, workload: str) -> int:
        """Run the session's shell, command or subsystem inside ``workload``; its exit status."""

    def may_forward(self, workload: str, host: str, port: int) -> bool:
        """Whether a forward to HOST:PORT reaches a listener of ``workload``."""

    def tcp_session(self, workload: str, host: str, port: int):
        """What ``SSHServer.connection_requested`` returns for an allowed forward."""


def host_key(state_dir: str | Path) -> asyncssh.SSHKey:
    """The gateway's host key, made on first use in the hub's private state (0600)."""
    folder = Path(state_dir) / "ssh"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / HOST_KEY
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
    return asyncssh.read_private_key(str(path))


def public_host_key(state_dir: str | Path) -> str:
    """``ssh-ed25519 AAAA...`` of the gateway (for known_hosts), '' before it first ran."""
    try:
        return asyncssh.read_private_key(str(Path(state_dir) / "ssh" / HOST_KEY)) \
            .export_public_key().decode().strip()
    except (OSError, asyncssh.KeyImportError):
        return ""


async def token_owner(hub_api: str, token: str) -> tuple[str, set[str]] | None:
    """The hub user a JupyterHub API token belongs to and the token's scopes; None for a
    bad, expired or revoked one."""
    if not token or len(token) > 4096 or any(c.isspace() for c in token):
        return None
    try:
        r = await AsyncHTTPClient().fetch(hub_api.rstrip("/") + "/user", request_timeout=30,
                                          headers={"Authorization": f"token {token}"})
    except HTTPClientError:
        return None
    except OSError as e:
        log.warning("ssh: cannot reach the hub's API to check a token: %s", e)
        return None
    try:
        body = json.loads(r.body)
    except ValueError:
        return None
    if body.get("kind", "user") != "user" or not isinstance(body.get("name"), str):
        return None
    return body["name"], set(body.get("scopes") or ())


def may_reach(scopes: set[str], user: str, server: str) -> bool:
    """Whether a token with ``scopes`` may reach USER's server (as it may through the proxy):
    ``access:servers`` for all of USER's servers or for that one. A token made for less
    (reading the API, say) opens no shell."""
    ok = {"access:servers", f"access:servers!user={user}"}
    if server:
        ok.add(f"access:servers!server={user}/{server}")
    return bool(ok & scopes)


class _Process(asyncssh.SSHServerProcess):
    """A session whose SFTP subsystem goes to the process handler like a command: asyncssh
    would serve SFTP itself, in this root process; the backend runs the system's sftp-server
    as the workload's account instead."""

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        chan = self._chan
        stdin = SSHReader(self, chan)
        stdout, stderr = SSHWriter(self, chan), SSHWriter(self, chan, EXTENDED_DATA_STDERR)
        self._conn.create_task(self._start_process(stdin, stdout, stderr), stdin.logger)


class Gateway:
    def __init__(self, Session, backend: Backend, hub_api: str, throttle: Throttle,
                 hub_url: str = ""):
        self.Session, self.backend, self.hub_api = Session, backend, hub_api
        self.throttle, self.hub_url = throttle, hub_url

    def audit(self, actor: str, action: str, target: str, details: dict) -> None:
        with self.Session() as s:
            audit.record(s, actor, action, target, details)
            s.commit()

    def parse(self, username: str, source: str) -> Login | None:
        m = _USER.match(username or "")
        return Login(m.group(1), m.group(2) or "", source) if m else None

    def keys(self, login: Login) -> tuple[str, str]:
        return f"user:{login.user}", f"source:{login.source}"

    async def check(self, login: Login | None, how: str, ok) -> bool:
        """Apply the throttle around one attempt; ``ok`` is an awaitable of whether the
        credential is the user's."""
        if login is None:
            return False
        keys = self.keys(login)
        if self.throttle.locked(keys):
            return False
        if await ok:
            self.throttle.succeed(keys[:1])
            return True
        locked = self.throttle.fail(keys)
        why = "too many failed logins: locked" if locked else f"bad {how}"
        self.audit(login.user, "ssh.refused", login.name or login.user,
                   {"method": how, "source": login.source, "reason": why})
        return False

    async def token_ok(self, login: Login, token: str) -> bool:
        owner = await token_owner(self.hub_api, token)
        return owner is not None and owner[0] == login.user and may_reach(owner[1], login.user, login.name)

    def key_ok(self, login: Login, key: asyncssh.SSHKey) -> bool:
        with self.Session() as s:
            mine = sshkeys.keys_of(s, login.user)
        wanted = key.export_public_key().split()[1]
        return any(k.split()[1].encode() == wanted for k in mine)

    def not_running(self, login: Login) -> str:
        # the same words whether it is stopped or another user's: nothing leaks about others
        what = f"workspace {login.name!r}" if login.name else "your default workspace"
        # a server name can be passed to start; a workload name (ws-USER[-SERVER]) cannot
        server = "" if not login.name else " SERVER" if login.name.startswith("ws-") else f" {login.name}"
        return (f"gpupool: {what} is not running (or is not yours). Start it in the browser"
                f"{f' ({self.hub_url})' if self.hub_url else ''} or with "
                f"`gpupool workspace start{server}`, then connect again.\r\n")

    async def start(self, host: str, port: int, state_dir: str | Path) -> asyncssh.SSHAcceptor:
        gateway = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn):
                peer = conn.get_extra_info("peername") or ("?", 0)
                self.source, self.login, self.workload = str(peer[0]), None, None

            def begin_auth(self, username):
                self.login = gateway.parse(username, self.source)
                return True

            def password_auth_supported(self):
                return True

            def public_key_auth_supported(self):
                return True

            async def validate_password(self, username, password):
                return await self._done(await gateway.check(self.login, "token",
                                                            gateway.token_ok(self.login, password)), "token")

            async def validate_public_key(self, username, key):
                async def ok():
                    return gateway.key_ok(self.login, key)
                return await self._done(await gateway.check(self.login, "key", ok()), "key")

            async def _done(self, ok: bool, how: str) -> bool:
                if ok:
                    self.workload = await gateway.backend.workload(self.login.user, self.login.name)
                    gateway.audit(self.login.user, "ssh.login", self.workload or self.login.name,
                                  {"method": how, "source": self.source,
                                   "running": self.workload is not None})
                return ok

            def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
                if self.workload is None or not gateway.backend.may_forward(self.workload, dest_host, dest_port):
                    raise asyncssh.ChannelOpenError(
                        asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                        f"{dest_host}:{dest_port} is no port of this workload's on localhost")
                return gateway.backend.tcp_session(self.workload, dest_host, dest_port)

            def server_requested(self, listen_host, listen_port):
                return False  # remote forwards would open ports on the hub's host

            def session_requested(self):
                return _Process(session, None, 0, False)

        async def session(process: asyncssh.SSHServerProcess) -> None:
            server = process.get_extra_info("connection").get_owner()
            try:
                if server.workload is None:
                    process.stderr.write(gateway.not_running(server.login).encode())
                    process.exit(1)
                    return
                process.exit(await gateway.backend.session(process, server.workload))
            except Exception as e:  # noqa: BLE001 - a failure ends this channel only
                log.exception("ssh session of %s failed", server.login)
                process.stderr.write(f"gpupool: session failed: {e}\r\n".encode())
                process.exit(1)

        return await asyncssh.create_server(
            Server, host, port, server_host_keys=[host_key(state_dir)],
            encoding=None, agent_forwarding=False, x11_forwarding=False, allow_scp=False,
            login_timeout=60, keepalive_interval=60)


async def run(cfg, Session, hub_api: str, hub_url: str = "", *, backend_for) -> asyncssh.SSHAcceptor | None:
    """Start the gateway when ``Gpupool.ssh_port`` is set; ``await backend_for(cfg, Session)``
    gives its ``Backend`` (the mode's: ``hub_ext.backends.mode(cfg).ssh``)."""
    if not cfg.ssh_port:
        return None
    backend: Backend = await backend_for(cfg, Session)
    gw = Gateway(Session, backend, hub_api, Throttle(cfg.ssh_max_failures, cfg.ssh_lockout_s), hub_url)
    acceptor = await gw.start(cfg.ssh_ip, cfg.ssh_port, cfg.state_dir)
    log.info("ssh gateway listening on %s:%d", cfg.ssh_ip, cfg.ssh_port)
    return acceptor


__all__ = ["Backend", "Gateway", "Login", "host_key", "may_reach", "public_host_key", "run", "token_owner"]
