"""The OpenAPI document and the validation layer (hub_ext/validation.py) say the same:
every pattern, length, count and maximum the document gives is the one the code checks,
and every operation documents the errors every request can get."""

import re

import pytest
from openapi_check import SPEC, spec

from hub_ext import validation as v
from hub_ext.attachments.credentials import MAX_VALUE_BYTES
from hub_ext.serving.spec import _NUMBERS as INFERENCE_NUMBERS
from hub_ext.training.spec import MAX_WORKERS

METHODS = ("get", "post", "put", "patch", "delete")


def schema(name: str) -> dict:
    return spec()["components"]["schemas"][name]


def prop(schema_name: str, field: str) -> dict:
    """A property of a schema, through allOf and a $ref to one of the rule schemas."""
    s = schema(schema_name)
    parts = s.get("allOf", [s])
    for part in parts:
        part = schema(part["$ref"].split("/")[-1]) if "$ref" in part else part
        if field in part.get("properties", {}):
            p = dict(part["properties"][field])
            if "$ref" in p:
                return {**schema(p.pop("$ref").split("/")[-1]), **p}
            return p
    raise KeyError(f"{schema_name}.{field}")


def anchored(kind: str) -> str:
    return f"^{v.PATTERNS[kind][0]}$"


RULES = [  # (schema, what it must say, the code's value)
    ("Name", "pattern", anchored("name")),
    ("ItemName", "pattern", anchored("item")),
    ("UserName", "pattern", anchored("user")),
    ("ServerName", "pattern", anchored("server")),
    ("Gpus", "maximum", v.MAX_GPUS),
    ("Weight", "maximum", v.MAX_WEIGHT),
    ("Command", "maxItems", v.MAX_COMMAND_ARGS),
    ("AbsolutePath", "maxLength", v.MAX_TEXT),
    ("Image", "maxLength", v.MAX_IMAGE_CHARS),
    ("Attached", "maxItems", 16),
    ("Description", "maxLength", v.MAX_DESCRIPTION),
    ("Env", "maxProperties", v.MAX_ENV),
]


@pytest.mark.parametrize("name, key, value", RULES, ids=[f"{n}.{k}" for n, k, _ in RULES])
def test_rule_schemas_match_the_code(name, key, value):
    assert schema(name)[key] == value


def test_nested_rules_match_the_code():
    assert schema("Command")["items"]["maxLength"] == v.MAX_ARG_CHARS
    assert schema("Env")["propertyNames"]["pattern"] == anchored("env_key")
    assert schema("Env")["additionalProperties"]["maxLength"] == v.MAX_ENV_VALUE_CHARS
    # totals JSON Schema cannot state are in the descriptions
    assert f"at most {v.MAX_ENV_CHARS} characters in all" in schema("Env")["description"]
    assert f"at most {v.MAX_COMMAND_CHARS} characters in all" in schema("Command")["description"]
    assert schema("CredentialCreate")["properties"]["data"]["additionalProperties"]["maxLength"] \
        == MAX_VALUE_BYTES
    assert prop("Quota", "limit")["maximum"] == v.MAX_GPUS
    assert prop("ProjectWrite", "members")["maxItems"] == v.MAX_MEMBERS
    assert prop("TrainingRequest", "workers")["maximum"] == MAX_WORKERS
    assert prop("TrainingRequest", "node_pool")["pattern"] == anchored("name")
    assert prop("TrainingRequest", "checkpoint_dir")["maxLength"] == v.MAX_TEXT
    assert prop("InferenceRequest", "ready_path")["maxLength"] == v.MAX_TEXT
    assert prop("SshKeys", "keys")["maxItems"] == v.MAX_SSH_KEYS
    assert prop("SshKeys", "keys")["items"]["maxLength"] == v.MAX_SSH_KEY_CHARS
    for field, (_default, lo, hi, _integer, _unit) in INFERENCE_NUMBERS.items():
        p = prop("InferenceRequest", field)
        assert (p["minimum"], p.get("maximum")) == (lo, hi), field


@pytest.mark.parametrize("schema_name, field, rule", [
    ("DepartmentCreate", "name", "Name"), ("ProjectWrite", "name", "Name"),
    ("ProjectWrite", "department", "Name"), ("WorkloadRequest", "name", "Name"),
    ("WorkloadRequest", "project", "Name"), ("WorkloadRequest", "owner", "UserName"),
    ("WorkloadRequest", "server_name", "ServerName"), ("WorkloadRequest", "command", "Command"),
    ("TrainingRequest", "name", "Name"), ("TrainingRequest", "owner", "UserName"),
    ("TrainingRequest", "command", "Command"), ("TrainingRequest", "env", "Env"),
    ("TrainingRequest", "image", "Image"), ("InferenceRequest", "name", "Name"),
    ("InferenceRequest", "command", "Command"), ("InferenceRequest", "env", "Env"),
    ("CredentialCreate", "name", "ItemName"), ("DataSourceCreate", "name", "ItemName"),
    ("DataSourceCreate", "mount_path", "AbsolutePath"), ("DataSourceCreate", "path", "AbsolutePath"),
])
def test_request_fields_use_the_rules(schema_name, field, rule):
    s = schema(schema_name)
    parts = [schema(p["$ref"].split("/")[-1]) if "$ref" in p else p for p in s.get("allOf", [s])]
    ref = next(p["properties"][field] for p in parts if field in p.get("properties", {}))
    assert ref["$ref"] == f"#/components/schemas/{rule}"


def test_every_pattern_in_the_document_is_a_rule_of_the_code():
    known = {anchored(k) for k in v.PATTERNS} | {
        "^/",  # paths (AbsolutePath, ready_path); validation.path refuses '..' too
        "^(/.*)?$",  # checkpoint_dir: a path or empty
        f"^(\\*|{v.PATTERNS['name'][0]})$",  # a role's department: a name or '*'
    }
    found = set(re.findall(r"pattern: '([^']*)'", SPEC.read_text()))
    assert found <= known, found - known


def test_every_operation_documents_its_errors():
    for path, item in spec()["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            codes = set(op["responses"])
            if path != "/openapi.json":
                assert "401" in codes, f"{method.upper()} {path} does not document 401"
            if "requestBody" in op:
                assert {"400", "413"} <= codes, f"{method.upper()} {path}: 400 and 413"


def test_names_are_matched_in_full():
    """re.match('^...$') accepts a trailing newline; the rules never do."""
    for kind in v.PATTERNS:
        assert re.match(f"^{v.PATTERNS[kind][0]}$", "a\n")  # the pitfall
        assert not v.is_name("a\n", kind) and not v.is_name("a\x00", kind)


def test_the_policy_schema_is_the_code_s():
    from hub_ext.org import policy

    props = schema("Policy")["properties"]
    assert set(props) == set(policy.FIELDS)
    for key, (lo, hi, integer, _unit) in policy.NUMBERS.items():
        assert (props[key]["minimum"], props[key]["maximum"]) == (lo, hi), key
        assert props[key]["type"] == ("integer" if integer else "number"), key
    for key in policy.LISTS:
        assert props[key]["maxItems"] == policy.MAX_LIST, key
