"""The repository's gpupool_config.py is generated from the options themselves and lists
every one; a bad Gpupool.ssh_port stops ``gpupool up`` with a message, not a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from hub_ext.config import Gpupool

ROOT = Path(__file__).resolve().parents[1]
GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def test_the_checked_in_sample_config_is_the_generated_one():
    out = subprocess.run([GPUPOOL, "sample-config"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert (ROOT / "gpupool_config.py").read_text() == out.stdout, \
        "gpupool_config.py is stale: run `.venv/bin/gpupool sample-config > gpupool_config.py`"


def test_the_sample_config_lists_every_option_once_and_sets_none():
    text = (ROOT / "gpupool_config.py").read_text()
    listed = re.findall(r"^# c\.Gpupool\.(\w+) = ", text, re.M)
    assert listed == sorted(Gpupool.class_traits(config=True))
    assert "ssh_port" in listed and "backend" in listed and "accounts" in listed
    config = PyFileConfigLoader("gpupool_config.py", str(ROOT)).load_config()
    assert not config.get("Gpupool")  # every option commented out: the defaults hold
    # an option whose default is computed (environment, machine) shows `...`: its help,
    # printed above it, says what the default is
    traits = Gpupool.class_traits(config=True)
    for name in re.findall(r"^# c\.Gpupool\.(\w+) = \.\.\.$", text, re.M):
        assert "Default: " in traits[name].help, name


def _up(tmp_path: Path, config: str, **env: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "gpupool_config.py"
    cfg.write_text("c = get_config()  # noqa\n" + config)
    cfg.chmod(0o600)
    environ = {k: v for k, v in os.environ.items() if k != "GPUPOOL_SSH_PORT"}
    environ.update(GPUPOOL_STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run([GPUPOOL, "up", "--config", str(cfg)], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("value", ["-1", "65536", "'2222'", "2.5"])
def test_a_bad_ssh_port_stops_gpupool_up_with_the_allowed_values(tmp_path, value):
    r = _up(tmp_path, f"c.Gpupool.ssh_port = {value}\n")
    assert r.returncode == 1 and not r.stdout, r.stdout
    assert "Traceback" not in r.stderr and "ssh_port" in r.stderr, r.stderr
    if value in ("-1", "65536"):
        assert "Gpupool.ssh_port: must be 0 (no gateway), a port from 1 to 65535, or unset" in r.stderr


def test_a_bad_ssh_port_in_the_environment_is_named(tmp_path):
    r = _up(tmp_path, "", GPUPOOL_SSH_PORT="ssh")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "GPUPOOL_SSH_PORT: must be 0 (no gateway), a port from 1 to 65535, or unset" in r.stderr
    assert "got 'ssh'" in r.stderr
