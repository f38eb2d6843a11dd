"""A hub started by an ordinary OS user cannot start work as other accounts: it runs in
personal mode, where every workload runs as that user and only that user may log in. The
login page and the start-up log say why."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hubclient import HubClient, call
from hubproc import ACCOUNT_PREFIX, ADMIN_PW, USER_PW, Hub, remove_account

from tests.waits import wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make the ordinary user")]
ME = ACCOUNT_PREFIX + "personal"


@pytest.fixture(scope="module")
def personal():
    remove_account(ME)
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", ME], check=True)
    account = pwd.getpwnam(ME)
    workdir = Path(tempfile.mkdtemp(prefix="gpupool-personal-"))
    workdir.chmod(0o755)
    os.chown(workdir, account.pw_uid, account.pw_gid)
    hub = Hub(workdir, user=ME, extra_env={"HOME": account.pw_dir, "USER": ME, "LOGNAME": ME})
    try:
        hub.start()
        yield hub, account
    finally:
        hub.stop()
        remove_account(ME)
        shutil.rmtree(workdir, ignore_errors=True)


def test_login_page_and_log_say_personal_mode(personal):
    hub, _ = personal
    page = urllib.request.urlopen(hub.url + "/hub/login").read().decode()
    assert "Personal mode" in page and f"only {ME} may log in" in page
    assert f"personal mode: this hub runs as {ME}, not root" in hub.log.read_text()


def test_the_start_banner_names_the_one_user_and_the_gateway_it_runs(personal):
    hub, _ = personal
    text = hub.log.read_text()
    said = f"gpupool: log in: {ME} only (personal mode: this hub is not root), with password '{ADMIN_PW}'"
    assert said in text
    m = re.search(r"^gpupool: SSH gateway on port (\d+): ssh -p \1 USER@127\.0\.0\.1 ", text, re.M)
    assert m, text[:2000]

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=10) as s:
                return s.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    wait_for(answers, "the personal hub's SSH gateway", timeout=30)


def test_only_the_hubs_own_user_may_log_in(personal):
    hub, _ = personal
    for user, password in (("alice", USER_PW), ("admin", ADMIN_PW)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            HubClient(hub.url).login(user, password)
        assert refused.value.code == 403
    HubClient(hub.url).login(ME, ADMIN_PW)


def test_workloads_run_as_the_hubs_own_user(personal):
    hub, account = personal
    token = HubClient(hub.url).login(ME, ADMIN_PW).token(ME)
    status, body = call(hub.url, token, "POST", "/workloads",
                        {"kind": "workspace", "project": "nlp", "gpu_mode": "fraction", "gpu_fraction": 0.25})
    assert status == 202, body
    pidfile = hub.workdir / "state" / "run" / f"ws-{ME}" / "child.pid"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not pidfile.exists():
        time.sleep(0.5)
    pid = json.loads(pidfile.read_text())["pid"]
    assert os.stat(f"/proc/{pid}").st_uid == account.pw_uid
