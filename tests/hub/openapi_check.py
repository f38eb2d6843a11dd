"""Validate API responses against hub_ext/api/openapi.yaml."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml
from openapi_schema_validator import OAS31Validator

SPEC = Path(__file__).resolve().parents[2] / "hub_ext" / "api" / "openapi.yaml"


@lru_cache(maxsize=1)
def spec() -> dict:
    return yaml.safe_load(SPEC.read_text())


def _match(path: str) -> str:
    path = path.split("?")[0]
    for template in spec()["paths"]:
        rx = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(rx, path):
            return template
    raise AssertionError(f"{path} is not in the OpenAPI document")


def validate(method: str, path: str, status: int, body) -> None:
    op = spec()["paths"][_match(path)][method.lower()]
    responses = op["responses"]
    assert str(status) in responses, f"{method} {path}: status {status} is not documented"
    resp = responses[str(status)]
    if "$ref" in resp:
        resp = spec()["components"]["responses"][resp["$ref"].split("/")[-1]]
    content = resp.get("content")
    if not content:
        assert body is None, f"{method} {path} {status}: expected no body"
        return
    schema = {**content["application/json"]["schema"], "components": spec()["components"]}
    OAS31Validator(schema).validate(body)
