"""REST API v1 of the caller: ``/me`` (who, their projects, the SSH gateway) and the
public keys that log them in through the gateway (``/me/ssh-keys``)."""

from __future__ import annotations

from .. import validation
from ..org import projects as org
from ..org import sshkeys
from ..ssh.gateway import public_host_key
from .base import ApiHandler


class MeHandler(ApiHandler):
    def get(self):
        with self.Session() as s:
            projects = org.projects_of(s, self.username)
        cfg = self.ctx.cfg
        self.send({"name": self.username, "admin": self.is_admin, "projects": projects,
                   "ssh_port": cfg.ssh_port, "ssh_host": cfg.ssh_host or self.request.host_name,
                   "ssh_host_key": public_host_key(cfg.state_dir) if cfg.ssh_port else ""})


class MeSshKeysHandler(ApiHandler):
    """The public keys that log the user in through the SSH gateway."""

    def get(self):
        with self.Session() as s:
            self.send({"keys": sshkeys.keys_of(s, self.username)})

    def put(self):
        data = self.body()
        validation.check_fields(data, {"keys"})
        keys = validation.ssh_keys(data.get("keys"), "keys")
        with self.Session() as s:
            sshkeys.set_keys(s, self.username, keys)
            s.commit()
        self.send({"keys": keys})


__all__ = ["MeHandler", "MeSshKeysHandler"]
