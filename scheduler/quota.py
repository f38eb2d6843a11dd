"""Quota rules: fair shares and whether a project may take more GPUs. One place for both.

Fair share, per node pool, top down: every department first gets what it wants up to its
quota; GPUs nobody is guaranteed are then divided among departments that want more, in
proportion to their over-quota weights and up to their limits. Each department's share is
divided among its projects the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .model import DEFAULT_POOL, MILLI, NO_QUOTA, Department, Kind, Project, Quota, check_seconds


def waterfill(total: float, base: list[float], cap: list[float], weight: list[float]) -> list[float]:
    """Give each entry its ``base`` (scaled down if they do not all fit), then divide what
    is left by ``weight`` without going over ``cap``."""
    n = len(base)
    base_sum = sum(base)
    if base_sum >= total:
        scale = total / base_sum if base_sum else 0.0
        return [b * scale for b in base]
    got = list(base)
    left = total - base_sum
    open_ = {i for i in range(n) if cap[i] > got[i] and weight[i] > 0}
    while left > 1e-9 and open_:
        wsum = sum(weight[i] for i in open_)
        step = {i: left * weight[i] / wsum for i in open_}
        full = {i for i in open_ if got[i] + step[i] >= cap[i]}
        if not full:
            for i in open_:
                got[i] += step[i]
            break
        # Fill the entries that hit their cap, then share the rest among the others.
        for i in full:
            left -= cap[i] - got[i]
            got[i] = cap[i]
        open_ -= full
    return got


def _limit(q: Quota) -> float:
    return float("inf") if q.limit_milli is None else float(q.limit_milli)


def department_quota(dept: Department, projects: list[Project], pool: str) -> Quota:
    """A department without a quota for the pool is guaranteed the sum of its projects'."""
    if pool in dept.quotas:
        return dept.quotas[pool]
    return Quota(gpus=sum(p.quotas.get(pool, Quota()).gpus for p in projects))


def fair_shares(
    capacity_milli: int,
    departments: dict[str, Department],
    projects: dict[str, Project],
    demand: dict[str, float],
    pool: str,
) -> dict[str, int]:
    """Each project's fair share of the pool in milli-GPUs, for the given demands."""
    by_dept: dict[str, list[Project]] = {d: [] for d in departments}
    for p in projects.values():
        by_dept.setdefault(p.department, []).append(p)
    dnames = [d for d in by_dept if d in departments]
    d_demand, d_base, d_cap, d_weight = [], [], [], []
    for d in dnames:
        q = department_quota(departments[d], by_dept[d], pool)
        want = sum(min(demand.get(p.name, 0.0), _limit(p.quotas.get(pool, Quota()))) for p in by_dept[d])
        want = min(want, _limit(q))
        d_demand.append(want)
        d_base.append(min(q.quota_milli, want))
        d_cap.append(want)
        d_weight.append(q.over_quota_weight)
    d_share = waterfill(capacity_milli, d_base, d_cap, d_weight)
    shares: dict[str, int] = {}
    for d, share in zip(dnames, d_share):
        ps = by_dept[d]
        qs = [p.quotas.get(pool, Quota()) for p in ps]
        wants = [min(demand.get(p.name, 0.0), _limit(q)) for p, q in zip(ps, qs)]
        got = waterfill(
            share,
            [min(q.quota_milli, w) for q, w in zip(qs, wants)],
            wants,
            [q.over_quota_weight for q in qs],
        )
        for p, g in zip(ps, got):
            shares[p.name] = int(g + 1e-6)
    return shares


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    over_quota: bool
    reason: str = ""
    # In quota only because the project's borrowed GPUs do not count (``counted_usage``);
    # counting all of them it would be over: such work goes after work in quota by both
    # counts and reclaims from no other project (actions.allocate.InQuota,
    # actions.evictions.QuotaReclaim).
    guaranteed_only: bool = False


def _gpus(milli: float) -> str:
    return f"{milli / MILLI:g}"


def admit(
    project: Project,
    dept_quota: Quota,
    pool: str,
    kind: Kind,
    may_go_over_quota: bool,
    milli: int,
    project_used: int,
    dept_in_quota: int,
    dept_used: int,
    project_fixed: int | None = None,
) -> Verdict:
    """May ``project`` take ``milli`` more GPU in ``pool``, and is it over its quota then?

    In quota means inside both the project's quota and its department's (counting only
    its projects' in-quota GPUs: one project's bursting never spends another's guarantee);
    for work that may not go over quota, given ``project_fixed``, counting only the GPUs
    that cannot give way (``counted_usage``), and then within the limits too, which count
    everything. Over quota is for work that may go there, up to the project's and the
    department's limits; how much of the idle capacity it gets is the fair share's
    business, not this rule's.
    """
    q = project.quotas.get(pool, NO_QUOTA)
    used, in_dept = project_used, dept_in_quota
    if project_fixed is not None:
        used, in_dept = counted_usage(project_used, project_fixed, q.quota_milli, dept_in_quota)
    if in_quota(q.quota_milli, dept_quota.quota_milli, milli, used, in_dept):
        if used == project_used:  # everything counted: inside the quota is inside the limits
            return IN_QUOTA
        limit = _limit_reached(project, q, dept_quota, milli, project_used, dept_used)
        if limit:
            return Verdict(False, False, limit)
        whole = in_quota(q.quota_milli, dept_quota.quota_milli, milli, project_used, dept_in_quota)
        return IN_QUOTA if whole else IN_GUARANTEED_QUOTA
    if not may_go_over_quota:
        counted = " of guaranteed work" if project_fixed is not None else ""
        at = _at_quota(project, q, pool, used + milli <= q.quota_milli, used, in_dept, dept_quota, counted)
        return Verdict(False, True, f"{at} and over-quota is off for {kind.value}s")
    limit = _limit_reached(project, q, dept_quota, milli, project_used, dept_used)
    return Verdict(False, True, limit) if limit else OVER_QUOTA


def ceilings(project: Project, dept_quota: Quota, pool: str, may_go_over_quota: bool) -> list[tuple[int, str]]:
    """The most milli-GPUs one workload of ``project`` could ever hold in ``pool``, as
    (milli, what sets it) pairs: ``admit`` refuses more even with nothing else running (the
    limits always; for work that may not go over quota, the project's and the department's
    quotas too). A request above one can never run, so it is refused when submitted."""
    q = project.quotas.get(pool, NO_QUOTA)
    dept = f"department {project.department}"
    where = "" if pool == DEFAULT_POOL else f" in pool {pool}"
    out = []
    if q.limit_milli is not None:
        out.append((q.limit_milli, f"project {project.name} allows at most {_gpus_n(q.limit_milli)}{where} (limit)"))
    if dept_quota.limit_milli is not None:
        out.append((dept_quota.limit_milli,
                    f"{dept} allows at most {_gpus_n(dept_quota.limit_milli)}{where} (limit)"))
    if not may_go_over_quota:
        tail = " to work that may not go over quota"
        out.append((q.quota_milli,
                    f"project {project.name} allows at most {_gpus_n(q.quota_milli)}{where} (quota){tail}"))
        out.append((dept_quota.quota_milli,
                    f"{dept} allows at most {_gpus_n(dept_quota.quota_milli)}{where} (quota){tail}"))
    return out


def resource_reason(who: str, q: Quota | None, held: list[int], cpu_milli: int, memory_mib: int) -> str:
    """Why work asking ``cpu_milli`` and ``memory_mib`` more would pass ``who``'s CPU or
    memory quota ``q`` with ``held`` [CPU milli, memory MiB] already held ("" if not)."""
    if q is None:
        return ""
    if q.cpu_milli is not None and cpu_milli and held[0] + cpu_milli > q.cpu_milli:
        return (f"{who} is at its CPU quota ({held[0] / 1000:g} of {q.cpu_milli / 1000:g} CPUs in use, "
                f"{cpu_milli / 1000:g} more asked)")
    if q.memory_mib is not None and memory_mib and held[1] + memory_mib > q.memory_mib:
        return (f"{who} is at its memory quota ({held[1] / 1024:g} of {q.memory_mib / 1024:g} GiB in "
                f"use, {memory_mib / 1024:g} more asked)")
    return ""


def _gpus_n(milli: float) -> str:
    return f"{milli / MILLI:g} GPU{'' if milli == MILLI else 's'}"


def _limit_reached(project: Project, q: Quota, dept_quota: Quota, milli: int, project_used: int, dept_used: int) -> str:
    """Why ``milli`` more would pass the project's or its department's limit ("" if not)."""
    if q.limit_milli is not None and project_used + milli > q.limit_milli:
        return f"project {project.name} is at its limit {_gpus(q.limit_milli)} GPUs"
    if dept_quota.limit_milli is not None and dept_used + milli > dept_quota.limit_milli:
        return f"department {project.department} is at its limit {_gpus(dept_quota.limit_milli)} GPUs"
    return ""


def counted_usage(project_used: int, project_fixed: int, quota_milli: int, dept_in_quota: int) -> tuple[int, int]:
    """What the in-quota test counts, (project's GPUs, department's in-quota GPUs), for work
    that may not go over quota (inference, workspaces): only the GPUs of the project's work
    that cannot give way
    (``project_fixed``: Workload.gives_way), as Run:ai's "non-preemptible workload is over
    quota" rule counts only non-preemptible GPUs. The project's preemptible, over-quota-able
    GPUs give way to it: it starts in idle GPUs at once, or preempts them inside the
    project (it reclaims from other projects only while the project's whole usage leaves
    room in its quota: actions.evictions.QuotaReclaim). Otherwise a team whose training
    borrowed idle GPUs could not start a guaranteed inference service while the cluster
    sat idle."""
    return project_fixed, dept_in_quota - min(project_used, quota_milli) + min(project_fixed, quota_milli)


def in_quota(quota_milli: int, dept_quota_milli: int, milli: int, project_used: int, dept_in_quota: int) -> bool:
    """Inside both the project's quota and its department's (the department counting only
    its projects' in-quota GPUs). The scheduler's hot path asks this before ``admit``."""
    return project_used + milli <= quota_milli and dept_in_quota + milli <= dept_quota_milli


IN_QUOTA = Verdict(True, False)
IN_GUARANTEED_QUOTA = Verdict(True, False, guaranteed_only=True)
OVER_QUOTA = Verdict(True, True)


def _at_quota(
    project: Project, q: Quota, pool: str, in_project: bool, used: int, dept_in_quota: int, dept_quota: Quota,
    counted: str = "",
) -> str:
    """Which quota a request hit (the project's, or its department's), for a reason;
    ``counted`` says what the GPUs counted are where not all of them."""
    if in_project:
        where = (
            f"department {project.department} is at its quota "
            f"{_gpus(dept_in_quota)}/{_gpus(dept_quota.quota_milli)} GPUs{counted}"
        )
    else:
        where = f"project {project.name} is at its quota {_gpus(used)}/{_gpus(q.quota_milli)} GPUs{counted}"
    return where if pool == "default" else f"{where} in pool {pool}"


# -- fair share over time --------------------------------------------------------------
# A project's over-quota share at one instant is often smaller than any of its pods (a
# pod of 8 GPUs, a fair share 0.3 GPU above the quota): then the instantaneous rule never
# gives it a turn, and the idle GPUs go to whoever fits first. As in Slurm's decayed
# fair-share usage and KAI-Scheduler's time-based fair share, the shares are also kept
# over time: per project and pool, its *lag* = over-quota milli-GPU-seconds it held minus
# those it was entitled to (its weighted share of the over-quota GPUs in use, while it
# wanted more than its quota), decayed with a half-life. In the cycle, the project
# furthest behind goes first for idle GPUs, and a project behind (lag < 0) may reclaim
# over-quota GPUs from one ahead (lag > 0) once their lags lie a whole workload's worth
# apart (``may_catch_up``): granularity is paid back over time instead of never. Only
# while it holds less than its fair share of the instant: the catch up exists for a
# project whose pods are too large for its share, not to push a project that already has
# its share further above it to repay the past (that doubled the preemptions for no gain
# in fairness when the over-quota GPUs are many times a pod).


def over_quota_entitlement(
    over_held: dict[str, float], want_over: dict[str, float], weight: dict[str, float]
) -> dict[str, float]:
    """Each wanting project's weighted share of the over-quota milli in use (water-filling
    by weight, none above what it wants over its quota)."""
    names = [p for p, w in want_over.items() if w > 0 and weight.get(p, 0) > 0]
    total = sum(max(0.0, over_held.get(p, 0.0)) for p in names)
    if not names or total <= 0:
        return dict.fromkeys(names, 0.0)
    got = waterfill(total, [0.0] * len(names), [want_over[p] for p in names], [weight[p] for p in names])
    return dict(zip(names, got))


class OverQuotaLedger:
    """The adapter's record of each (project, pool)'s over-quota lag (see above), in
    milli-GPU-seconds. ``observe`` the usage and waiting work after each change, ``advance``
    to the adapter's clock; ``lag`` goes into ``Snapshot.over_quota_lag``. The core reads
    only that snapshot field (it keeps no clock and no history of its own)."""

    def __init__(self, half_life_s: float):
        check_seconds("fair_share_half_life_s", half_life_s, positive=True)
        self.rate = math.log(2) / half_life_s
        self.t: float | None = None
        self.lag: dict[tuple[str, str], float] = {}
        self.slope: dict[tuple[str, str], float] = {}  # d lag / dt now (milli), before decay

    def advance(self, t: float) -> None:
        if self.t is not None and t > self.t:
            keep = math.exp(-self.rate * (t - self.t))
            gain = (1.0 - keep) / self.rate  # integral of the decay over the step
            for key in set(self.lag) | set(self.slope):
                self.lag[key] = self.lag.get(key, 0.0) * keep + self.slope.get(key, 0.0) * gain
        self.t = t if self.t is None else max(self.t, t)

    def restore(self, lag: Mapping[tuple[str, str], float], at: float, now: float) -> None:
        """Start from a lag recorded at ``at`` (a previous scheduler's), decayed to ``now``;
        its rates come with the next ``observe``."""
        keep = math.exp(-self.rate * max(0.0, now - at))
        self.lag = {key: x * keep for key, x in lag.items()}
        self.slope = {}
        self.t = now

    def lag_at(self, t: float, on: bool = True) -> dict[tuple[str, str], float]:
        """What goes into ``Snapshot.over_quota_lag`` for a cycle at ``t``: the lag advanced to
        ``t``, copied; empty (everyone even) when fair share over time is off."""
        if not on:
            return {}
        self.advance(t)
        return dict(self.lag)

    def observe(
        self, projects: dict[str, Project], held: Mapping[tuple[str, str], float],
        pending_over: Mapping[tuple[str, str], float],
    ) -> None:
        """Usage (milli per (project, pool)) and the pending work that may go over quota,
        from now on until the next observation."""
        by_pool: dict[str, dict[str, tuple[float, float, float]]] = {}
        for key in set(held) | set(pending_over):
            project = projects.get(key[0])
            if project is None:
                continue
            q = project.quotas.get(key[1], NO_QUOTA)
            h = held.get(key, 0.0)
            by_pool.setdefault(key[1], {})[key[0]] = (h - q.quota_milli, h + pending_over.get(key, 0.0) - q.quota_milli, q.over_quota_weight)
        self.slope = {}
        for pool, rows in by_pool.items():
            over = {p: max(0.0, r[0]) for p, r in rows.items()}
            want = {p: r[1] for p, r in rows.items() if r[1] > 0}
            share = over_quota_entitlement(over, want, {p: r[2] for p, r in rows.items()})
            for p in want:
                if p in share:
                    self.slope[(p, pool)] = over[p] - share[p]


def waiting_over_quota(snapshot) -> dict[tuple[str, str], float]:
    """Per (project, pool), the milli-GPUs of a Snapshot's pending work that may go over
    quota: in the pool it names, else in its project's pool with the most quota (where the
    cycle tries it first); GPU-memory requests count as whole GPUs. For adapters that
    ``observe`` the snapshot itself (the replay counts its own queue, the whole of it)."""
    out: dict[tuple[str, str], float] = {}
    for w in snapshot.pending.values():
        project = snapshot.projects.get(w.project)
        if project is None or not w.may_go_over_quota:
            continue
        pools = project.quotas or {DEFAULT_POOL: NO_QUOTA}
        pool = w.node_pool or min(pools, key=lambda p: (-pools[p].gpus, p))
        key = (w.project, pool)
        out[key] = out.get(key, 0.0) + w.gpu_milli_estimate(1)
    return out


def may_catch_up(
    claimant_lag: float, victim_lag: float, milli: int, catch_up_s: float, claimant_held: float, claimant_fair: float
) -> bool:
    """May a project with ``claimant_lag`` reclaim over-quota GPUs from one with
    ``victim_lag``, for a workload of ``milli``? Only while it holds less than its fair
    share now (``claimant_held`` < ``claimant_fair``, milli), only from a project ahead of
    its share while it is behind, and only when their lags lie at least what that workload
    would hold in ``catch_up_s`` apart: a project catches up by whole workloads, and the one
    it took from must fall as far behind it again before it may take back (no ping-pong)."""
    return (
        claimant_held < claimant_fair
        and claimant_lag < 0 < victim_lag
        and victim_lag - claimant_lag >= milli * catch_up_s
    )
