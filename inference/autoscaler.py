"""Desired replicas from observed load, in the style of Knative's KPA. Pure: samples and
the time come in, a number goes out; no clock, no I/O, so tests need no sleeping.

* A sample is the load of one metering period: the time-averaged number of requests in
  flight (held ones included) for the ``concurrency`` metric, requests per second for
  ``throughput``.
* Stable mode: ``ceil(mean over the stable window / target)``.
* Panic mode: when the mean over the panic window (``panic_window_pct`` of the stable
  window) reaches ``panic_threshold_pct`` of what the current replicas are meant to carry,
  scale to ``ceil(panic mean / target)`` at once and never down while panicking; panic
  ends after a stable window without a new burst.
* Scale-down: only to the highest recommendation seen over the last stable window, so
  a lower count must hold for a whole window first.
* Scale to zero: with ``min_replicas == 0``, after ``scale_to_zero_after_s`` without any
  request and with nothing in flight. A request held at zero replicas always asks for one.
* A project's policy may bound how long a service holds replicas without requests
  (``idle_limit``, the policy's ``idle_timeout_inference_s``): after that long without any
  request and with nothing in flight or held it scales to zero whatever ``min_replicas``
  says; the next request wakes it as from any zero, and ``min_replicas`` holds again
  until the service is idle that long once more.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class IdleLimit:
    """A policy's bound on the time a service holds replicas without requests."""

    seconds: float
    policy: str  # whose: "project nlp's policy"


@dataclass(frozen=True)
class Policy:
    target: float
    stable_window_s: float = 60.0
    panic_window_pct: float = 10.0
    panic_threshold_pct: float = 200.0
    min_replicas: int = 0
    max_replicas: int = 4
    scale_to_zero_after_s: float = 300.0
    idle_limit: IdleLimit | None = None

    @classmethod
    def of(cls, spec, idle_limit: IdleLimit | None = None) -> Policy:
        return cls(spec.target, spec.stable_window_s, spec.panic_window_pct,
                   spec.panic_threshold_pct, spec.min_replicas, spec.max_replicas,
                   spec.scale_to_zero_after_s, idle_limit)

    @property
    def panic_window_s(self) -> float:
        return self.stable_window_s * self.panic_window_pct / 100.0


@dataclass(frozen=True)
class Recommendation:
    replicas: int
    panic: bool
    stable_value: float
    panic_value: float
    why: str
    idle_limited: bool = False  # zero because of the policy's idle limit, not the service's own rules


class Autoscaler:
    def __init__(self, policy: Policy, now: float):
        self.policy = policy
        self._samples: deque[tuple[float, float]] = deque()  # (time, value)
        self._recs: deque[tuple[float, int]] = deque()  # (time, unclamped stable rec)
        self._last_request = now
        self._panic_since: float | None = None
        self._panic_max = 0

    def observe(self, now: float, value: float, requests: int) -> None:
        """One metering period ending at ``now``: its load and how many requests began."""
        self._samples.append((now, value))
        if requests:
            self._last_request = now
        horizon = now - self.policy.stable_window_s
        while self._samples and self._samples[0][0] <= horizon:
            self._samples.popleft()

    def request_seen(self, now: float) -> None:
        self._last_request = now

    def _mean(self, now: float, window: float) -> float:
        vals = [v for t, v in self._samples if t > now - window]
        return sum(vals) / len(vals) if vals else 0.0

    def recommend(self, now: float, current: int, in_flight: int, held: int = 0) -> Recommendation:
        """``current``: replicas asked for and not failed (starting or ready)."""
        p = self.policy
        stable = self._mean(now, p.stable_window_s)
        panic = self._mean(now, max(p.panic_window_s, 1e-9))
        want_stable = math.ceil(stable / p.target - 1e-9)
        want_panic = math.ceil(panic / p.target - 1e-9)

        # Panic when the burst is at the threshold of what the current replicas carry.
        if panic >= p.target * max(current, 1) * p.panic_threshold_pct / 100.0 and panic > 0:
            if self._panic_since is None:
                self._panic_max = 0
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= p.stable_window_s:
            self._panic_since = None

        self._recs.append((now, want_stable))
        while self._recs and self._recs[0][0] <= now - p.stable_window_s:
            self._recs.popleft()

        if self._panic_since is not None:
            self._panic_max = max(self._panic_max, want_panic, current)
            want, why = self._panic_max, f"panic: {panic:.3g} over {p.panic_window_s:g}s"
        else:
            want = want_stable
            why = f"stable: {stable:.3g} over {p.stable_window_s:g}s"
            if want < current:  # scale down only to the window's highest recommendation
                want = min(current, max(r for _, r in self._recs))
                if want < current:
                    why += ", scaling down"
        idle = now - self._last_request
        if want == 0 and p.min_replicas == 0 and (idle < p.scale_to_zero_after_s or in_flight):
            want = 1 if (current or in_flight) else 0  # keep one until idle long enough
            why += f", idle {idle:.0f}s of {p.scale_to_zero_after_s:g}s before zero"
        if held and want == 0:
            want, why = 1, "activating: requests held at zero replicas"
        clamped = max(p.min_replicas, min(p.max_replicas, want))
        if clamped != want:
            why += f", clamped to [{p.min_replicas}, {p.max_replicas}]"
        lim = p.idle_limit
        if lim is not None and clamped and idle >= lim.seconds and not (in_flight or held):
            return Recommendation(0, False, stable, panic, f"no request for {idle:.0f}s: the idle "
                                  f"timeout of an inference service ({lim.seconds:g} s, {lim.policy})",
                                  idle_limited=True)
        return Recommendation(clamped, self._panic_since is not None, stable, panic, why)


__all__ = ["Autoscaler", "IdleLimit", "Policy", "Recommendation"]
