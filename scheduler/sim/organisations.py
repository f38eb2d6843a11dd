"""The ``organisations`` scenario class: whole organisations drawn from a seed, to replay the
rules on organisations nobody tuned them for.

A scenario file of this class says ``generator: organisations`` and has an
``organisation`` section of ranges to draw from (every key optional)::

    generator: organisations
    seed: 1                          # draws the organisation, and salts the pod hash
    organisation:
      days: 7                        # the arrival window in replay days, from Monday 00:00 UTC
      departments: [2, 4]            # drawn, each in one time zone
      zones: [1, 3]                  # distinct time zones among the departments
      projects_per_department: [1, 4]
      patterns: {office: 3, crunch: 2, classes: 1, nights: 1, always-on: 1}  # draw weights
      team_size: [2, 24]             # people (the submission rate), log-uniform
      quota_factor: [0.3, 3.0]       # quota against the project's size, log-uniform
      weight: [1, 3]                 # over-quota weight, a whole number
      limit_chance: 0.2              # share of projects with a limit (1.5-3x their quota)
      workspaces_borrow: 0.5         # chance that the organisation's workspaces may borrow
      node_fraction: [0.015, 0.03]   # the cluster: this share of the trace's nodes
      pod_share: [0.2, 0.4]          # the share of the trace's pods replayed, a window drawn
      off_hours: 0.03                # the rate outside a project's hours, against its own
      cull_idle_s: 3600              # a workspace stops this long after its hours end

What a project does is its *pattern*, by its department's local clock:
  office     weekdays 9-18;
  crunch     office hours, with one to two crunches (two to four times the rate, weekends
             too) of one to three days each, drawn anywhere in the window;
  classes    a course: weekday class blocks (10-12 and 14-16 by default drawn per project),
             nearly all workspaces, which the culler stops after the class;
  nights     training at night (19-7) and at weekends;
  always-on  serving: the same rate at every hour, mostly inference.
Each pattern draws its mix of kinds (workspace, training, inference) around its own centre,
and every pod goes to a kind by a stable hash against its project's mix; the pod's size and
service time are the trace's. The trace's pods keep their order; their arrival times are
spread over the window in proportion to the projects' total rate, and each goes to a project
by a stable hash against the rates at its arrival (as ``timezones`` does).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field

import numpy as np

from ..model import Kind, ValidationError
from .timezones import DAY_S, STEP_S, ZONES, _number, _range

PATTERNS = ("office", "crunch", "classes", "nights", "always-on")
# Each pattern's centre of the kind mix: (workspace, training, inference).
MIX = {
    "office": (0.5, 0.45, 0.05),
    "crunch": (0.3, 0.65, 0.05),
    "classes": (0.9, 0.1, 0.0),
    "nights": (0.1, 0.85, 0.05),
    "always-on": (0.05, 0.15, 0.8),
}
KINDS = (Kind.WORKSPACE, Kind.TRAINING, Kind.INFERENCE)
DEPARTMENTS = (
    "physics", "biology", "medicine", "engineering", "economics", "linguistics", "chemistry", "design",
)  # fmt: skip
PROJECTS = (
    "lab-a", "lab-b", "lab-c", "course", "serving", "shared", "thesis", "imaging", "genomics",
    "robotics", "speech", "vision", "climate", "markets", "proteins", "translation",
)  # fmt: skip


@dataclass(frozen=True)
class Unit:
    """One project of a drawn organisation."""

    name: str
    department: str
    pattern: str
    utc_offset_h: float
    size: float
    quota_factor: float
    weight: float
    limit_factor: float | None  # its limit against its quota; None: no limit
    mix: tuple[float, float, float]  # workspace, training, inference
    hours: tuple[tuple[float, float], ...]  # local working hours on its days
    crunches: tuple[tuple[int, int, float], ...] = ()  # (first day, days, factor)


@dataclass(frozen=True)
class Organisation:
    days: float
    off_hours: float
    cull_idle_s: float
    node_fraction: float
    pod_window: tuple[float, float]
    workspaces_borrow: bool
    units: tuple[Unit, ...]
    seed: int = 1
    _grid: np.ndarray = field(init=False, repr=False, compare=False)  # set in __post_init__

    def __post_init__(self) -> None:
        steps = int(math.ceil(self.days * DAY_S / STEP_S))
        grid = np.array([[self._rate(u, (s + 0.5) * STEP_S) for u in self.units] for s in range(steps)])
        object.__setattr__(self, "_grid", grid.reshape(steps, len(self.units)))

    # -- the clock -------------------------------------------------------------------
    def _active(self, u: Unit, t: float) -> tuple[bool, float]:
        """Whether ``u`` works at replay time ``t``, and its factor then."""
        if u.pattern == "always-on":
            return True, 1.0
        local = t + u.utc_offset_h * 3600
        day = math.floor(local / DAY_S)
        hour = (local - day * DAY_S) / 3600
        weekday = day % 7 < 5
        factor = 1.0
        for first, n, f in u.crunches:
            if first <= day < first + n:
                factor, weekday = max(factor, f), True
        if u.pattern == "nights":
            return (not weekday) or hour >= 19 or hour < 7, factor
        return weekday and any(lo <= hour < hi for lo, hi in u.hours), factor

    def _rate(self, u: Unit, t: float) -> float:
        working, factor = self._active(u, t)
        return u.size * factor * (1.0 if working else self.off_hours)

    def rates(self, t: float) -> list[float]:
        """Every project's rate over the grid step holding ``t``."""
        s = min(max(0, math.floor(t / STEP_S)), len(self._grid) - 1)
        return self._grid[s].tolist()

    def arrival_times(self, positions: np.ndarray) -> np.ndarray:
        """Replay times for arrivals at ``positions`` (shares of the trace's span): the
        inverse of the projects' cumulative total rate over the window."""
        grid = np.arange(len(self._grid) + 1) * STEP_S
        cum = np.concatenate(([0.0], np.cumsum(self._grid.sum(axis=1) * STEP_S)))
        return np.interp(np.clip(positions, 0.0, 1.0) * cum[-1], cum, grid)

    def workspace_lifetime(self, project: str, submit: float) -> float:
        """Until the project's hours end, then ``cull_idle_s`` idle; inf without culling or
        for a project whose hours never end (always-on)."""
        u = self.unit(project)
        if self.cull_idle_s <= 0 or u.pattern == "always-on":
            return math.inf
        t = submit
        for _ in range(int(DAY_S / STEP_S) * 14):
            if not self._active(u, (math.floor(t / STEP_S) + 0.5) * STEP_S)[0]:
                break
            t = (math.floor(t / STEP_S) + 1) * STEP_S
        return t - submit + self.cull_idle_s

    # -- the organisation ------------------------------------------------------------
    def unit(self, name: str) -> Unit:
        return next(u for u in self.units if u.name == name)

    def kind_of(self, project: str, pod_name: str) -> Kind:
        """A pod's kind: a stable hash of the seed and its name against its project's mix."""
        h = hashlib.blake2b(f"{self.seed}:kind:{pod_name}".encode(), digest_size=8).digest()
        x, acc = int.from_bytes(h, "big") / 2**64, 0.0
        mix = self.unit(project).mix
        for kind, share in zip(KINDS, mix):
            acc += share
            if x < acc:
                return kind
        return KINDS[max(range(3), key=lambda i: mix[i])]

    def mean_rate(self, u: Unit) -> float:
        i = self.units.index(u)
        return float(self._grid[:, i].mean())

    def quota_share(self, u: Unit) -> float:
        """Its quota: its mean demand over the window (its rate, as a share of all) times
        its drawn factor; a team of few hours gets the quota its hours need."""
        peak = float(self._grid[:, self.units.index(u)].max())
        return peak * u.quota_factor

    def to_json(self) -> dict:
        return {
            "days": self.days, "off_hours": self.off_hours, "cull_idle_s": self.cull_idle_s,
            "node_fraction": self.node_fraction, "pod_window": list(self.pod_window),
            "workspaces_borrow": self.workspaces_borrow, "units": [asdict(u) for u in self.units],
        }  # fmt: skip


# -- the draw -----------------------------------------------------------------------------
def _weights(c: dict) -> dict[str, float]:
    v = c.get("patterns", {p: w for p, w in zip(PATTERNS, (3, 2, 1, 1, 1))})
    if not isinstance(v, dict) or not v or any(k not in PATTERNS for k in v):
        raise ValidationError("organisation.patterns", f"must map some of {', '.join(PATTERNS)} to weights, got {v!r}")
    out = {str(k): _number(w, f"organisation.patterns.{k}", 0) for k, w in v.items()}
    if sum(out.values()) <= 0:
        raise ValidationError("organisation.patterns", "the weights must add up to more than 0")
    return out


def _mix(rnd: random.Random, pattern: str) -> tuple[float, float, float]:
    raw = [max(0.0, c * rnd.uniform(0.6, 1.4)) for c in MIX[pattern]]
    total = sum(raw) or 1.0
    return tuple(round(x / total, 3) for x in raw)  # type: ignore[return-value]


def _hours(rnd: random.Random, pattern: str) -> tuple[tuple[float, float], ...]:
    if pattern == "classes":
        first = rnd.choice((8, 9, 10))
        return ((first, first + 2), (first + 4, first + 6))
    return ((9, 18),)


def organisation(c, seed: int) -> Organisation:
    """The ``organisation`` section drawn from ``seed``. Raises ``ValidationError`` naming
    the field."""
    if c is None:
        c = {}
    if not isinstance(c, dict):
        raise ValidationError("organisation", "must be a mapping (see scheduler/sim/organisations.py)")
    known = {"days", "departments", "zones", "projects_per_department", "patterns", "team_size", "quota_factor",
             "weight", "limit_chance", "workspaces_borrow", "node_fraction", "pod_share", "off_hours", "cull_idle_s",
             "units"}
    unknown = sorted(str(k) for k in c if k not in known)
    if unknown:
        raise ValidationError(f"organisation.{unknown[0]}", f"is not a key; the keys are {', '.join(sorted(known))}")
    where = "organisation."
    days = _number(c.get("days", 7), where + "days", 1, 366)
    depts = _range(c, "departments", (2, 4), 1, len(DEPARTMENTS), whole=True, section="organisation")
    zones = _range(c, "zones", (1, 3), 1, len(ZONES), whole=True, section="organisation")
    per_dept = _range(c, "projects_per_department", (1, 4), 1, len(PROJECTS), whole=True, section="organisation")
    size = _range(c, "team_size", (2, 24), 0.1, section="organisation")
    qf = _range(c, "quota_factor", (0.3, 3.0), 0.01, section="organisation")
    weight = _range(c, "weight", (1, 3), 0.1, section="organisation")
    limit_chance = _number(c.get("limit_chance", 0.2), where + "limit_chance", 0, 1)
    borrow = _number(c.get("workspaces_borrow", 0.5), where + "workspaces_borrow", 0, 1)
    nf = _range(c, "node_fraction", (0.015, 0.03), 0.001, 1, section="organisation")
    pod_share = _range(c, "pod_share", (0.2, 0.4), 0.01, 1, section="organisation")
    off = _number(c.get("off_hours", 0.03), where + "off_hours", 0, 1, lo_open=True)
    cull = _number(c.get("cull_idle_s", 3600), where + "cull_idle_s", 0)
    pattern_w = _weights(c)
    rnd = random.Random(f"organisations:{seed}")
    n_dept = rnd.randint(int(depts[0]), int(depts[1]))
    offsets = [off_h for _, off_h in rnd.sample(ZONES, rnd.randint(int(zones[0]), int(min(zones[1], n_dept))))]
    names = iter(rnd.sample(PROJECTS, len(PROJECTS)))
    units = []
    patterns, pw = list(pattern_w), list(pattern_w.values())
    for dname in rnd.sample(DEPARTMENTS, n_dept):
        off_h = rnd.choice(offsets)
        for _ in range(rnd.randint(int(per_dept[0]), int(per_dept[1]))):
            name = next(names, None)
            if name is None:
                break
            pattern = rnd.choices(patterns, pw)[0]
            crunches: list[tuple[int, int, float]] = []
            if pattern == "crunch":
                for _ in range(rnd.randint(1, 2)):
                    n = rnd.randint(1, 3)
                    crunches.append((rnd.randint(0, max(0, int(days) - n)), n, round(rnd.uniform(2, 4) * 2) / 2))
            # Serving and courses hold what their hours need: an admin sizes their quota to
            # their peak (always-on inference cannot borrow; a course fills its quota in class).
            lo_q, hi_q = {"always-on": (1.0, 2.0), "classes": (0.8, 1.5)}.get(pattern, qf)
            limited = rnd.random() < limit_chance
            units.append(Unit(
                name=name, department=dname, pattern=pattern, utc_offset_h=off_h,
                size=float(round(math.exp(rnd.uniform(math.log(size[0]), math.log(size[1]))))) or 1.0,
                quota_factor=round(math.exp(rnd.uniform(math.log(lo_q), math.log(hi_q))), 2),
                weight=float(rnd.randint(int(weight[0]), int(weight[1]))),
                limit_factor=round(rnd.uniform(1.5, 3.0), 2) if limited else None,
                mix=_mix(rnd, pattern), hours=_hours(rnd, pattern), crunches=tuple(crunches),
            ))
    share = rnd.uniform(*pod_share)
    lo = rnd.uniform(0.004, 1.0 - share)
    if "units" in c:  # an organisation written by hand: its projects as given, the rest drawn
        units = _hand_units(c["units"])
    return Organisation(
        days=days, off_hours=off, cull_idle_s=cull,
        node_fraction=round(rnd.uniform(*nf), 4), pod_window=(round(lo, 4), round(lo + share, 4)),
        workspaces_borrow=rnd.random() < borrow, units=tuple(units), seed=seed,
    )


def _hand_units(v) -> list[Unit]:
    """``organisation.units``: the projects of an organisation written by hand, each a
    mapping of ``Unit``'s fields (``name``, ``department``, ``pattern``, ``size``,
    ``quota_factor``; optional ``utc_offset_h`` 0, ``weight`` 1, ``limit_factor`` none,
    ``mix`` the pattern's centre, ``hours`` the pattern's, ``crunches`` none)."""
    if not isinstance(v, list) or not v:
        raise ValidationError("organisation.units", "must be a non-empty list of projects")
    out: list[Unit] = []
    for i, u in enumerate(v):
        where = f"organisation.units[{i}]"
        if not isinstance(u, dict):
            raise ValidationError(where, "must be a mapping")
        fields = {"name", "department", "pattern", "utc_offset_h", "size", "quota_factor", "weight",
                  "limit_factor", "mix", "hours", "crunches"}
        unknown = sorted(str(k) for k in u if k not in fields)
        if unknown:
            raise ValidationError(f"{where}.{unknown[0]}", f"is not a key; the keys are {', '.join(sorted(fields))}")
        for key in ("name", "department"):
            if not isinstance(u.get(key), str) or not u[key]:
                raise ValidationError(f"{where}.{key}", "must be a non-empty name")
        if u["name"] in {x.name for x in out}:
            raise ValidationError(f"{where}.name", f"{u['name']!r} is given twice")
        pattern = u.get("pattern")
        if pattern not in PATTERNS:
            raise ValidationError(f"{where}.pattern", f"must be one of {', '.join(PATTERNS)}, got {pattern!r}")
        mix = u.get("mix", list(MIX[pattern]))
        if not isinstance(mix, list) or len(mix) != 3:
            raise ValidationError(f"{where}.mix", f"must be [workspace, training, inference], got {mix!r}")
        shares = [_number(x, f"{where}.mix", 0, 1) for x in mix]
        if abs(sum(shares) - 1.0) > 1e-6:
            raise ValidationError(f"{where}.mix", f"must add up to 1, got {mix!r}")
        hours = u.get("hours", [list(h) for h in _hours(random.Random(0), pattern)])
        if not isinstance(hours, list) or not hours or any(not isinstance(h, list) or len(h) != 2 for h in hours):
            raise ValidationError(f"{where}.hours", f"must be a list of [from, to] hours, got {hours!r}")
        crunches = u.get("crunches", [])
        if not isinstance(crunches, list) or any(not isinstance(x, list) or len(x) != 3 for x in crunches):
            raise ValidationError(f"{where}.crunches", f"must be a list of [first day, days, factor], got {crunches!r}")
        limit = u.get("limit_factor")
        out.append(Unit(
            name=u["name"], department=u["department"], pattern=pattern,
            utc_offset_h=_number(u.get("utc_offset_h", 0.0), f"{where}.utc_offset_h", -12, 14),
            size=_number(u.get("size"), f"{where}.size", 0.1),
            quota_factor=_number(u.get("quota_factor"), f"{where}.quota_factor", 0.0),
            weight=_number(u.get("weight", 1.0), f"{where}.weight", 0.1),
            limit_factor=None if limit is None else _number(limit, f"{where}.limit_factor", 1.0),
            mix=(shares[0], shares[1], shares[2]),
            hours=tuple((_number(a, f"{where}.hours", 0, 24), _number(b, f"{where}.hours", 0, 24)) for a, b in hours),
            crunches=tuple((int(_number(a, f"{where}.crunches", 0)), int(_number(n, f"{where}.crunches", 1)),
                            _number(f, f"{where}.crunches", 0.1)) for a, n, f in crunches),
        ))
    return out
