"""schemathesis (a third-party OpenAPI fuzzer) against a real hub, as a member and as an
admin: every operation of the OpenAPI document, a fixed seed and a bounded number of
examples per operation; no 5xx, and every status code, content type and response body as
the document says. Commands the fuzzer submits run in the workloads' folders under the
hub's temporary state folder, checkpoint folders under a sandbox (fuzz_hooks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hubclient import HubClient
from hubproc import ADMIN_PW, USER_PW, Hub

pytestmark = pytest.mark.slow

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
SEED = 26
EXAMPLES = 20  # per operation and phase: keeps the two runs within about 3-4 minutes


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("fuzz"),
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n").start()
    h.tokens = {"alice": HubClient(h.url).login("alice", USER_PW).token("alice"),
                "admin": HubClient(h.url).login("admin", ADMIN_PW).token("admin")}
    yield h
    h.stop()


@pytest.mark.parametrize("user", ["alice", "admin"])  # the member first: the admin's run changes the org
def test_schemathesis_finds_no_failure(fuzz_hub, user, tmp_path):
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    base = fuzz_hub.url + "/services/gpupool/api/v1"
    cmd = [str(Path(sys.executable).parent / "schemathesis"), "run", base + "/openapi.json",
           "--url", base, "-H", f"Authorization: token {fuzz_hub.tokens[user]}",
           "--checks", CHECKS, "--seed", str(SEED), "--max-examples", str(EXAMPLES),
           "--phases", "examples,coverage,fuzzing", "--workers", "1", "--no-shrink",
           "--request-timeout", "30", "--suppress-health-check", "all", "--max-failures", "50",
           "--report", "junit", "--report-dir", str(tmp_path / "report")]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("fuzz_hooks.py")),
           "GPUPOOL_FUZZ_SANDBOX": str(sandbox), "NO_COLOR": "1"}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    out = r.stdout + r.stderr
    print(out[-3000:])  # the phases' counts (pytest -s)
    assert r.returncode == 0, out[-30000:]
    assert "No issues found" in out or " passed" in out, out[-3000:]
