"""``python -m hub_ext.serving`` (the activator without the hub) stops its replicas when it is
stopped: they run in sessions of their own, so nothing else would."""

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MODEL = Path(__file__).with_name("model_server.py")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_stops_the_replicas(tmp_path):
    spec = [{"name": "warm", "command": [sys.executable, str(MODEL), "--startup-s", "0.1"],
             "ready_path": "/health", "min_replicas": 1, "max_replicas": 1, "gpu": 0.25}]
    (tmp_path / "services.json").write_text(json.dumps(spec))
    port = free_port()
    # its replicas' account is made under this test run's prefix (tests/conftest.py), which
    # the session removes at its end
    prefix = os.environ["GPUPOOL_TEST_ACCOUNT_PREFIX"]
    act = subprocess.Popen([sys.executable, "-m", "hub_ext.serving", "--port", str(port),
                            "--services", str(tmp_path / "services.json"), "--loop", "asyncio"],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env={**os.environ, "GPUPOOL_ACCOUNT_PREFIX": prefix})
    try:
        body = wait_for(lambda: get(f"http://127.0.0.1:{port}/warm/predict?ms=0"), 60,
                        "the warm replica to answer through the activator")
        replica = json.loads(body)["pid"]
        assert alive(replica)
        if os.geteuid() == 0:
            owner = pwd.getpwuid(os.stat(f"/proc/{replica}").st_uid).pw_name
            assert owner.startswith(prefix), owner
        act.send_signal(signal.SIGTERM)
        assert act.wait(timeout=30) == 0, act.stderr.read().decode()
        wait_for(lambda: not alive(replica), 10, f"replica {replica} to exit")
    finally:
        if act.poll() is None:
            act.kill()
            act.wait()
