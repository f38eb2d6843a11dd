"""The one reader of what a request asks for in GPU, CPU and memory, for every kind of
workload: workspaces (``requests.parse_request``), trainings (``training.spec``) and
inference services (``inference.spec``).

One spelling for every kind:

- ``gpu_mode``: ``fraction``, ``memory``, ``whole`` or ``none``. Left out, it is the mode
  of the one GPU field the request gives, else the compute template's, else the kind's;
- ``gpu_fraction``: a share of one GPU, from 0.05 to 1 in steps of 0.05;
- ``gpu_memory_gib``: GiB of one GPU's memory;
- ``gpus``: whole GPUs;
- ``cpu`` and ``memory_gib`` (the kinds that take them).

The older spellings are still read: ``gpu`` (below 1 a fraction, from 1 whole GPUs, 0 no
GPU) and ``gpu_memory`` (a size such as ``20GiB``). Each adds a note to ``deprecated`` (the
REST API answers it in ``Deprecation`` and ``Warning`` headers, and logs it), and a refusal
names the field as the request wrote it.

Each value is, in this order: the kind's built-in default, replaced by the policy's default,
by the compute template's value, by the request's own; then it is held to the policy's max
(hub_ext.org.policy), then to its range: a value beyond both is told the policy's max.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import validation
from ..validation import FieldError

GPU_MODES = ("fraction", "memory", "whole", "none")
MODE_FIELDS = {"fraction": "gpu_fraction", "memory": "gpu_memory_gib", "whole": "gpus"}
FRACTION_MIN, FRACTION_MAX, FRACTION_STEP = 0.05, 1.0, 0.05
GPU_MEMORY_MIN, GPU_MEMORY_STEP = 0.5, 0.1  # GiB; the form's field steps by GPU_MEMORY_STEP
TEMPLATE_FIELDS = ("gpu_mode", "gpu_fraction", "gpu_memory_gib", "gpus", "cpu", "memory_gib")
# The older spellings: old field -> the fields it stands for.
DEPRECATED = {"gpu": ("gpu_mode", "gpu_fraction", "gpus"), "gpu_memory": ("gpu_mode", "gpu_memory_gib")}
_SIZE_RE = re.compile(r"\s*([0-9]{0,12}\.?[0-9]{1,12})\s*(GiB|GB|G|MiB|MB|M)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class KindRules:
    """What differs between kinds: the GPU modes they take, their built-in defaults, whether
    they take CPU and memory, and whether a policy listing templates picks one for them."""

    modes: tuple[str, ...] = GPU_MODES
    mode: str = "fraction"
    defaults: Mapping[str, float] = field(default_factory=lambda: {
        "gpu_fraction": 0.25, "gpus": 1, "cpu": 1, "memory_gib": 4})
    cpu_memory: bool = True
    template_from_policy: bool = True  # a policy listing templates picks its first
    max_gpus: int | None = None  # whole GPUs at most; None: the largest node's (Limits.max_gpus)
    # The older ``gpu`` of services took any fraction: stored services keep theirs.
    any_old_fraction: bool = False


WORKSPACE = KindRules()
TRAINING = KindRules(mode="whole", template_from_policy=False)
# A service's replicas wait for GPUs rather than being refused: its bound is static.
INFERENCE = KindRules(modes=("fraction", "whole"), cpu_memory=False, template_from_policy=False,
                      max_gpus=8, any_old_fraction=True)


@dataclass
class Ask:
    """What a request asks for in GPU, CPU and memory, in the one spelling, and the compute
    template it started from ('' none): the fields every kind's request holds."""

    gpu_mode: str = "fraction"
    gpu_fraction: float = 0.0
    gpu_memory_gib: float = 0.0
    gpus: int = 0
    cpu: float = 1.0
    memory_gib: float = 4.0
    template: str = ""


@dataclass
class Resources(Ask):
    """A request's resources, read; ``names`` maps each field to the one the request wrote."""

    names: dict[str, str] = field(default_factory=dict)

    def name(self, key: str) -> str:
        return self.names.get(key, key)

    @property
    def gpu_field(self) -> str:
        """The field a refusal of the GPU ask names."""
        return self.name(MODE_FIELDS.get(self.gpu_mode, "gpus"))

    @property
    def gpu(self) -> float:
        """The ask as one number: a fraction below 1, whole GPUs from 1, 0 none (trainings'
        and services' stored form)."""
        return {"fraction": self.gpu_fraction, "whole": float(self.gpus)}.get(self.gpu_mode, 0.0)


def one(data: Mapping, key: str, default=None):
    """Form data arrives as lists of strings, JSON as plain values: take one value."""
    v = data.get(key, default)
    if isinstance(v, list):
        v = v[0] if v else default
    if isinstance(v, bytes):
        try:
            v = v.decode()
        except UnicodeDecodeError:
            raise FieldError(key, "must be UTF-8 text") from None
    return v


def given(data: Mapping, key: str) -> bool:
    return one(data, key) not in (None, "")


def gib(raw, key: str = "gpu_memory") -> float:
    """``20GiB``, ``20G``, ``512MiB`` or a number of GiB -> GiB."""
    if isinstance(raw, bool):
        raise FieldError(key, f"must be a size like 20GiB or 512MiB, got {raw!r}")
    if isinstance(raw, (int, float)):
        return validation.number(raw, key, 0, validation.MAX_GPU_MEMORY_GIB, unit=" GiB")
    m = _SIZE_RE.fullmatch(validation.text(raw, key, 32))
    if not m:
        raise FieldError(key, f"must be a size like 20GiB or 512MiB, got {raw!r}")
    value, unit = float(m.group(1)), (m.group(2) or "GiB").lower()
    return value / 1024 if unit.startswith("m") else value


def most_gpus(rules: KindRules, limits) -> int:
    """The most whole GPUs one pod of the kind may ask for."""
    if rules.max_gpus is not None:
        return rules.max_gpus
    return validation.MAX_GPUS if limits is None else limits.max_gpus


def respell(data: Mapping, rules: KindRules, limits, deprecated: list[str] | None) -> tuple[dict, dict[str, str]]:
    """The request in the one spelling, and the field each value came from."""
    old = [k for k in DEPRECATED if k in data]
    if not old:
        return dict(data), {}
    if len(old) > 1:
        raise FieldError("gpu", "give gpu or gpu_memory, not both")
    key = old[0]
    new = [k for k in (*MODE_FIELDS.values(), "gpu_mode") if k in data]
    if new:
        raise FieldError(key, f"give {key} or {', '.join(new)}, not both")
    out = {k: v for k, v in data.items() if k != key}
    raw = one(data, key)
    if key == "gpu_memory":
        out.update(gpu_mode="memory", gpu_memory_gib=gib(raw))
    else:
        lo = 0 if "none" in rules.modes else FRACTION_MIN
        gpu = validation.number(raw, key, lo, max(most_gpus(rules, limits), 1),
                                unit=" GPUs (below 1: a fraction; 1 and up: whole GPUs)")
        if gpu == 0 and "none" in rules.modes:
            out["gpu_mode"] = "none"
        elif gpu < 1:
            out.update(gpu_mode="fraction", gpu_fraction=gpu)
        else:
            if gpu != int(gpu):
                raise FieldError(key, f"from 1 up must be a whole number of GPUs, got {gpu:g}")
            out.update(gpu_mode="whole", gpus=int(gpu))
    if deprecated is not None:
        mode, *fields = DEPRECATED[key]
        deprecated.append(f"{key} is deprecated: write {mode} with {' or '.join(fields)} "
                          f"(docs/reference/requests.md)")
    return out, dict.fromkeys(DEPRECATED[key], key)


@dataclass
class Layered:
    """A request in the one spelling with its compute template's fields filled in; what
    ``resources`` then reads."""

    data: dict
    rules: KindRules
    limits: Any  # hub_ext.requests.Limits, or None where no hub's rules apply
    project: str
    template: str = ""
    names: dict[str, str] = field(default_factory=dict)

    def resources(self, pods: int = 1) -> Resources:
        """Defaults, then the policy's max, then the range: a value beyond both is told the
        policy's max, the narrower bound. ``pods``: workers of a gang, for the policy's max
        on whole GPUs (counted over all of them)."""
        data, rules, limits = self.data, self.rules, self.limits
        pol = limits.policy(self.project) if limits is not None else None
        res = Resources(gpu_mode=rules.mode, template=self.template, names=self.names)

        def default(key):
            d = pol.default(key) if pol is not None else None
            return rules.defaults.get(key) if d is None else d

        def beyond_policy(key, raw, per=1):
            """The policy's refusal of ``raw`` when it is a number over the policy's max:
            told before the range, which is the wider bound."""
            if pol is None or isinstance(raw, bool):
                return
            try:
                value = float(raw)
            except (TypeError, ValueError, OverflowError):
                return
            if math.isfinite(value):
                pol.check_max(res.name(key), key, value * per)

        def number(key, lo, hi, integer=False, unit="", per=1):
            raw = one(data, key, default(key))
            try:
                return validation.number(raw, res.name(key), lo, hi, integer, unit)
            except FieldError:
                beyond_policy(key, raw, per)
                raise

        mode = one(data, "gpu_mode", rules.mode)
        if mode not in rules.modes:
            raise FieldError(res.name("gpu_mode"), f"must be one of {', '.join(rules.modes)}, "
                             f"got {validation.show(mode)}")
        res.gpu_mode = mode
        if mode == "fraction":
            f = number("gpu_fraction", FRACTION_MIN, FRACTION_MAX)
            steps = f / FRACTION_STEP
            if rules.any_old_fraction and res.name("gpu_fraction") == "gpu":
                res.gpu_fraction = f
            elif abs(steps - round(steps)) > 1e-6:
                beyond_policy("gpu_fraction", f)
                raise FieldError(res.name("gpu_fraction"), f"must be a multiple of {FRACTION_STEP:g} "
                                 f"from {FRACTION_MIN:g} to {FRACTION_MAX:g}, got {f:g}")
            else:
                res.gpu_fraction = round(round(steps) * FRACTION_STEP, 2)
        elif mode == "memory":
            most = limits.gpu_memory_max_gib if limits is not None else validation.MAX_GPU_MEMORY_GIB
            res.gpu_memory_gib = number("gpu_memory_gib", GPU_MEMORY_MIN, most, unit=" GiB")
        elif mode == "whole":
            res.gpus = number("gpus", 1, most_gpus(rules, limits), integer=True,
                              unit=" (GPUs of the largest node)", per=pods)
        if rules.cpu_memory:
            hi_cpu, hi_mem = (limits.max_cpu, limits.max_memory_gib) if limits is not None else (1024, 65536)
            res.cpu = number("cpu", 0.1, hi_cpu)
            res.memory_gib = number("memory_gib", 0.25, hi_mem, unit=" GiB")
        if pol is not None:
            gpu = {"fraction": ("gpu_fraction", res.gpu_fraction),
                   "memory": ("gpu_memory_gib", res.gpu_memory_gib),
                   "whole": ("gpus", res.gpus * pods)}.get(mode)
            asked = ([gpu] if gpu else []) + ([("cpu", res.cpu), ("memory_gib", res.memory_gib)]
                                               if rules.cpu_memory else [])
            for key, value in asked:
                pol.check_max(res.name(key), key, value)
        return res


def layer(data: Mapping, rules: KindRules, limits, project: str,
          deprecated: list[str] | None = None) -> Layered:
    """The request respelled (``respell``), its GPU mode taken from the one GPU field it
    gives, and its compute template's fields under its own (``template``)."""
    data, names = respell(data, rules, limits, deprecated)
    if not given(data, "gpu_mode"):
        asked = [m for m, k in MODE_FIELDS.items() if given(data, k)]
        if len(asked) == 1:
            data["gpu_mode"] = asked[0]
    name, filled = template(data, rules, limits, project)
    data = {**filled, **{k: v for k, v in data.items() if k not in filled or given(data, k)}}
    return Layered(data, rules, limits, project, name, names)


def template(data: Mapping, rules: KindRules, limits, project: str) -> tuple[str, dict]:
    """The compute template named (or, for kinds that take one from the policy, the first the
    policy allows when it lists some) and the fields it fills."""
    name = one(data, "template", "") or ""
    if limits is None:
        if name:
            raise FieldError("template", f"must be one of (none), got {validation.show(name)}")
        return "", {}
    pol = limits.policy(project)
    if not name and rules.template_from_policy and pol.allowed("templates") is not None:
        allowed = limits.allowed(project, "templates", limits.templates)
        name = allowed[0] if allowed else ""
        if not name:
            raise FieldError("template", f"{pol.whose('templates')} allows no template here")
    if not name:
        return "", {}
    if name not in limits.templates:
        raise FieldError("template", f"must be one of {', '.join(limits.templates) or '(none)'}, "
                         f"got {validation.show(name)}")
    pol.check_in("template", "templates", name)
    return name, {k: v for k, v in limits.templates[name].items() if k in TEMPLATE_FIELDS}


def read(data: Mapping, rules: KindRules, limits, project: str, deprecated: list[str] | None = None,
         pods: int = 1) -> Resources:
    """``layer`` then ``resources``: a request's resources in one call."""
    return layer(data, rules, limits, project, deprecated).resources(pods)
