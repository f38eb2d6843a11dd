"""Base handlers of the gpupool service: HubOAuth login, scopes, JSON errors.

Errors map to HTTP: FieldError -> 400, NotFound -> 404, Conflict -> 409, a missing
scope -> 403, a row another process removed while the request changed it -> 404, a method
the path does not take -> 405 (with ``Allow``), a body over ``max_body_size`` -> 413; every
error body is ``{"error": {"status", "field", "message"}}``.
"""

from __future__ import annotations

import asyncio
import json

from jupyterhub.services.auth import HubOAuthenticated
from sqlalchemy import select
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError
from tornado import web
from tornado.log import app_log

from .. import validation
from ..org import roles
from ..org.projects import Conflict, NotFound
from ..validation import FieldError

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
        """The caller for hub_ext.org.roles (memberships and role assignments), once per request."""
        if getattr(self, "_who", None) is None:
            with self.Session() as s:
                self._who = roles.who_for(s, self.current_user)
        return self._who

    def require(self, action: str, project: str | None = None, department: str | None = None,
                owner: str | None = None) -> None:
        """403 with the rule's reason unless hub_ext.org.roles allows ``action``. A project or
        department straight from a body may be any JSON value: one that is not a string names
        none (the request rules' 400 says so after this check)."""
        def text(v):
            return v if isinstance(v, str) or v is None else None

        roles.check(self.who, action, text(project), text(department), text(owner))

    def require_project(self, action: str, project: str, owner: str | None = None) -> None:
        """404 when ``project`` does not exist (names are not secret, contents are), else
        ``require``."""
        if project not in self.who.departments:
            raise NotFound(f"project {project!r} does not exist")
        self.require(action, project=project, owner=owner)

    def submitter(self, data: dict) -> tuple[str, tuple[str, ...] | None]:
        """Whom a submission is for (``owner``, the caller by default; another user needs
        ``submit_for_others``), once it may be submitted, and the projects the caller may
        submit to when it is for the caller (None: the owner's own rules apply)."""
        owner = validation.name(data.pop("owner", self.username), "owner", "user")
        if owner != self.username:
            self.require("submit_for_others", project=data.get("project"))
        self.require_submit(data)
        return owner, (tuple(roles.submit_projects(self.who)) if owner == self.username else None)

    def require_submit(self, data: dict) -> None:
        """``submit`` on the body's project when it names an existing one (an unknown or
        missing project is the request rules' 400, naming the field)."""
        project = data.get("project")
        if isinstance(project, str) and project in self.who.departments:
            self.require("submit", project=project)

    def require_admin(self) -> None:
        self.require("administer_platform")

    def visible(self, model, order, filters: tuple[str, ...] = ()):
        """A query of ``model``'s rows (a table with a ``project`` column) in ``order``: those
        whose column equals each query argument in ``filters`` that is given, in the projects
        the caller may view."""
        q = select(model).order_by(order)
        for key in filters:
            v = self.get_argument(key, None)
            if v:
                q = q.where(getattr(model, key) == v)
        seen = roles.visible_projects(self.who)
        return q if seen is None else q.where(model.project.in_(seen))

    def viewable(self, s, model, name: str, what: str):
        """The row ``name`` of ``model`` (a table with a ``project`` column) that the caller
        may view: 404 naming ``what`` when there is none, else ``require("view")``."""
        row = s.get(model, name)
        if row is None:
            raise NotFound(f"{what} {name!r} does not exist")
        self.require("view", project=row.project)
        return row


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@web.stream_request_body  # the body arrives in data_received: one too big is never held
class ApiHandler(BaseHandler):
    """JSON in, JSON out; 401 instead of a login redirect."""

    _size = 0  # body bytes received
    _chunks: list[bytes] | None = None
    # Whether prepare() went through: only then does tornado read the body (streamed). An
    # answer before that (401, 403, 405 for a method tornado does not know) leaves the body
    # unread, and tornado closes the connection after it: "Connection: close" tells the
    # hub's proxy not to send another user's request down that connection (a 503).
    _prepared = False

    def prepare(self):
        if self.current_user is None:
            raise web.HTTPError(401, "authenticate with a JupyterHub token (Authorization: token ...)")
        if not (self.scopes & roles.USER_SCOPES):
            raise web.HTTPError(403, f"this needs the {USE} scope")
        self._prepared = True

    @property
    def max_body_size(self) -> int:
        return self.settings.get("max_body_size") or validation.MAX_BODY_BYTES

    def data_received(self, chunk: bytes) -> None:
        # Past max_body_size the rest is read and dropped, not held, so that the client
        # (and the hub's proxy in between) gets the 413 instead of a reset connection.
        # The HTTPServer's own limit (app.py) closes the connection on a far bigger one.
        self._size += len(chunk)
        if self._size > self.max_body_size:
            self._chunks = None
        elif self._chunks is None:
            self._chunks = [chunk]
        else:
            self._chunks.append(chunk)

    def body(self) -> dict:
        """The request's JSON object (validation.json_body); 413 over max_body_size."""
        if self._size > self.max_body_size:
            raise web.HTTPError(413, f"the body must be at most {self.max_body_size} bytes, "
                                f"got {self._size}")
        raw = b"".join(self._chunks or ())
        if not raw:
            return {}
        return validation.json_body(raw, self.max_body_size)

    async def off_loop(self, fn, *args):
        """Run ``fn`` (database work that may be large: a project's member list) in a thread,
        so other users' requests are answered meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def deprecated(self, notes: list[str]) -> None:
        """Answer the older spellings a request used (hub_ext.requests.reader): a
        ``Deprecation: true`` header, a ``Warning: 299`` header per note, and a log line."""
        if not notes:
            return
        self.set_header("Deprecation", "true")
        for note in notes:
            self.add_header("Warning", f'299 gpupool "{note}"')
        app_log.warning("%s %s: %s", self.request.method, self.request.path, "; ".join(notes))

    def send(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def _allowed(self) -> list[str]:
        base = web.RequestHandler
        return [m for m in _METHODS if getattr(type(self), m.lower()) is not getattr(base, m.lower())]

    def _handle_request_exception(self, e):
        if isinstance(e, FieldError):
            return self.send_error(400, field=e.field, message=e.message)
        if isinstance(e, Conflict):
            return self.send_error(409, field=e.field, message=e.message)
        if isinstance(e, NotFound):
            return self.send_error(404, message=str(e))
        if isinstance(e, roles.Forbidden):
            return self.send_error(403, message=e.reason)
        if isinstance(e, (StaleDataError, ObjectDeletedError)):
            # No row has a version counter, so a write that matched no row means the row was
            # deleted meanwhile (the job runner removes a training it was asked to delete).
            return self.send_error(404, message="it was removed by another request while this "
                                   "one changed it; this request changed nothing")
        return super()._handle_request_exception(e)

    def write_error(self, status_code, **kwargs):
        message = kwargs.get("message")
        exc = kwargs.get("exc_info")
        if status_code == 405:
            self.set_header("Allow", ", ".join(self._allowed()))
            message = message or f"{self.request.method} is not allowed here; allowed: {', '.join(self._allowed())}"
        if status_code == 413:
            kwargs.setdefault("field", "body")
        if message is None and exc and isinstance(exc[1], web.HTTPError):
            message = exc[1].log_message or self._reason
        elif message is None and exc:  # tornado has logged the traceback (log_exception)
            message = "internal error; see the service log"
        if not self._prepared:
            self.set_header("Connection", "close")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {
            "status": status_code, "field": kwargs.get("field"), "message": message or self._reason,
        }}))
