"""What every admin panel page shares: the template environment, the navigation and
``PageHandler``."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from tornado import web

from ... import humanize
from ...api.base import BaseHandler
from ...org import projects as org
from ...org import roles

_env = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent.parent / "templates")),
    autoescape=select_autoescape(["html"]),
)
_env.filters.update(humanize.FILTERS)
NAV = [("", "Overview"), ("org", "Organisation"), ("policies", "Policies"), ("nodes", "Nodes & GPUs"),
       ("queue", "Queue"), ("events", "Events"), ("credentials", "Credentials & data"),
       ("audit", "Audit"), ("usage", "Usage"), ("ssh-keys", "SSH keys")]
# Pages only some roles may open, and the role each needs (said on their 403 page too).
NEEDS = {"audit": f"a department admin or a platform admin ({roles.ADMIN_SCOPE})",
         "usage": f"a platform admin ({roles.ADMIN_SCOPE})"}


class PageHandler(BaseHandler):
    def visible_org(self, s) -> tuple[list[dict], list[dict]]:
        """The departments and the projects the caller may see (org.projects' dicts)."""
        seen = roles.visible_departments(self.who)
        projects = org.list_projects(s, roles.visible_projects(self.who))
        return [d for d in org.list_departments(s) if seen is None or d["name"] in seen], projects

    def _may_open(self, path: str) -> bool:
        if path == "usage":
            return self.is_admin
        if path == "audit":
            return self.is_admin or bool(self.who.admin_of)
        return True

    def render_page(self, template: str, **ctx) -> None:
        prefix = self.settings["prefix"]
        nav = [(p, label) for p, label in NAV if self._may_open(p)] if self.current_user else []
        html = _env.get_template(template).render(
            prefix=prefix, nav=nav, user=self.username, admin=self.is_admin,
            role_label="department admin" if self.who.admin_of else "",
            xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
            hub_prefix=self.settings.get("hub_prefix", "/hub/"), **ctx,
        )
        self.finish(html)

    def write_error(self, status_code: int, **kwargs) -> None:
        """An error page in the panel's frame that says why, and for a 403 which role the
        page needs, instead of tornado's bare "403: Forbidden"."""
        err = kwargs.get("exc_info", (None, None, None))[1]
        why = (err.log_message or "") if isinstance(err, web.HTTPError) else ""
        page = self.request.path.rstrip("/").rsplit("/", 1)[-1]
        try:
            self.render_page("error.html", status=status_code, why=why,
                             needs=NEEDS.get(page, "") if status_code == 403 else "",
                             reason=self._reason)
        except Exception:  # the frame itself failed (no database): tornado's plain page
            super().write_error(status_code, **kwargs)

    def prepare(self):
        if self.current_user is not None and not (self.scopes & roles.USER_SCOPES):
            raise web.HTTPError(403, "you need the custom:gpupool:use scope")
