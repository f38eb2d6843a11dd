"""REST API v1: the route table of every resource (one module each in this folder,
beside their shared handler ``base``), the API's root and its OpenAPI description.

Reads: members see their own projects and the workloads in them; admins see everything.
Writes to the organisation need ``custom:gpupool:admin``. Workspaces are JupyterHub
servers, so starting or stopping one goes through the hub's API.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from . import governance as governance_api
from . import inference as inference_api
from . import policies as policy_api
from . import roles as roles_api
from . import trainings as training_api
from . import usage as usage_api
from .base import ApiHandler
from .events import EventsHandler, SamplesHandler
from .me import MeHandler, MeSshKeysHandler
from .nodes import CapacityHandler, NodesHandler
from .organisation import DepartmentHandler, DepartmentsHandler, ProjectHandler, ProjectsHandler
from .workloads import WorkloadHandler, WorkloadLogsHandler, WorkloadsHandler

SPEC = Path(__file__).parent / "openapi.yaml"


class RootHandler(ApiHandler):
    def get(self):
        self.send({"version": "v1", "openapi": self.reverse_url("openapi")})


class OpenAPIHandler(ApiHandler):
    def prepare(self):  # the description is public
        pass

    def get(self):
        self.send(yaml.safe_load(SPEC.read_text()))


def routes(prefix: str) -> list:
    from tornado.web import url

    a = prefix + "api/v1"
    n = r"([a-z0-9-]+|[^/]+)"
    return [
        url(a + "/?", RootHandler),
        url(a + "/openapi.json", OpenAPIHandler, name="openapi"),
        url(a + "/me", MeHandler),
        url(a + "/me/ssh-keys", MeSshKeysHandler),
        url(a + "/departments", DepartmentsHandler),
        *policy_api.routes(a),
        url(a + f"/departments/{n}", DepartmentHandler),
        url(a + "/projects", ProjectsHandler),
        url(a + f"/projects/{n}", ProjectHandler),
        url(a + "/workloads", WorkloadsHandler),
        url(a + f"/workloads/{n}", WorkloadHandler),
        url(a + f"/workloads/{n}/logs", WorkloadLogsHandler),
        url(a + "/nodes", NodesHandler),
        url(a + "/capacity", CapacityHandler),
        url(a + "/events", EventsHandler),
        url(a + "/samples", SamplesHandler),
        *training_api.routes(a),
        *roles_api.routes(a),
        *usage_api.routes(a),
        *governance_api.routes(a),
        *inference_api.routes(a),
    ]


__all__ = ["routes"]
