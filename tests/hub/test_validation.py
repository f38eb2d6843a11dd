"""The validation layer's rules (hub_ext/validation.py), each refusal naming the field and
the limit; the org file and the scheduler's model refuse the same values."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub_ext import validation
from hub_ext.org import projects as org
from hub_ext.schema import make_sessionmaker
from hub_ext.validation import FieldError
from scheduler.model import MAX_GPUS, Quota, ValidationError


def refused(fn, *args, field, limit=None, **kw):
    with pytest.raises(FieldError) as e:
        fn(*args, **kw)
    assert e.value.field == field, e.value
    if limit is not None:
        assert str(limit) in e.value.message, e.value
    return e.value.message


@pytest.mark.parametrize("kind, good, bad", [
    ("name", ["a", "nlp-2", "a" * 63], ["a\n", "A", "-a", "a-", "a" * 64, "", "a b", "a\x00"]),
    ("item", ["k", "s3-key"], ["k\n", "k" * 51]),
    ("user", ["alice", "a.b@c_d-e"], ["alice\n", "al ice", "a" * 256, "", "é"]),
    ("server", ["", "gpu-1", "GPU1"], ["a/b", "é", "a\n", "a" * 64]),
    ("env_key", ["PATH_X", "_a"], ["1A", "A-B", "A\n", "A" * 129]),
    ("file_key", ["key.pem", "_x"], [".hidden", "-x", "a/b", "a\n"]),
])
def test_names_match_their_pattern_in_full(kind, good, bad):
    for n in good:
        assert validation.name(n, "f", kind) == n
    for n in bad:
        refused(validation.name, n, "f", kind, field="f")
    refused(validation.name, {}, "f", kind, field="f")


@pytest.mark.parametrize("raw, multiline, ok", [
    ("plain", False, True), ("tab\there", False, False), ("two\nlines", True, True),
    ("nul\x00", True, False), ("bell\x07", True, False), ("del\x7f", True, False),
    ("c1\x85", True, False), ("\ud800", True, False), ("ok \u00e9\u4e2d", False, True),
])
def test_text_refuses_control_characters_and_lone_surrogates(raw, multiline, ok):
    if ok:
        assert validation.text(raw, "f", multiline=multiline) == raw
    else:
        msg = refused(validation.text, raw, "f", multiline=multiline, field="f")
        assert "surrogate" in msg or "control character" in msg


def test_text_length_and_type():
    refused(validation.text, "x" * 11, "f", 10, field="f", limit=10)
    refused(validation.text, 5, "f", field="f")
    refused(validation.text, "", "f", empty=False, field="f")


@pytest.mark.parametrize("raw", [10**400, "9" * 400, "1e400", float("inf"), float("nan"), "nan",
                                 True, None, [], {}, "abc", -1, 1e7])
def test_numbers_are_bounded(raw):
    refused(validation.number, raw, "gpus", 0, MAX_GPUS, field="gpus", limit="1000000")


def test_numbers_in_range_and_integers():
    assert validation.number("2.5", "x", 0, 3) == 2.5
    assert validation.number(3, "x", 0, 3, integer=True) == 3
    refused(validation.number, 2.5, "x", 0, 3, integer=True, field="x")
    assert validation.integer_arg(None, "limit", 100, 1, 1000) == 100
    for raw in ("0", "1001", "1.5", "1e3", "9" * 400, " 5"):
        refused(validation.integer_arg, raw, "limit", 100, 1, 1000, field="limit")


@given(st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30)))
def test_number_answers_a_field_error_or_a_finite_number(raw):
    try:
        v = validation.number(raw, "x", -5, 5)
    except FieldError as e:
        assert e.field == "x"
    else:
        assert math.isfinite(v) and -5 - 1e-9 <= v <= 5 + 1e-9


@pytest.mark.parametrize("raw, field, end, ok", [
    ("2026-11-29", "from", False, True), ("9999-12-30", "to", True, True),
    ("9999-12-31", "to", True, False),  # its end is year 10000
    ("9999-12-31T23:59:59Z", "to", False, True), ("1969-12-31", "from", False, False),
    ("0001-01-01", "from", False, False), ("2026-13-01", "from", False, False),
    ("x" * 65, "from", False, False), ("2026-11-29\x00", "from", False, False),
])
def test_dates_within_1970_to_9999(raw, field, end, ok):
    if ok:
        assert 0 <= validation.utc_time(raw, field, end) <= validation.MAX_UNIX_TIME
    else:
        refused(validation.utc_time, raw, field, end, field=field)


def test_unix_times():
    assert validation.unix_time("1.5", "since") == 1.5
    for raw in ("-1", "1e400", "2e11" + "0", "x" * 41, "nan"):
        refused(validation.unix_time, raw, "since", field="since")


@pytest.mark.parametrize("raw, want", [
    ("/data/x", "/data/x"), ("//data//x/", "/data/x"), ("/data/./x", "/data/x"), ("///", "/"),
])
def test_paths_are_normalised(raw, want):
    assert validation.path(raw, "p") == want


@pytest.mark.parametrize("raw", ["relative", "/a/../b", "//..", "/a/\x00", "/" + "a" * 1024, 7, "/a\n"])
def test_bad_paths_are_refused(raw):
    refused(validation.path, raw, "p", field="p")


def test_command_and_env_limits():
    assert validation.command("python -c pass") == ["python", "-c", "pass"]
    assert validation.command(["python", "-c", "a\n\tb"]) == ["python", "-c", "a\n\tb"]
    refused(validation.command, [], field="command")
    refused(validation.command, ["x"] * 1025, field="command", limit=1024)
    refused(validation.command, ["x", 3], field="command[1]")
    refused(validation.command, ["x" * 32_769], field="command[0]", limit=32768)
    refused(validation.command, ["x" * 30_000] * 5, field="command", limit=131072)
    assert validation.env({"A": "1\n2"}) == {"A": "1\n2"}
    refused(validation.env, {f"V{i}": "" for i in range(257)}, field="env", limit=256)
    refused(validation.env, {"A": "x" * 32_769}, field="env.A", limit=32768)
    refused(validation.env, {f"V{i}": "x" * 30_000 for i in range(5)}, field="env", limit=131072)
    refused(validation.env, {"1A": "x"}, field="env")
    refused(validation.env, {"A": 1}, field="env.A")
    refused(validation.env, ["A=1"], field="env")


def test_names_lists():
    assert validation.names("a, b", "credentials") == ["a", "b"]
    refused(validation.names, ["a"] * 2, "credentials", field="credentials")
    refused(validation.names, [f"n{i}" for i in range(17)], "credentials", field="credentials", limit=16)
    refused(validation.names, ["ok", "bad\n"], "credentials", field="credentials")
    refused(validation.names, {"a": 1}, "credentials", field="credentials")


@pytest.mark.parametrize("raw, limit", [
    (b'{"a": ' + b"[" * 17 + b"]" * 17 + b"}", 16),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 16),  # beyond Python's recursion limit
    (b'{"a": ' + b"9" * 1001 + b"}", 1000),
    (b"x" * 100, 50),
    (b"[1]", None), (b"not json", None), (b'{"a": "\xff"}', None),
])
def test_bodies(raw, limit):
    msg = refused(validation.json_body, raw, most_bytes=50 if limit == 50 else validation.MAX_BODY_BYTES,
                  field="body", limit=limit)
    assert len(msg) < 300


def test_body_within_the_limits():
    raw = json.dumps({"a": [[[[1]]]], "b": 10**17}).encode()
    assert validation.json_body(raw) == {"a": [[[[1]]]], "b": 10**17}


def test_unknown_fields_are_named_without_echoing_them():
    refused(validation.check_fields, {"colour": 1}, {"name"}, field="colour")
    msg = refused(validation.check_fields, [], {"name"}, field="body")
    assert "object" in msg
    with pytest.raises(FieldError) as e:
        validation.check_fields({"x" * 10_000: 1}, {"name"})
    assert len(e.value.field) < 100


# -- the org file and the scheduler's model ------------------------------------------------------
def _load(tmp_path, text):
    path = tmp_path / "org.yaml"
    path.write_text(text)
    with make_sessionmaker("sqlite://")() as s:
        return org.load_starter(s, path)


@pytest.mark.parametrize("text, field", [
    ("admins: ['admin\\n']", "admins"),
    ("users: [ok, 'b c']", "users"),
    ("departments: [{name: 'r\\n', gpus: 1}]", "departments[0].name"),
    ("departments: [{name: r, gpus: 1, limit: 1.0e+307}]", "departments[0].limit"),
    ("departments: [{name: r, gpus: 1, admins: [x, 'y\\n']}]", "departments[0].admins"),
    ("departments: [{name: r, gpus: 1, projects: [{name: p, gpus: 1, members: ['m\\n']}]}]",
     "departments[0].projects[0].members"),
    ("departments: [{name: r, gpus: 1, projects: [{name: p, gpus: 1, colour: red}]}]",
     "departments[0].projects[0].colour"),
    ("departments: {name: r}", "departments"),
])
def test_org_file_is_checked_by_the_same_rules(tmp_path, text, field):
    refused(_load, tmp_path, text, field=field)


@pytest.mark.parametrize("quota, field", [
    (Quota(gpus=0, limit=1e307), "limit"), (Quota(gpus=1e7), "gpus"),
    (Quota(gpus=float("nan")), "gpus"), (Quota(over_quota_weight=float("inf")), "over_quota_weight"),
    (Quota(gpus=True), "gpus"), (Quota(gpus=2, limit=1), "limit"),
])
def test_scheduler_quota_refuses_impossible_values(quota, field):
    with pytest.raises(ValidationError) as e:
        quota.validate("project[vision].quotas[default]")
    assert e.value.field == f"project[vision].quotas[default].{field}"
    Quota(gpus=MAX_GPUS, limit=MAX_GPUS).validate("ok")
