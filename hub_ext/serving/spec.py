"""An inference service as a user describes it, and the one set of rules that checks it.

The CLI, the REST API and the tests all go through ``parse_spec``; a bad value raises
``FieldError`` (the hub's, so the service answers 400) naming the field and the allowed
range. Nothing is clamped silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hub_ext import validation
from hub_ext.requests import reader as request_reader
from hub_ext.requests.rules import FieldError, check_fields, check_name, check_names, check_number
from scheduler.model import PodDemand

METRICS = ("concurrency", "throughput")


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    project: str
    command: tuple[str, ...]
    gpu: float = 0.25  # < 1: a fraction of one GPU; >= 1: whole GPUs
    min_replicas: int = 0
    max_replicas: int = 4
    metric: str = "concurrency"  # concurrency: in-flight requests; throughput: requests/s
    target: float = 10.0  # per replica
    scale_to_zero_after_s: float = 300.0
    stable_window_s: float = 60.0
    panic_window_pct: float = 10.0
    panic_threshold_pct: float = 200.0
    port: int = 8000  # where the server listens in a pod; embedded: {socket} or $PORT (backends/embedded.py)
    ready_path: str = "/"
    queue_limit: int = 1000  # requests held while no replica is ready
    request_timeout_s: float = 120.0  # longest a request is held waiting for a replica
    max_body_bytes: int = 10 * 1024 * 1024
    public: bool = False  # True: no JupyterHub token needed
    owner: str = ""
    image: str = ""  # Kubernetes backend only
    env: dict = field(default_factory=dict)
    credentials: tuple[str, ...] = ()  # the project's, by name (hub_ext/attach.py)
    datasources: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["command"] = list(self.command)
        d["credentials"], d["datasources"] = list(self.credentials), list(self.datasources)
        return d

    def demand(self) -> PodDemand:
        if self.gpu >= 1:
            return PodDemand(gpus=int(self.gpu))
        return PodDemand(gpu_fraction=self.gpu)


# What a request may hold besides the spec's fields: the one spelling of the GPU ask
# (request_reader) and a compute template. ``gpu`` is the spec's own field and the older
# spelling of the ask.
REQUEST_FIELDS = {"gpu_mode", "gpu_fraction", "gpus", "template"}
# field -> (default, lo, hi, integer, unit)
_NUMBERS = {
    "min_replicas": (0, 0, 100, True, ""),
    "max_replicas": (4, 1, 100, True, ""),
    "target": (10.0, 0.01, 100_000, False, " per replica"),
    "scale_to_zero_after_s": (300.0, 0, 86_400, False, " s"),
    "stable_window_s": (60.0, 0.1, 3600, False, " s"),
    "panic_window_pct": (10.0, 1, 100, False, " % of the stable window"),
    "panic_threshold_pct": (200.0, 110, 1000, False, " % of the target"),
    "port": (8000, 1, 65535, True, ""),
    "queue_limit": (1000, 1, 100_000, True, " requests"),
    "request_timeout_s": (120.0, 0.1, 3600, False, " s"),
    "max_body_bytes": (10 * 1024 * 1024, 1, 1 << 30, True, " bytes"),
}


def _number(data: dict, key: str):
    default, lo, hi, integer, unit = _NUMBERS[key]
    return check_number(data.get(key, default), key, lo, hi, integer, unit)


def parse_spec(data: dict, projects: tuple[str, ...] | None = None, limits=None,
               deprecated: list[str] | None = None) -> ServiceSpec:
    """Check a service description (JSON) and return it typed. ``projects``: the ones
    the caller may use (None: any). The GPU per replica is read by request_reader, under
    the hub's ``limits`` (hub_ext.requests.Limits: templates, policy) where given; an older
    spelling adds a note to ``deprecated``."""
    check_fields(data, set(ServiceSpec.__dataclass_fields__) | REQUEST_FIELDS)
    name = check_name(data.get("name"))
    project = data.get("project")
    if not validation.is_name(project):
        raise FieldError("project", f"must name a project ({validation.PATTERNS['name'][1]}), "
                         f"got {validation.show(project)}")
    if projects is not None and project not in projects:
        mine = ", ".join(projects) or "(none)"
        raise FieldError("project", f"must be one of your projects ({mine}), got {project!r}")
    command = validation.command(data.get("command"))
    if not all(command):
        raise FieldError("command", "must be a non-empty list of non-empty strings (the model server)")
    nums = {"gpu": request_reader.read(data, request_reader.INFERENCE, limits, project, deprecated).gpu,
            **{k: _number(data, k) for k in _NUMBERS}}
    if nums["min_replicas"] > nums["max_replicas"]:
        raise FieldError("min_replicas", f"must be <= max_replicas ({nums['max_replicas']}), "
                         f"got {nums['min_replicas']}")
    metric = data.get("metric", "concurrency")
    if metric not in METRICS:
        raise FieldError("metric", f"must be one of {', '.join(METRICS)}, got {validation.show(metric)}")
    ready_path = validation.text(data.get("ready_path", "/"), "ready_path", validation.MAX_TEXT)
    if not ready_path.startswith("/"):
        raise FieldError("ready_path", f"must be a path starting with '/', got {validation.show(ready_path)}")
    public = data.get("public", False)
    if not isinstance(public, bool):
        raise FieldError("public", f"must be true or false, got {validation.show(public)}")
    env = validation.env(data.get("env", {}))
    if data.get("owner", ""):
        validation.name(data["owner"], "owner", "user")
    validation.text(data.get("owner", ""), "owner", 255)
    validation.text(data.get("image", ""), "image", validation.MAX_IMAGE_CHARS)
    attached = {k: tuple(check_names(data.get(k), k)) for k in ("credentials", "datasources")}
    return ServiceSpec(name=name, project=project, command=tuple(command), metric=metric,
                       ready_path=ready_path, public=public, env=dict(env), **attached,
                       owner=data.get("owner", ""), image=data.get("image", ""), **nums)


__all__ = ["METRICS", "FieldError", "ServiceSpec", "parse_spec"]
