"""The autoscaler as a pure function of samples and time (no sleeping), the service's
hold queue, and the spec rules."""

from __future__ import annotations

import asyncio

import pytest

from hub_ext.serving.spec import FieldError, parse_spec
from inference.autoscaler import Autoscaler, IdleLimit, Policy
from inference.service import Replica, RState, Service


def feed(a: Autoscaler, start: float, end: float, value: float, requests: int = 1, step=1.0):
    t = start
    while t < end:
        t += step
        a.observe(t, value, requests)
    return t


P = Policy(target=10, stable_window_s=60, min_replicas=0, max_replicas=10, scale_to_zero_after_s=300)


def test_stable_load_gives_load_over_target():
    a = Autoscaler(P, 0)
    t = feed(a, 0, 60, 30)
    rec = a.recommend(t, current=3, in_flight=30)
    assert rec.replicas == 3 and not rec.panic


def test_burst_panics_to_the_panic_window_and_never_scales_down_while_panicking():
    a = Autoscaler(P, 0)
    t = feed(a, 0, 60, 10)  # one replica's worth for a minute
    t = feed(a, t, t + 6, 80)  # the panic window (6 s) at 8x the target
    rec = a.recommend(t, current=1, in_flight=80)
    assert rec.panic and rec.replicas == 8
    t = feed(a, t, t + 6, 10)  # burst over: still panicking, no scale-down
    assert a.recommend(t, current=8, in_flight=10).replicas == 8
    t = feed(a, t, t + 61, 10)  # a stable window without a burst ends panic
    rec = a.recommend(t, current=8, in_flight=10)
    assert not rec.panic


def test_scale_down_waits_for_the_stable_window():
    a = Autoscaler(Policy(target=10, stable_window_s=60, panic_threshold_pct=1000), 0)
    t = feed(a, 0, 60, 40)
    assert a.recommend(t, current=4, in_flight=40).replicas == 4
    t = feed(a, t, t + 30, 0)  # load gone for half a window: still 4 (max over window)
    for _ in range(30):
        rec = a.recommend(t, current=4, in_flight=0)
    assert rec.replicas == 4
    t = feed(a, t, t + 61, 0)  # a whole window since the last higher recommendation
    assert a.recommend(t, current=4, in_flight=0).replicas == 1  # idle < scale_to_zero_after


def test_scale_to_zero_after_idle_only_with_nothing_in_flight():
    pol = Policy(target=10, stable_window_s=10, scale_to_zero_after_s=30)
    a = Autoscaler(pol, 0)
    t = feed(a, 0, 10, 5)
    t = feed(a, t, t + 29, 0, requests=0)
    assert a.recommend(t, current=1, in_flight=0).replicas == 1
    t = feed(a, t, t + 2, 0, requests=0)
    assert a.recommend(t, current=1, in_flight=1).replicas == 1  # a long request: keep it
    assert a.recommend(t, current=1, in_flight=0).replicas == 0


@pytest.mark.parametrize("policy,current,held,want", [
    pytest.param(Policy(target=10), 0, 1, 1, id="held-at-zero-activates"),
    pytest.param(Policy(target=10, min_replicas=2), 0, 0, 2, id="min-replicas"),
    pytest.param(Policy(target=1, max_replicas=3), 0, 50, 3, id="max-replicas"),
])
def test_bounds_and_activation(policy, current, held, want):
    a = Autoscaler(policy, 0)
    a.observe(1, float(held), held)
    assert a.recommend(1, current=current, in_flight=held, held=held).replicas == want


def test_throughput_metric_uses_requests_per_second():
    spec = parse_spec({"name": "t", "project": "p", "command": ["x"], "metric": "throughput",
                       "target": 5})
    now = [0.0]
    svc = Service(spec, clock=lambda: now[0])
    for _ in range(20):
        svc.begin()
        svc.end()
    now[0] = 1.0
    svc.sample()
    assert svc.recommend().replicas == 4  # 20 req/s over a target of 5 per replica


def test_held_requests_are_released_in_arrival_order():
    async def main():
        spec = parse_spec({"name": "o", "project": "p", "command": ["x"]})
        svc = Service(spec)
        order = []

        async def req(i):
            r = await svc.acquire()
            order.append(i)
            r.inflight -= 1

        tasks = [asyncio.ensure_future(req(i)) for i in range(50)]
        await asyncio.sleep(0)
        assert len(svc.held) == 50
        rep = Replica("o-1", "o", RState.STARTING)
        svc.replicas.append(rep)
        svc.replica_ready(rep, "127.0.0.1", 1)
        await asyncio.gather(*tasks)
        assert order == list(range(50))

    asyncio.run(main())


BASE = {"name": "s", "project": "p", "command": ["serve"]}


@pytest.mark.parametrize("over,field,words", [
    ({"name": "Bad_Name"}, "name", "lowercase"),
    ({"gpu": 0}, "gpu", "from 0.05 to 8"),
    ({"gpu": 1.5}, "gpu", "whole number"),
    ({"min_replicas": -1}, "min_replicas", "from 0 to 100"),
    ({"max_replicas": 0}, "max_replicas", "from 1 to 100"),
    ({"min_replicas": 5, "max_replicas": 2}, "min_replicas", "<= max_replicas"),
    ({"metric": "latency"}, "metric", "concurrency, throughput"),
    ({"target": "ten"}, "target", "must be a number"),
    ({"scale_to_zero_after_s": -5}, "scale_to_zero_after_s", "from 0 to 86400"),
    ({"port": 70000}, "port", "from 1 to 65535"),
    ({"command": []}, "command", "non-empty"),
    ({"public": "yes"}, "public", "true or false"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_bad_spec_names_the_field_and_the_range(over, field, words):
    with pytest.raises(FieldError) as e:
        parse_spec({**BASE, **over})
    assert e.value.field == field and words in e.value.message


def test_project_must_be_one_of_yours():
    with pytest.raises(FieldError, match="your projects"):
        parse_spec(BASE, projects=("other",))


# -- a policy's idle timeout of services (IdleLimit): over min_replicas ------------------------
LIMIT = IdleLimit(60, "project nlp's policy")


def test_the_policy_idle_limit_scales_to_zero_over_min_replicas():
    a = Autoscaler(Policy(target=10, stable_window_s=10, min_replicas=2, scale_to_zero_after_s=300,
                          idle_limit=LIMIT), 0)
    t = feed(a, 0, 59, 0, requests=0)
    assert a.recommend(t, current=2, in_flight=0).replicas == 2  # min_replicas holds until then
    t = feed(a, t, t + 1, 0, requests=0)
    rec = a.recommend(t, current=2, in_flight=0)
    assert rec.replicas == 0 and rec.idle_limited
    assert "idle timeout of an inference service (60 s, project nlp's policy)" in rec.why
    assert a.recommend(t, current=2, in_flight=1).replicas == 2  # a request in flight: kept
    # the next request wakes it; min_replicas holds again until idle that long once more
    assert a.recommend(t, current=0, in_flight=1, held=1).replicas == 2
    a.request_seen(t)
    rec = a.recommend(t + 59, current=2, in_flight=0)
    assert rec.replicas == 2 and not rec.idle_limited
    assert a.recommend(t + 60, current=2, in_flight=0).replicas == 0


def test_the_shorter_of_the_services_own_timeout_and_the_policys_wins():
    own_first = Autoscaler(Policy(target=10, stable_window_s=10, scale_to_zero_after_s=30,
                                  idle_limit=LIMIT), 0)
    t = feed(own_first, 0, 31, 0, requests=0)
    rec = own_first.recommend(t, current=1, in_flight=0)
    assert rec.replicas == 0 and not rec.idle_limited  # the service's own setting did it
    policy_first = Autoscaler(Policy(target=10, stable_window_s=10, scale_to_zero_after_s=300,
                                     idle_limit=LIMIT), 0)
    t = feed(policy_first, 0, 61, 0, requests=0)
    rec = policy_first.recommend(t, current=1, in_flight=0)
    assert rec.replicas == 0 and rec.idle_limited


def test_the_service_records_one_policy_stop_per_scale_to_zero():
    now = [0.0]
    spec = parse_spec({"name": "s", "project": "nlp", "command": ["x"], "min_replicas": 1,
                       "scale_to_zero_after_s": 300})
    svc = Service(spec, clock=lambda: now[0], idle_limit=LIMIT)
    svc.replicas.append(Replica("s-000001", "s", RState.READY))
    assert svc.recommend().replicas == 1 and svc.status()["idle_stop"] is None
    now[0] = 61.0
    assert svc.recommend().replicas == 0
    stop = svc.status()["idle_stop"]
    assert stop["message"] == ("s scaled to zero from 1 replica: no request for longer than the idle "
                               "timeout of an inference service (60 s, project nlp's policy); the next "
                               "request starts it again")
    svc.replicas.clear()  # the controller stopped it
    now[0] = 70.0
    assert svc.recommend().replicas == 0 and svc.status()["idle_stop"] is stop  # one stop, one record
