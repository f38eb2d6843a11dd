"""Your SSH keys: the public keys that log you in through the SSH gateway (saved with
``PUT /me/ssh-keys``, which checks them)."""

from __future__ import annotations

from tornado import web

from ...org import sshkeys
from .base import PageHandler


class SshKeysPage(PageHandler):
    @web.authenticated
    def get(self):
        with self.Session() as s:
            keys = sshkeys.keys_of(s, self.username)
        cfg = self.ctx.cfg
        self.render_page("sshkeys.html", keys=keys, ssh_port=cfg.ssh_port,
                         ssh_host=cfg.ssh_host or self.request.host_name)


def routes(prefix):
    return [(prefix + r"/ssh-keys", SshKeysPage)]
