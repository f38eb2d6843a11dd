"""Which nodes a pod's claims allow, and when they keep it waiting; GPU reservations by slot (pure: no cluster)."""

from __future__ import annotations

import pytest

from scheduler.constraints import Requirement, Term
from scheduler.kubernetes.objects import pod_claims
from scheduler.kubernetes.volumes import Volumes


def _class(name: str, mode: str, default: bool = False, zones: tuple[str, ...] = ()) -> dict:
    sc = {"metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}
                       if default else {}}, "volumeBindingMode": mode}
    if zones:
        sc["allowedTopologies"] = [{"matchLabelExpressions": [{"key": "zone", "values": list(zones)}]}]
    return sc


def _claim(name: str, sc: str | None = None, volume: str = "") -> dict:
    spec: dict = {"volumeName": volume} if volume else {}
    if sc is not None:
        spec["storageClassName"] = sc
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def test_claims_keep_a_pod_waiting_or_restrict_its_node():
    v = Volumes()
    v.on_class("ADDED", _class("local", "WaitForFirstConsumer", default=True, zones=("z1",)))
    v.on_class("ADDED", _class("now", "Immediate"))
    v.on_claim("ADDED", _claim("home"))  # the default class: WaitForFirstConsumer
    v.on_claim("ADDED", _claim("fast", "now"))
    v.on_claim("ADDED", _claim("gone-class", "nope"))
    v.on_claim("ADDED", _claim("pinned", "now", volume="pv-1"))
    assert v.on_volume("ADDED", {"metadata": {"name": "pv-1"}, "spec": {
        "claimRef": {"namespace": "ns", "name": "pinned"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}) == "ns/pinned"
    zone = (Term((Requirement("zone", "In", ("z1",)),)),)
    on_n1 = (Term((), (Requirement("metadata.name", "In", ("n1",)),)),)
    assert v.needs("ns", ("home",)) == (None, (zone,))
    assert v.needs("ns", ("home", "pinned")) == (None, (zone, on_n1))
    assert v.needs("ns", ("fast",)) == (None, ())  # unbound Immediate: the kubelet waits for it
    assert v.needs("ns", ("missing",)) == ('persistentvolumeclaim "missing" not found', ())
    assert v.needs("ns", ("gone-class",)) == ('storageclass.storage.k8s.io "nope" not found', ())
    v.on_volume("DELETED", {"metadata": {"name": "pv-1"}, "spec": {}})
    assert "does not exist" in v.needs("ns", ("pinned",))[0]


def test_a_pod_names_its_claims_and_its_ephemeral_volumes_claims():
    spec = {"volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
                        {"name": "cfg", "configMap": {"name": "x"}}]}
    assert pod_claims(spec, "jupyter-alice") == ("claim-alice", "jupyter-alice-scratch")


def test_reservations_by_slot_and_the_ones_no_fraction_uses():
    from scheduler.kubernetes.reservations import RESERVED, Reservations, reservation_pod

    obj = reservation_pod("n1", 3, "gpupool", "img", "sa")
    assert obj["spec"]["nodeName"] == "n1" and obj["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    r = Reservations()
    obj["metadata"]["uid"] = "u1"
    r.on_pod("ADDED", obj)
    assert r.uuid("n1", 3) is None  # no GPU reported yet
    obj["metadata"]["annotations"][RESERVED] = "GPU-1"
    r.on_pod("MODIFIED", obj)
    assert r.uuid("n1", 3) == "GPU-1"
    assert r.unused({("n1", 3)}) == [] and r.unused(set()) == [obj]
    r.on_pod("DELETED", dict(obj, metadata=dict(obj["metadata"], uid="older")))  # another life's
    assert r.uuid("n1", 3) == "GPU-1"
    r.on_pod("DELETED", obj)
    assert r.uuid("n1", 3) is None


def test_the_reservations_command_is_the_schedulers_unless_told():
    from scheduler.kubernetes.cli import parse_args
    from scheduler.kubernetes.reservations import reservation_pod

    default = parse_args([]).reservation_command
    assert reservation_pod("n1", 0, "ns", "img", "sa", default)["spec"]["containers"][0]["command"] == [
        "python", "-m", "scheduler.kubernetes.reservations"]
    given = parse_args(["--reservation-command", "/fake-gpu report --annotation 'a b'"]).reservation_command
    assert given == ("/fake-gpu", "report", "--annotation", "a b")
    entrypoint = parse_args(["--reservation-command", ""]).reservation_command
    assert "command" not in reservation_pod("n1", 0, "ns", "img", "sa", entrypoint)["spec"]["containers"][0]
    with pytest.raises(SystemExit):
        parse_args(["--reservation-command", "'unclosed"])
