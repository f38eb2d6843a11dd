"""What every admin panel page shares: the template environment, the navigation and
``PageHandler``."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from tornado import web

from ... import roles
from ..base import BaseHandler

_env = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent.parent / "templates")),
    autoescape=select_autoescape(["html"]),
)
NAV = [("", "Overview"), ("org", "Organisation"), ("nodes", "Nodes & GPUs"),
       ("queue", "Queue"), ("events", "Events"), ("credentials", "Credentials & data"),
       ("audit", "Audit"), ("usage", "Usage")]


class PageHandler(BaseHandler):
    def render_page(self, template: str, **ctx) -> None:
        prefix = self.settings["prefix"]
        html = _env.get_template(template).render(
            prefix=prefix, nav=NAV, user=self.username, admin=self.is_admin,
            role_label="department admin" if self.who.admin_of else "",
            xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
            hub_prefix=self.settings.get("hub_prefix", "/hub/"), **ctx,
        )
        self.finish(html)

    def prepare(self):
        if self.current_user is not None and not (self.scopes & set(roles.SCOPES)):
            raise web.HTTPError(403, "you need the custom:gpupool:use scope")
