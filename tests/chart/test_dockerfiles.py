"""The images' Dockerfiles pass BuildKit's Dockerfile checks (the rules of
``docker build --check``: docker/lint/main.go, built from github.com/moby/buildkit by
scripts/test-cluster); the images themselves need a Docker engine and are not built here."""

from __future__ import annotations

import subprocess

import pytest

from .chartlib import REPO

DOCKERFILES = sorted((REPO / "docker").glob("*/Dockerfile"))


def lint(tool, *files) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *map(str, files)], capture_output=True, text=True,
                          timeout=120)


def test_every_image_has_a_dockerfile():
    assert {p.parent.name for p in DOCKERFILES} == {"hub", "scheduler", "node-agent", "workspace"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfile_passes_buildkit_checks(dockerfile_lint, dockerfile):
    p = lint(dockerfile_lint, dockerfile)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_linter_reports_findings(dockerfile_lint, tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("from python:3.12 as base\nENV A 1\nMAINTAINER me\nCMD python -m x\n"
                   "COPY ${SRC_DIR} /app\n")
    p = lint(dockerfile_lint, bad)
    assert p.returncode == 1
    rules = {line.split(": ")[1] for line in p.stdout.splitlines()}
    assert {"LegacyKeyValueFormat", "MaintainerDeprecated", "JSONArgsRecommended",
            "UndefinedVar"} <= rules, p.stdout
    assert f"{bad}:2: LegacyKeyValueFormat" in p.stdout
