"""Replay scenarios: who owns which trace pod, each team's quota and weight, and the clock.

A scenario is a YAML file (``scheduler/sim/scenarios/*.yaml``)::

    name: balanced
    seed: 1                       # salt of the pod -> project hash
    time:
      arrival_compression: 400    # trace creation times (from the first) divided by this
      scheduling_period_s: 10     # a cycle runs on multiples of this, only after a change
      eviction_grace_s: 30        # an evicted pod holds its GPUs this long
      checkpoint_interval_s: 600  # a preempted pod keeps work up to its last checkpoint
      thrash_window_s: 600        # preempted again this soon after a restart = thrash
      queue_depth: 16             # pending pods per project and kind the scheduler sees (see replay)
      activity_period_s: 6048     # optional: the period of the projects' ``active`` windows
    cluster:
      node_fraction: 0.125        # this share of the trace's nodes, evenly from each node type
    pods:
      skip_never_scheduled: true  # trace pods without scheduled_time have no service time
      skip_cpu_only: true         # quotas are GPU quotas; CPU-only pods are left out
      window: [0.0, 1.0]          # share of the pods (in creation order) to replay
      skip_unplaceable: false     # leave out pods no node of the cluster could hold (organisations: true)
    kinds: {LS: workspace, Guaranteed: inference, BE: training, Burstable: training}
    workspace_over_quota: 0.0     # share of workspaces that opt in to over quota (see below)
    placement: gpupool            # placement policy every replayed policy uses (see below)
    departments:
      - name: research
        projects:
          - {name: nlp, quota_share: 0.25, weight: 1, pod_share: 0.25, active: [[0.0, 0.25]]}

Every pod goes to a project by a stable hash of ``seed`` and its name (blake2b, so the same
on every machine and Python), drawn against the projects' ``pod_share``. A project with
``active`` windows (shares [lo, hi) of ``time.activity_period_s``, by replay time after the
compression) only gets the pods that arrive inside them: teams that take turns. Projects
without windows are active all the time; when no project is active, every project is. Quotas are
``quota_share`` of the cluster's GPUs, rounded to milli-GPUs so that they add up to the
cluster exactly; a department's quota is the sum of its projects', its weight the sum of
its projects' weights.

``workspace_over_quota`` (a share in [0, 1], or true/false for 1/0): Run:ai's "interactive
preemptible" workspaces. That share of the workspace pods (by a second stable hash of the
name) is submitted as preemptible with over quota allowed, like training: it may use idle
GPUs of other projects and is then reclaimed, preempted and loses the work since its last
checkpoint as training does. The rest keep the kind's defaults (non-preemptible, in quota
only). The same pods opt in under every policy; only gpupool lets work go over quota.

``placement``: the placement policy (``scheduler.placement.POLICIES``) of the cluster the
scenario describes, used by all three replayed policies alike (``--placement`` overrides it);
``gpupool`` unless set.

``generator: timezones``: instead of ``departments`` the file has a ``calendar`` from which
the teams, their time zones and deadline bursts are drawn (``seed``) or read, and the arrival
times follow the teams' working hours rather than ``time.arrival_compression`` (see
``timezones``).

Errors: a bad file raises ``ValidationError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..model import DEFAULT_POOL, MILLI, Department, Kind, Node, Project, Quota, ValidationError
from ..placement import POLICIES
from .organisations import Organisation, organisation
from .timezones import Calendar, calendar
from .trace import TracePod

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


@dataclass(frozen=True)
class TeamSpec:
    name: str
    department: str
    quota_share: float
    weight: float
    pod_share: float
    # Parts of each activity period in which the team submits work, as [lo, hi) shares of
    # the period; empty: all the time.
    active: tuple[tuple[float, float], ...] = ()
    limit_share: float | None = None  # its limit (a cap even on idle GPUs), a share of the cluster

    def active_at(self, phase: float) -> bool:
        return not self.active or any(lo <= phase < hi for lo, hi in self.active)


@dataclass(frozen=True)
class TimeSpec:
    arrival_compression: float = 1.0
    scheduling_period_s: float = 10.0
    eviction_grace_s: float = 30.0
    checkpoint_interval_s: float = 600.0
    thrash_window_s: float = 600.0
    queue_depth: int = 16
    activity_period_s: float = 0.0  # 0: no activity windows (see Scenario.project_of)


@dataclass(frozen=True)
class PodSpec:
    skip_never_scheduled: bool = True
    skip_cpu_only: bool = True
    window: tuple[float, float] = (0.0, 1.0)
    # Pods no node of the replayed cluster could hold (GPUs, CPUs, memory) are left out: on a
    # small share of the trace's nodes, the node types they need may not be drawn.
    skip_unplaceable: bool = False


@dataclass
class Scenario:
    name: str
    teams: list[TeamSpec]
    node_fraction: float = 1.0
    time: TimeSpec = field(default_factory=TimeSpec)
    pods: PodSpec = field(default_factory=PodSpec)
    kinds: dict[str, Kind] = field(default_factory=dict)
    seed: int = 1
    description: str = ""
    path: str = ""
    workspace_over_quota: float = 0.0
    placement: str = "gpupool"
    # generator: timezones or organisations (arrivals and teams by the clock)
    calendar: Calendar | Organisation | None = None

    # -- the cluster -----------------------------------------------------------------
    def select_nodes(self, nodes: list[Node]) -> list[Node]:
        """``node_fraction`` of the nodes, spread evenly over each (GPU count, model) group
        in file order, so the smaller cluster has the same mix of node types."""
        if self.node_fraction >= 1:
            return list(nodes)
        seen: dict[tuple, int] = {}
        keep = []
        f = self.node_fraction
        for n in nodes:
            key = (len(n.gpus), n.gpus[0].model if n.gpus else "")
            i = seen[key] = seen.get(key, -1) + 1
            if math.floor((i + 1) * f + 0.5) > math.floor(i * f + 0.5):
                keep.append(n)
        return keep

    # -- the pods --------------------------------------------------------------------
    def project_of(self, pod_name: str, at: float | None = None) -> str:
        """The project a pod belongs to: a stable hash of the seed and the name, drawn
        against the ``pod_share`` of the projects active at replay time ``at`` (its phase in
        ``time.activity_period_s``); all projects when none is active, none has windows, or
        ``at`` is None."""
        h = hashlib.blake2b(f"{self.seed}:{pod_name}".encode(), digest_size=8).digest()
        u = int.from_bytes(h, "big") / 2**64
        teams, shares = self.teams, [t.pod_share for t in self.teams]
        period = self.time.activity_period_s
        if at is not None and self.calendar is not None:
            shares = self.calendar.rates(at)
        elif at is not None and period > 0:
            phase = (at % period) / period
            teams = [t for t in self.teams if t.active_at(phase)] or self.teams
            shares = [t.pod_share for t in teams]
        acc = 0.0
        total = sum(shares)
        for t, share in zip(teams, shares):
            acc += share / total
            if u < acc:
                return t.name
        return teams[-1].name

    def arrival_times(self, pods: list[TracePod]) -> list[float]:
        """Replay times of ``pods`` (in creation order): their creation times from the first
        divided by ``time.arrival_compression``, or with a calendar spread over its days by
        the teams' working hours."""
        if not pods:
            return []
        t0 = pods[0].creation_time
        if self.calendar is None:
            return [(p.creation_time - t0) / self.time.arrival_compression for p in pods]
        span = (pods[-1].creation_time - t0) or 1
        return self.calendar.arrival_times(np.array([(p.creation_time - t0) / span for p in pods])).tolist()

    def service_s(self, pod: TracePod, project: str, submit: float) -> float:
        """How long ``pod`` runs once started: the trace's time, or with a calendar, for a
        workspace, at most until the idle culler stops it after its owner's working day."""
        service = pod.ran_s
        if self.calendar is not None and self.kind_of(pod, project) == Kind.WORKSPACE:
            service = min(service, self.calendar.workspace_lifetime(project, submit))
        return service

    def kind_of(self, pod: TracePod, project: str | None = None) -> Kind:
        """The pod's kind: by its QoS (``kinds``), or under ``generator: organisations`` by
        its project's mix of kinds."""
        if isinstance(self.calendar, Organisation) and project is not None:
            return self.calendar.kind_of(project, pod.name)
        return self.kinds.get(pod.qos, Kind.TRAINING)

    def opts_over_quota(self, pod_name: str) -> bool:
        """Whether a workspace pod is an "interactive preemptible" one (see the module)."""
        share = self.workspace_over_quota
        if share <= 0:
            return False
        h = hashlib.blake2b(f"{self.seed}:over-quota:{pod_name}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2**64 < share

    def select(self, pods: list[TracePod], nodes: list[Node] | None = None) -> list[TracePod]:
        """The trace pods this scenario replays, in creation order (with ``skip_unplaceable``,
        only those some node of ``nodes`` could hold)."""
        if self.pods.skip_unplaceable and nodes is not None:
            pods = [p for p in pods if any(
                len(n.gpus) >= max(1, p.num_gpu) and n.cpu_milli >= p.cpu_milli and n.memory_mib >= p.memory_mib
                for n in nodes)]
        keep = []
        for p in sorted(pods, key=lambda p: (p.creation_time, p.name)):
            if self.pods.skip_never_scheduled and (p.scheduled_time is None or p.deletion_time is None):
                continue
            if self.pods.skip_cpu_only and p.gpu_request_milli == 0:
                continue
            keep.append(p)
        lo, hi = self.pods.window
        return keep[int(round(lo * len(keep))) : int(round(hi * len(keep)))]

    # -- the organisation ------------------------------------------------------------
    def quotas_milli(self, capacity_milli: int) -> dict[str, int]:
        """Each project's quota in milli-GPUs; they add up to ``capacity_milli`` exactly
        (largest remainder)."""
        total = sum(t.quota_share for t in self.teams)
        raw = [t.quota_share / total * capacity_milli for t in self.teams]
        out = [math.floor(r) for r in raw]
        left = capacity_milli - sum(out)
        for i in sorted(range(len(raw)), key=lambda i: (out[i] - raw[i], i))[:left]:
            out[i] += 1
        return {t.name: q for t, q in zip(self.teams, out)}

    def organisation(self, capacity_milli: int, pool: str = DEFAULT_POOL) -> tuple[list[Department], list[Project]]:
        quotas = self.quotas_milli(capacity_milli)
        cap = capacity_milli / MILLI
        projects = [
            Project(t.name, t.department, {pool: Quota(quotas[t.name] / MILLI, t.weight,
                                                       None if t.limit_share is None else round(t.limit_share * cap, 3))})
            for t in self.teams
        ]
        departments = []
        for d in dict.fromkeys(t.department for t in self.teams):
            members = [t for t in self.teams if t.department == d]
            q = sum(quotas[t.name] for t in members) / MILLI
            departments.append(Department(d, {pool: Quota(q, sum(t.weight for t in members))}))
        return departments, projects

    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.teams}

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "path": self.path,
            "seed": self.seed,
            "node_fraction": self.node_fraction,
            "time": self.time.__dict__,
            "pods": {**self.pods.__dict__, "window": list(self.pods.window)},
            "kinds": {k: v.value for k, v in self.kinds.items()},
            "workspace_over_quota": self.workspace_over_quota,
            "placement": self.placement,
            "projects": [t.__dict__ for t in self.teams],
            **({"calendar": self.calendar.to_json()} if self.calendar else {}),
        }


def _num(d: dict, key: str, where: str, default: float, lo: float = 0.0, strict: bool = False) -> float:
    v = d.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < lo or (strict and v == lo):
        raise ValidationError(f"{where}.{key}", f"must be a number {'>' if strict else '>='} {lo}, got {v!r}")
    return float(v)


def _windows(v, where: str) -> tuple[tuple[float, float], ...]:
    """``[[lo, hi], ...]`` shares of the activity period, each 0 <= lo < hi <= 1."""
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValidationError(where, f"must be a list of [lo, hi] pairs, got {v!r}")
    out = []
    for w in v:
        ok = isinstance(w, list) and len(w) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w)
        if not ok or not 0 <= w[0] < w[1] <= 1:
            raise ValidationError(where, f"each window must be [lo, hi] with 0 <= lo < hi <= 1, got {w!r}")
        out.append((float(w[0]), float(w[1])))
    return tuple(out)


# The keys a scenario file may have (a misspelt one is an error, not silently a default).
KEYS = (
    "name", "description", "seed", "generator", "cluster", "time", "pods", "kinds",
    "workspace_over_quota", "placement", "departments", "calendar", "organisation",
)  # fmt: skip
GENERATORS = ("timezones", "organisations")


def _mapping(data: dict, key: str) -> dict:
    v = data.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValidationError(key, f"must be a mapping, got {v!r}")
    return v


def _departments(data: dict) -> list[TeamSpec]:
    depts = data.get("departments") or []
    if not isinstance(depts, list):
        raise ValidationError("departments", f"must be a list of departments, got {depts!r}")
    teams = []
    for i, d in enumerate(depts):
        if not isinstance(d, dict):
            raise ValidationError(f"departments[{i}]", f"must be a mapping with name and projects, got {d!r}")
        dname = d.get("name") or f"dept-{i}"
        projects = d.get("projects") or []
        if not isinstance(projects, list):
            raise ValidationError(f"departments[{i}].projects", f"must be a list of projects, got {projects!r}")
        for j, pr in enumerate(projects):
            where = f"departments[{i}].projects[{j}]"
            if not isinstance(pr, dict) or not pr.get("name"):
                raise ValidationError(f"{where}.name", "must not be empty")
            teams.append(
                TeamSpec(
                    name=str(pr["name"]),
                    department=str(dname),
                    quota_share=_num(pr, "quota_share", where, 0.0),
                    weight=_num(pr, "weight", where, 1.0),
                    pod_share=_num(pr, "pod_share", where, 0.0),
                    active=_windows(pr.get("active"), f"{where}.active"),
                )
            )
    return teams


def parse(data: dict, path: str = "") -> Scenario:
    if not isinstance(data, dict):
        raise ValidationError("scenario", f"must be a mapping of {', '.join(KEYS)}, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        raise ValidationError(unknown[0], f"is not a scenario key; the keys are {', '.join(KEYS)}")
    name = str(data.get("name") or Path(path).stem or "scenario")
    seed = data.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValidationError("seed", f"must be a whole number, got {seed!r}")
    generator = data.get("generator")
    if generator is not None and generator not in GENERATORS:
        raise ValidationError("generator", f"must be one of {', '.join(GENERATORS)} or left out, got {generator!r}")
    t = _mapping(data, "time")
    if generator:  # the calendar sets the arrival times and the teams' turns
        for key in ("arrival_compression", "activity_period_s"):
            if key in t:
                raise ValidationError(f"time.{key}", f"is not used with generator: {generator} (calendar.days spreads the arrivals)")
    time = TimeSpec(
        arrival_compression=_num(t, "arrival_compression", "time", 1.0, strict=True),
        scheduling_period_s=_num(t, "scheduling_period_s", "time", 10.0, strict=True),
        eviction_grace_s=_num(t, "eviction_grace_s", "time", 30.0),
        checkpoint_interval_s=_num(t, "checkpoint_interval_s", "time", 600.0, strict=True),
        thrash_window_s=_num(t, "thrash_window_s", "time", 600.0),
        queue_depth=int(_num(t, "queue_depth", "time", 16, lo=1)),
        activity_period_s=_num(t, "activity_period_s", "time", 0.0),
    )
    p = _mapping(data, "pods")
    window = p.get("window", [0.0, 1.0])
    ok = isinstance(window, (list, tuple)) and len(window) == 2
    if not ok or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in window) or not 0 <= window[0] < window[1] <= 1:
        raise ValidationError("pods.window", f"must be [lo, hi] with 0 <= lo < hi <= 1, got {window!r}")
    pods = PodSpec(bool(p.get("skip_never_scheduled", True)), bool(p.get("skip_cpu_only", True)), tuple(window),
                   bool(p.get("skip_unplaceable", generator == "organisations")))
    kinds = {}
    for qos, kind in _mapping(data, "kinds").items():
        try:
            kinds[str(qos)] = Kind(kind)
        except ValueError:
            raise ValidationError(f"kinds.{qos}", f"must be one of {[k.value for k in Kind]}, got {kind!r}") from None
    cal: Calendar | Organisation | None = None
    woq = data.get("workspace_over_quota", 0.0)
    if generator == "organisations":
        if "departments" in data or "calendar" in data:
            raise ValidationError("departments" if "departments" in data else "calendar",
                                  "must be left out with generator: organisations (organisation draws the projects)")
        cal = organisation(data.get("organisation"), seed)
        total = sum(cal.quota_share(u) for u in cal.units)
        teams = [TeamSpec(u.name, u.department, cal.quota_share(u), u.weight, u.size,
                          limit_share=None if u.limit_factor is None else cal.quota_share(u) / total * u.limit_factor)
                 for u in cal.units]
        woq = 1.0 if cal.workspaces_borrow else 0.0
    elif generator:
        if "departments" in data:
            raise ValidationError("departments", f"must be left out with generator: {generator} (calendar draws the teams)")
        if "calendar" not in data:
            raise ValidationError("calendar", f"is needed with generator: {generator}")
        cal = calendar(data["calendar"], seed)
        teams = [TeamSpec(tm.name, tm.zone, cal.peak(tm), 1.0, tm.size) for tm in cal.teams]
    else:
        if "calendar" in data:
            raise ValidationError("calendar", "needs generator: timezones")
        if "organisation" in data:
            raise ValidationError("organisation", "needs generator: organisations")
        teams = _departments(data)
    if not teams:
        raise ValidationError("departments", "need at least one project")
    if any(tm.active for tm in teams) and time.activity_period_s <= 0:
        raise ValidationError("time.activity_period_s", "must be > 0 when a project has active windows")
    if len({t.name for t in teams}) != len(teams):
        raise ValidationError("departments", "project names must be unique")
    if sum(t.quota_share for t in teams) <= 0 or sum(t.pod_share for t in teams) <= 0:
        raise ValidationError("departments", "quota_share and pod_share must each add up to more than 0")
    if isinstance(woq, bool):
        woq = 1.0 if woq else 0.0
    if not isinstance(woq, (int, float)) or not 0 <= woq <= 1:
        raise ValidationError("workspace_over_quota", f"must be true, false or a share in [0, 1], got {woq!r}")
    placement = data.get("placement", "gpupool")
    if placement not in POLICIES:
        raise ValidationError("placement", f"must be one of {', '.join(POLICIES)}, got {placement!r}")
    c = _mapping(data, "cluster")
    node_fraction = _num(c, "node_fraction", "cluster", 1.0, strict=True)
    if node_fraction > 1:
        raise ValidationError("cluster.node_fraction", f"must be <= 1, got {node_fraction}")
    if isinstance(cal, Organisation):  # the draw sizes the cluster and picks the pods
        node_fraction = cal.node_fraction
        pods = dataclasses.replace(pods, window=cal.pod_window)
    return Scenario(
        name=name,
        teams=teams,
        node_fraction=node_fraction,
        time=time,
        pods=pods,
        kinds=kinds,
        seed=seed,
        description=str(data.get("description", "")).strip(),
        path=str(path),
        workspace_over_quota=float(woq),
        placement=placement,
        calendar=cal,
    )


def load(path: str | Path, seed: int | None = None) -> Scenario:
    """A scenario from a YAML file (any path), or by name from ``scheduler/sim/scenarios``;
    ``seed`` replaces the file's (another draw of a generated scenario, another pod hash).
    A bad file raises ``ValidationError`` naming the field, or the file and what is wrong
    with it."""
    p = Path(path)
    if not p.exists() and (SCENARIO_DIR / f"{path}.yaml").exists():
        p = SCENARIO_DIR / f"{path}.yaml"
    if not p.is_file():
        shipped = ", ".join(sorted(x.stem for x in SCENARIO_DIR.glob("*.yaml")))
        if p.is_dir():
            raise ValidationError("scenario", f"{str(path)!r} is a directory, not a scenario file")
        raise ValidationError("scenario", f"no file {str(path)!r} and no shipped scenario of that name ({shipped})")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValidationError("scenario", f"cannot read {str(p)!r}: {e}") from None
    except yaml.YAMLError as e:
        raise ValidationError("scenario", f"{str(p)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if seed is not None and isinstance(data, dict):
        data = {**data, "seed": seed}
    try:
        return parse(data, str(p))
    except ValidationError as e:
        raise ValidationError(e.field, f"{e.message} (in {p})") from None
