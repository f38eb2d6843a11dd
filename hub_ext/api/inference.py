"""REST API v1 of inference services: ``/inferences`` (list, submit) and
``/inferences/{name}`` (describe, delete), on the gpupool service's ApiHandler (HubOAuth,
scopes, JSON errors). Members see and use their own projects; admins all.

A submission answers once the activator has the service (its first state is on the row),
so that the service's URL and describe are right from the first call; an activator that
does not take it within ``PICKUP_S`` leaves the answer's ``status`` empty.
"""

from __future__ import annotations

import asyncio
import os
import time

from tornado import web

from hub_ext import validation
from hub_ext.api.base import ApiHandler
from hub_ext.attachments import attach
from hub_ext.db.events import add_event
from hub_ext.org import projects as org
from hub_ext.org import roles
from hub_ext.requests.limits import limits_for
from hub_ext.requests.rules import FieldError

from ..serving.db import InferenceRow
from ..serving.spec import parse_spec

SERVE_PREFIX = os.environ.get("GPUPOOL_SERVE_PREFIX", "/services/gpupool-serve/")
PICKUP_S = 10.0  # how long a submission waits for the activator to have the service


def service_dict(row: InferenceRow) -> dict:
    status = dict(row.status or {})
    return {"name": row.name, "owner": row.owner, "project": row.project, "spec": row.spec,
            "created": row.created, "url": f"{SERVE_PREFIX}{row.name}/",
            "ready": status.get("ready", 0), "replicas": status.get("replicas", 0),
            "desired": status.get("desired", 0), "status": status}


class _Base(ApiHandler):
    def _get(self, s, name: str) -> InferenceRow:
        return self.viewable(s, InferenceRow, name, "inference service")


class InferencesHandler(_Base):
    def get(self):
        q = self.visible(InferenceRow, InferenceRow.created, ("project",))
        with self.Session() as s:
            self.send({"items": [service_dict(r) for r in s.scalars(q).all()]})

    async def post(self):
        data = self.body()
        if "owner" in data:
            raise FieldError("owner", "is set by the server (the caller)")
        self.require_submit(data)
        mine = tuple(roles.submit_projects(self.who))
        notes: list[str] = []
        with self.Session() as s:
            spec = parse_spec({**data, "owner": self.username}, mine,
                              limits_for(s, self.ctx.cfg, self.username, projects=mine), notes)
            self.deprecated(notes)
            if s.get(InferenceRow, spec.name) is not None:
                raise org.Conflict("name", f"inference service {spec.name!r} already exists")
            att = attach.check(s, spec.project, spec.credentials, spec.datasources)
            row = InferenceRow(name=spec.name, owner=self.username, project=spec.project,
                               spec=spec.to_dict(), status={})
            s.add(row)
            org_event(s, "submitted", f"{self.username} created inference service {spec.name}",
                      spec.name, spec.project)
            attach.record_use(s, self.username, spec.name, att, "attach")
            s.commit()
            made = service_dict(row)
        self.send(await self._picked_up(spec.name) or made, 201)

    async def _picked_up(self, name: str) -> dict | None:
        """The service once the activator has stored its first state (None past
        ``PICKUP_S``, or when it was deleted meanwhile)."""
        deadline = time.monotonic() + PICKUP_S
        while True:
            with self.Session() as s:
                row = s.get(InferenceRow, name)
                if row is None or row.status:
                    return None if row is None else service_dict(row)
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)


class InferenceHandler(_Base):
    def get(self, name):
        with self.Session() as s:
            self.send(service_dict(self._get(s, name)))

    def delete(self, name):
        with self.Session() as s:
            row = self._get(s, name)
            self.require("manage_workload", project=row.project, owner=row.owner)
            org_event(s, "stopped", f"{self.username} deleted inference service {name}", name,
                      row.project)
            s.delete(row)
            s.commit()
        self.set_status(204)
        self.finish()


class CallersHandler(ApiHandler):
    """``POST /inference-callers`` ``{"token": "..."}``: who holds a JupyterHub token, for an
    activator outside the hub (the chart's: ``serving.auth.HubApiAuth``), which applies the
    rule ``call_inference`` itself. Answers ``{"name", "admin", "projects"}``; ``name`` null
    for a token nobody holds. Only a caller with ``roles.INFERENCE_AUTH_SCOPE`` may ask."""

    def prepare(self):
        if self.current_user is None:
            raise web.HTTPError(401, "authenticate with the activator's service token "
                                "(Authorization: token ...)")
        if roles.INFERENCE_AUTH_SCOPE not in self.scopes:
            raise web.HTTPError(403, f"this needs the {roles.INFERENCE_AUTH_SCOPE} scope "
                                "(the role gpupool-activator)")
        self._prepared = True

    async def post(self):
        data = self.body()
        validation.check_fields(data, {"token"})
        token = data.get("token")
        if not isinstance(token, str) or not token.strip():
            raise FieldError("token", "must be a non-empty string: the caller's JupyterHub token")
        if len(token) > 512 or any(ch.isspace() or not ch.isprintable() for ch in token.strip()):
            raise FieldError("token", "is not a JupyterHub token (printable, no spaces, at most "
                             "512 characters)")
        model = await self.hub_auth.user_for_token(token.strip(), sync=False)
        if not model or model.get("kind", "user") != "user":
            return self.send({"name": None, "admin": False, "projects": []})
        with self.Session() as s:
            projects = org.projects_of(s, model["name"])
        self.send({"name": model["name"], "admin": roles.ADMIN_SCOPE in model.get("scopes", []),
                   "projects": projects})


def org_event(s, kind, message, workload, project) -> None:
    add_event(s, kind, message, workload, project)


def routes(a: str) -> list:
    from tornado.web import url

    return [url(a + "/inference-callers", CallersHandler),
            url(a + "/inferences", InferencesHandler),
            url(a + r"/inferences/([^/]+)", InferenceHandler)]


__all__ = ["CallersHandler", "routes", "service_dict"]
