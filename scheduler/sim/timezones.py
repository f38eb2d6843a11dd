"""The ``timezones`` scenario class: teams in several time zones that submit work in daily
and weekly cycles, with deadline bursts, so that each team's silo sits idle while it sleeps.

A scenario file of this class says ``generator: timezones`` and has a ``calendar`` instead
of ``departments``::

    generator: timezones
    seed: 1                      # draws what the calendar leaves out, and salts the pod hash
    calendar:
      days: 14                   # the arrival window in replay days, from 00:00 UTC of day 0
      start_weekday: 0           # day 0's weekday (0: Monday ... 6: Sunday)
      workday_h: [9, 18]         # local working hours, Monday to Friday
      off_hours: 0.05            # the submission rate at night and at weekends, relative to the day's
      zones: 3                   # how many to draw, or a list (below)
      teams_per_zone: [1, 3]     # drawn per zone
      team_size: [4, 24]         # people per team, drawn log-uniformly
      bursts_per_team: [0, 2]    # deadlines drawn per team
      burst_days: [1, 3]         # the days before a deadline the team crunches
      burst_factor: [2, 4]       # its rate then, relative to a normal day's
      cull_idle_s: 3600          # a workspace stops this long after its owner's day ends (0: never)
      # Pinned instead of drawn:
      # zones: [{name: london, utc_offset_h: 0, teams: [{name: nlp, size: 12}]}, ...]
      # bursts: [{team: nlp, deadline_day: 9, days: 3, factor: 3}]

Each team is a project of its zone's department. Its rate of submitting at replay time ``t``
is its size times 1 in its local working hours on weekdays and ``off_hours`` otherwise; in
the ``days`` before a deadline it works weekends too, at ``factor`` times that rate. Its
share of the pods is its size; its quota its size times its largest deadline factor (its
silo holds its crunch, so between crunches and while its team sleeps it sits idle). A
workspace is used until its owner's working day ends and stopped by the idle culler
``cull_idle_s`` (the product's ``Gpupool.cull_idle_s``, default 3,600) later. The trace's pods keep their
order and their service times; their arrival times are spread over the window in proportion
to the teams' total rate (so nights, when every zone sleeps, get few), and each pod goes to
a team by a stable hash drawn against the teams' rates at its arrival.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import numpy as np

from ..model import ValidationError

DAY_S = 86_400.0
STEP_S = 900.0  # the rate's grid: a quarter hour, so that offsets such as +5:30 are exact
# Zones a draw picks from: (department name, UTC offset in hours).
ZONES = (
    ("san-francisco", -8.0), ("new-york", -5.0), ("sao-paulo", -3.0), ("london", 0.0), ("berlin", 1.0),
    ("bangalore", 5.5), ("singapore", 8.0), ("tokyo", 9.0), ("sydney", 10.0),
)  # fmt: skip
TEAM_NAMES = (
    "vision", "nlp", "speech", "recsys", "search", "genai", "robotics", "autonomy",
    "ads", "maps", "health", "finance", "video", "chem", "weather", "translate",
)  # fmt: skip


@dataclass(frozen=True)
class Team:
    name: str
    zone: str
    utc_offset_h: float
    size: float


@dataclass(frozen=True)
class Burst:
    team: str
    deadline_day: int  # local day of the deadline (0: the calendar's first day)
    days: int  # the crunch: the days before it
    factor: float


@dataclass(frozen=True)
class Calendar:
    days: float
    start_weekday: int
    workday_h: tuple[float, float]
    off_hours: float
    cull_idle_s: float
    teams: tuple[Team, ...]
    bursts: tuple[Burst, ...]

    def activity(self, team: Team, t: float) -> tuple[bool, float]:
        """Whether ``team`` is in its working hours at replay time ``t``, and its deadline
        factor then (1 outside a crunch; in one, weekends are working days too)."""
        local = t + team.utc_offset_h * 3600
        day = math.floor(local / DAY_S)
        hour = (local - day * DAY_S) / 3600
        factor, weekday = 1.0, (day + self.start_weekday) % 7 < 5
        for b in self.bursts:
            if b.team == team.name and b.deadline_day - b.days <= day < b.deadline_day:
                factor, weekday = max(factor, b.factor), True
        return weekday and self.workday_h[0] <= hour < self.workday_h[1], factor

    def rate(self, team: Team, t: float) -> float:
        """``team``'s rate of submitting at replay time ``t`` (people x activity)."""
        working, factor = self.activity(team, t)
        return team.size * factor * (1.0 if working else self.off_hours)

    def workspace_lifetime(self, team: str, submit: float) -> float:
        """How long a workspace submitted at ``submit`` by ``team`` is used: until its
        owner's working day ends (the end of a working hour run at or after ``submit``),
        then idle for ``cull_idle_s`` until the idle culler stops it. inf without culling."""
        if self.cull_idle_s <= 0:
            return math.inf
        tm = next(x for x in self.teams if x.name == team)
        t = submit
        for _ in range(int(DAY_S / STEP_S) * 14):  # a crunch may run the whole window
            mid = (math.floor(t / STEP_S) + 0.5) * STEP_S
            if not self.activity(tm, mid)[0]:
                break
            t = (math.floor(t / STEP_S) + 1) * STEP_S
        return t - submit + self.cull_idle_s

    def peak(self, team: Team) -> float:
        """The team's rate at its busiest (its size x its largest deadline factor): what
        its silo is sized for, so that its crunch fits in its own GPUs."""
        return team.size * max([1.0] + [b.factor for b in self.bursts if b.team == team.name])

    def rates(self, t: float) -> list[float]:
        """Every team's rate over the grid step holding ``t`` (constant within a step)."""
        mid = (math.floor(t / STEP_S) + 0.5) * STEP_S
        return [self.rate(tm, mid) for tm in self.teams]

    def arrival_times(self, positions: np.ndarray) -> np.ndarray:
        """Replay times for arrivals at ``positions`` (shares in [0, 1] of the trace's span):
        the inverse of the teams' cumulative total rate over the window, so each stretch of
        time gets arrivals in proportion to how many people work then."""
        steps = int(math.ceil(self.days * DAY_S / STEP_S))
        grid = np.arange(steps + 1) * STEP_S
        total = np.array([sum(self.rates(s * STEP_S)) for s in range(steps)])
        cum = np.concatenate(([0.0], np.cumsum(total * STEP_S)))
        return np.interp(np.clip(positions, 0.0, 1.0) * cum[-1], cum, grid)

    def to_json(self) -> dict:
        return {
            "days": self.days, "start_weekday": self.start_weekday, "workday_h": list(self.workday_h),
            "off_hours": self.off_hours, "cull_idle_s": self.cull_idle_s,
            "teams": [asdict(t) for t in self.teams], "bursts": [asdict(b) for b in self.bursts],
        }  # fmt: skip


# -- reading the calendar section ---------------------------------------------------------
def _number(v, where: str, lo: float, hi: float = math.inf, lo_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < lo or (lo_open and v == lo) or v > hi:
        rng = f"{'>' if lo_open else '>='} {lo}" + ("" if hi == math.inf else f" and <= {hi}")
        raise ValidationError(where, f"must be a number {rng}, got {v!r}")
    return float(v)


def _range(
    c: dict, key: str, default: tuple[float, float], lo: float, hi: float = math.inf, whole: bool = False,
    section: str = "calendar",
) -> tuple[float, float]:
    v = c.get(key, list(default))
    where = f"{section}.{key}"
    if not isinstance(v, list) or len(v) != 2:
        raise ValidationError(where, f"must be [lo, hi], got {v!r}")
    a, b = (_number(x, where, lo, hi) for x in v)
    if a > b or (whole and (a != int(a) or b != int(b))):
        raise ValidationError(where, f"must be [lo, hi] with {'whole numbers ' if whole else ''}lo <= hi, got {v!r}")
    return a, b


def _pinned_zones(zones: list) -> list[Team]:
    teams = []
    for i, z in enumerate(zones):
        where = f"calendar.zones[{i}]"
        if not isinstance(z, dict) or not z.get("name"):
            raise ValidationError(f"{where}.name", "must not be empty")
        off = _number(z.get("utc_offset_h"), f"{where}.utc_offset_h", -12, 14)
        members = z.get("teams")
        if not isinstance(members, list) or not members:
            raise ValidationError(f"{where}.teams", "need at least one team")
        for j, tm in enumerate(members):
            if not isinstance(tm, dict) or not tm.get("name"):
                raise ValidationError(f"{where}.teams[{j}].name", "must not be empty")
            size = _number(tm.get("size"), f"{where}.teams[{j}].size", 0, lo_open=True)
            teams.append(Team(str(tm["name"]), str(z["name"]), off, size))
    return teams


def _drawn_zones(rnd: random.Random, count: int, per_zone: tuple[float, float], size: tuple[float, float]) -> list[Team]:
    picked = sorted(rnd.sample(ZONES, count), key=lambda z: z[1])
    names = iter(TEAM_NAMES)
    teams = []
    for zone, off in picked:
        for _ in range(rnd.randint(int(per_zone[0]), int(per_zone[1]))):
            people = round(math.exp(rnd.uniform(math.log(size[0]), math.log(size[1]))))
            teams.append(Team(next(names), zone, off, float(people)))
    return teams


def _pinned_bursts(bursts: list, teams: set[str], days: float) -> list[Burst]:
    out = []
    for i, b in enumerate(bursts):
        where = f"calendar.bursts[{i}]"
        if not isinstance(b, dict) or b.get("team") not in teams:
            got = b.get("team") if isinstance(b, dict) else b
            raise ValidationError(f"{where}.team", f"must be one of the teams ({', '.join(sorted(teams))}), got {got!r}")
        day = _number(b.get("deadline_day"), f"{where}.deadline_day", 1, math.ceil(days))
        length = _number(b.get("days"), f"{where}.days", 1, day)
        factor = _number(b.get("factor"), f"{where}.factor", 1)
        if day != int(day) or length != int(length):
            raise ValidationError(where, f"deadline_day and days must be whole days, got {day!r}, {length!r}")
        out.append(Burst(str(b["team"]), int(day), int(length), factor))
    return out


def _drawn_bursts(rnd, teams, days, per_team, length, factor) -> list[Burst]:
    out = []
    for tm in teams:
        for _ in range(rnd.randint(int(per_team[0]), int(per_team[1]))):
            n = rnd.randint(int(length[0]), int(length[1]))
            deadline = rnd.randint(n, max(n, int(days)))
            out.append(Burst(tm.name, deadline, n, round(rnd.uniform(*factor) * 2) / 2))
    return sorted(out, key=lambda b: (b.deadline_day, b.team))


def calendar(c, seed: int) -> Calendar:
    """The ``calendar`` section as a ``Calendar``: what it pins, and the rest drawn from
    ``seed``. Raises ``ValidationError`` naming the field."""
    if not isinstance(c, dict):
        raise ValidationError("calendar", "must be a mapping (see scheduler/sim/timezones.py)")
    days = _number(c.get("days", 14), "calendar.days", 1, 366)
    start = _number(c.get("start_weekday", 0), "calendar.start_weekday", 0, 6)
    if start != int(start):
        raise ValidationError("calendar.start_weekday", f"must be a whole number in [0, 6], got {start!r}")
    work = _range(c, "workday_h", (9, 18), 0, 24)
    if work[0] == work[1]:
        raise ValidationError("calendar.workday_h", f"must be [start, end) with start < end, got {list(work)}")
    off = _number(c.get("off_hours", 0.05), "calendar.off_hours", 0, 1, lo_open=True)
    cull = _number(c.get("cull_idle_s", 3600), "calendar.cull_idle_s", 0)
    rnd = random.Random(f"timezones:{seed}")
    zones = c.get("zones", 3)
    if isinstance(zones, list):
        teams = _pinned_zones(zones)
    else:
        count = _number(zones, "calendar.zones", 1, len(ZONES))
        if count != int(count):
            raise ValidationError("calendar.zones", f"must be a whole number of zones or a list of zones, got {zones!r}")
        count = int(count)
        per_zone = _range(c, "teams_per_zone", (1, 3), 1, len(TEAM_NAMES) // count, whole=True)
        size = _range(c, "team_size", (4, 24), 1)
        teams = _drawn_zones(rnd, count, per_zone, size)
    if len({t.name for t in teams}) != len(teams):
        raise ValidationError("calendar.zones", "team names must be unique")
    if "bursts" in c:
        if not isinstance(c["bursts"], list):
            raise ValidationError("calendar.bursts", f"must be a list, got {c['bursts']!r}")
        bursts = _pinned_bursts(c["bursts"], {t.name for t in teams}, days)
    else:
        per_team = _range(c, "bursts_per_team", (0, 2), 0, whole=True)
        length = _range(c, "burst_days", (1, 3), 1, whole=True)
        factor = _range(c, "burst_factor", (2, 4), 1)
        bursts = _drawn_bursts(rnd, teams, days, per_team, length, factor)
    return Calendar(days, int(start), work, off, cull, tuple(teams), tuple(bursts))
