"""What a user asks for (a workload request) and the one set of rules that checks it.

The spawn form, the REST API and the CLI all go through ``parse_request``; every bad
value raises ``FieldError`` naming the field and the allowed range.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from scheduler.model import MILLI, Kind, PodDemand

KINDS = ("workspace", "training", "inference")
WORKSPACE_KINDS = {"jupyterlab": "JupyterLab", "vscode": "VS Code"}
GPU_MODES = ("fraction", "memory", "whole", "none")
FRACTION_MIN, FRACTION_MAX, FRACTION_STEP = 0.05, 1.0, 0.05
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class FieldError(ValueError):
    """A bad value in a request; ``field`` names it, the message says what is allowed."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What the rules check against: the user's projects and the cluster's shape."""

    projects: tuple[str, ...]
    max_gpus: int = 1  # whole GPUs on the largest node
    gpu_memory_gib: float = 80.0  # largest GPU
    max_cpu: float = 16.0
    max_memory_gib: float = 128.0
    environments: tuple[str, ...] = ("default",)
    vscode: bool = False


@dataclass
class WorkloadRequest:
    project: str
    kind: str = "workspace"
    workspace_kind: str = "jupyterlab"
    gpu_mode: str = "fraction"
    gpu_fraction: float = 0.25
    gpu_memory_gib: float = 0.0
    gpus: int = 0
    cpu: float = 1.0
    memory_gib: float = 4.0
    environment: str = "default"
    preemptible: bool = False
    name: str = ""
    command: list[str] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)  # the project's, by name (attach.py)
    datasources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def demand(self) -> PodDemand:
        cpu, mem = round(self.cpu * 1000), round(self.memory_gib * 1024)
        if self.gpu_mode == "fraction":
            if round(self.gpu_fraction * MILLI) >= MILLI:
                return PodDemand(gpus=1, cpu_milli=cpu, memory_mib=mem)
            return PodDemand(gpu_fraction=self.gpu_fraction, cpu_milli=cpu, memory_mib=mem)
        if self.gpu_mode == "memory":
            return PodDemand(
                gpu_memory_mib=round(self.gpu_memory_gib * 1024), cpu_milli=cpu, memory_mib=mem
            )
        if self.gpu_mode == "whole":
            return PodDemand(gpus=self.gpus, cpu_milli=cpu, memory_mib=mem)
        return PodDemand(cpu_milli=cpu, memory_mib=mem)

    def gpu_label(self) -> str:
        return {
            "fraction": f"{self.gpu_fraction:g} GPU",
            "memory": f"{self.gpu_memory_gib:g} GiB of GPU memory",
            "whole": f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}",
            "none": "no GPU",
        }[self.gpu_mode]

    @property
    def kind_enum(self) -> Kind:
        return Kind(self.kind)


def _one(data: dict, key: str, default=None):
    """Form data arrives as lists of strings, JSON as plain values: take one value."""
    v = data.get(key, default)
    if isinstance(v, list):
        v = v[0] if v else default
    if isinstance(v, bytes):
        v = v.decode()
    return v


def check_fields(data, known: set[str]) -> None:
    """A request body must be a JSON object naming only ``known`` fields."""
    if not isinstance(data, dict):
        raise FieldError("body", "must be a JSON object")
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(known))}")


def check_name(name) -> str:
    """Workload and service names: DNS labels, so they work as pod and URL names too."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise FieldError("name", "must be 1-63 lowercase letters, digits or '-', starting and "
                         f"ending with a letter or digit, got {name!r}")
    return name


def check_number(raw, key: str, lo: float, hi: float, integer: bool = False, unit: str = ""):
    """The one rule for numeric fields everywhere (forms, REST, CLI, trainings, inference
    services): a finite number from ``lo`` to ``hi``, whole when ``integer``."""
    rng = f"from {lo:g} to {hi:g}{unit}"
    if isinstance(raw, bool) or raw is None:
        raise FieldError(key, f"must be a number {rng}, got {raw!r}")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise FieldError(key, f"must be a number {rng}, got {raw!r}") from None
    if not math.isfinite(v) or v < lo - 1e-9 or v > hi + 1e-9:
        raise FieldError(key, f"must be {rng}, got {raw!r}")
    if integer:
        if v != int(v):
            raise FieldError(key, f"must be a whole number {rng}, got {raw!r}")
        return int(v)
    return v


def check_names(raw, key: str, most: int = 16) -> list[str]:
    """A list of names (credentials, data sources): JSON list, form list or 'a,b'."""
    if raw in (None, ""):
        return []
    if isinstance(raw, str):
        raw = [n.strip() for n in raw.split(",") if n.strip()]
    if not isinstance(raw, (list, tuple)) or not all(isinstance(n, str) for n in raw):
        raise FieldError(key, f"must be a list of names, got {raw!r}")
    raw = [n.decode() if isinstance(n, bytes) else n for n in raw]
    bad = [n for n in raw if not NAME_RE.match(n)]
    if bad:
        raise FieldError(key, f"{bad[0]!r} is not a name (lowercase letters, digits, '-')")
    if len(set(raw)) != len(raw):
        raise FieldError(key, "names a credential or data source twice")
    if len(raw) > most:
        raise FieldError(key, f"must name at most {most}, got {len(raw)}")
    return list(raw)


def _number(data, key, default, lo, hi, integer=False, unit=""):
    return check_number(_one(data, key, default), key, lo, hi, integer, unit)


def _choice(data, key, default, allowed, what=""):
    v = _one(data, key, default)
    if v not in allowed:
        names = ", ".join(allowed) if allowed else "(none)"
        raise FieldError(key, f"must be one of {names}{what}, got {v!r}")
    return v


def _bool(data, key, default=False):
    v = _one(data, key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "on", "yes"):
        return True
    if v in (None, "", 0) or (isinstance(v, str) and v.lower() in ("0", "false", "off", "no")):
        return False
    raise FieldError(key, f"must be true or false, got {v!r}")


def parse_request(data: dict, limits: Limits) -> WorkloadRequest:
    """Check a request (form data or JSON) and return it typed; raise FieldError on the
    first bad field."""
    if not isinstance(data, dict):
        raise FieldError("body", "must be a JSON object")
    known = set(WorkloadRequest.__dataclass_fields__)
    unknown = sorted(k for k in data if k not in known and not k.startswith("_"))
    if unknown:
        raise FieldError(unknown[0], f"unknown field; allowed: {', '.join(sorted(known))}")
    if not limits.projects:
        raise FieldError("project", "you are not a member of any project; ask an admin")
    project = _choice(data, "project", limits.projects[0], limits.projects, " (your projects)")
    kind = _choice(data, "kind", "workspace", KINDS)
    ws_allowed = tuple(k for k in WORKSPACE_KINDS if k != "vscode" or limits.vscode)
    workspace_kind = _choice(data, "workspace_kind", "jupyterlab", ws_allowed)
    mode = _choice(data, "gpu_mode", "fraction", GPU_MODES)
    req = WorkloadRequest(project=project, kind=kind, workspace_kind=workspace_kind, gpu_mode=mode)
    if mode == "fraction":
        f = _number(data, "gpu_fraction", 0.25, FRACTION_MIN, FRACTION_MAX)
        steps = f / FRACTION_STEP
        if abs(steps - round(steps)) > 1e-6:
            raise FieldError(
                "gpu_fraction", f"must be a multiple of {FRACTION_STEP:g} from "
                f"{FRACTION_MIN:g} to {FRACTION_MAX:g}, got {f:g}",
            )
        req.gpu_fraction = round(round(steps) * FRACTION_STEP, 2)
    elif mode == "memory":
        req.gpu_memory_gib = _number(
            data, "gpu_memory_gib", None, 0.5, limits.gpu_memory_gib, unit=" GiB"
        )
    elif mode == "whole":
        req.gpus = _number(data, "gpus", 1, 1, limits.max_gpus, integer=True)
    req.cpu = _number(data, "cpu", 1, 0.1, limits.max_cpu)
    req.memory_gib = _number(data, "memory_gib", 4, 0.25, limits.max_memory_gib, unit=" GiB")
    req.environment = _choice(data, "environment", limits.environments[0], limits.environments)
    req.preemptible = _bool(data, "preemptible", kind == "training")
    if kind == "inference" and req.preemptible:
        raise FieldError("preemptible", "inference workloads are never preemptible")
    name = _one(data, "name", "") or ""
    if name and not NAME_RE.match(str(name)):
        raise FieldError("name", "must be 1-63 lowercase letters, digits or '-', "
                         "starting and ending with a letter or digit")
    req.name = str(name)
    command = data.get("command", [])
    if isinstance(command, str):
        command = command.split()
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise FieldError("command", "must be a list of strings")
    if kind != "workspace" and not command:
        raise FieldError("command", f"a {kind} needs a command to run")
    req.command = command
    req.credentials = check_names(data.get("credentials"), "credentials")
    req.datasources = check_names(data.get("datasources"), "datasources")
    return req


def workload_name(user: str, server: str = "") -> str:
    """The scheduler's name for a user's (named) server."""
    base = f"ws-{user}" + (f"-{server}" if server else "")
    return re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:63]
