"""Base handlers of the gpupool service: HubOAuth login, scopes, JSON errors.

Errors map to HTTP: FieldError -> 400, NotFound -> 404, Conflict -> 409, a missing
scope -> 403; every error body is ``{"error": {"status", "field", "message"}}``.
"""

from __future__ import annotations

import asyncio
import json

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from .. import roles
from ..org import Conflict, NotFound
from ..requests import FieldError

ADMIN, USE = roles.ADMIN_SCOPE, roles.USE_SCOPE


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    def get_current_user(self):
        # Test seam: an app made with ``user_for_tests`` skips the hub (benches, unit tests).
        fixed = self.settings.get("user_for_tests")
        return fixed if fixed is not None else super().get_current_user()

    @property
    def ctx(self):
        return self.settings["gpupool"]

    @property
    def Session(self):
        return self.ctx.Session

    @property
    def scopes(self) -> set[str]:
        user = self.current_user or {}
        return set(user.get("scopes", []))

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.scopes

    @property
    def username(self) -> str:
        return (self.current_user or {}).get("name", "")

    @property
    def who(self) -> roles.Who:
        """The caller for hub_ext.roles (memberships and role assignments), once per request."""
        if getattr(self, "_who", None) is None:
            with self.Session() as s:
                self._who = roles.who_for(s, self.current_user)
        return self._who

    def require(self, action: str, project: str | None = None, department: str | None = None,
                owner: str | None = None) -> None:
        """403 with the rule's reason unless hub_ext.roles allows ``action``."""
        roles.check(self.who, action, project, department, owner)

    def require_project(self, action: str, project: str, owner: str | None = None) -> None:
        """404 when ``project`` does not exist (names are not secret, contents are), else
        ``require``."""
        if project not in self.who.departments:
            raise NotFound(f"project {project!r} does not exist")
        self.require(action, project=project, owner=owner)

    def require_submit(self, data: dict) -> None:
        """``submit`` on the body's project when it names an existing one (an unknown or
        missing project is the request rules' 400, naming the field)."""
        project = data.get("project")
        if isinstance(project, str) and project in self.who.departments:
            self.require("submit", project=project)

    def require_admin(self) -> None:
        self.require("administer_platform")


class ApiHandler(BaseHandler):
    """JSON in, JSON out; 401 instead of a login redirect."""

    def prepare(self):
        if self.current_user is None:
            raise web.HTTPError(401, "authenticate with a JupyterHub token (Authorization: token ...)")
        if not (self.scopes & set(roles.SCOPES)):
            raise web.HTTPError(403, f"this needs the {USE} scope")

    def body(self) -> dict:
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except ValueError as e:
            raise FieldError("body", f"must be JSON: {e}") from None
        if not isinstance(data, dict):
            raise FieldError("body", "must be a JSON object")
        return data

    async def off_loop(self, fn, *args):
        """Run ``fn`` (database work that may be large: a project's member list) in a thread,
        so other users' requests are answered meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def send(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def _handle_request_exception(self, e):
        if isinstance(e, FieldError):
            return self.send_error(400, field=e.field, message=e.message)
        if isinstance(e, Conflict):
            return self.send_error(409, field=e.field, message=e.message)
        if isinstance(e, NotFound):
            return self.send_error(404, message=str(e))
        if isinstance(e, roles.Forbidden):
            return self.send_error(403, message=e.reason)
        return super()._handle_request_exception(e)

    def write_error(self, status_code, **kwargs):
        message = kwargs.get("message")
        exc = kwargs.get("exc_info")
        if message is None and exc and isinstance(exc[1], web.HTTPError):
            message = exc[1].log_message or self._reason
        elif message is None and exc:  # tornado has logged the traceback (log_exception)
            message = "internal error; see the service log"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {
            "status": status_code, "field": kwargs.get("field"), "message": message or self._reason,
        }}))
