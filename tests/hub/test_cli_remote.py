"""The CLI's remote actions against a real hub with its SSH gateway: exec, port-forward,
ssh --print and logs (--follow) for a workspace, exec for a training worker, and logins
with a key uploaded through PUT /me/ssh-keys."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hubclient import call
from hubkernel import run_code
from hubproc import Hub, account, free_ports
from test_embedded_accounts import login, start_workspace

from hub_ext.ssh import asyncssh
from tests.waits import wait_for

pytestmark = pytest.mark.slow
GPUPOOL = str(Path(sys.executable).parent / "gpupool")


@pytest.fixture(scope="module")
def chub(tmp_path_factory):
    (ssh_port,) = free_ports(1)
    h = Hub(tmp_path_factory.mktemp("cli-remote"), extra_env={"GPUPOOL_SSH_PORT": str(ssh_port)},
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n"
                   "c.Gpupool.ssh_ip = '127.0.0.1'\nc.Gpupool.ssh_host = '127.0.0.1'\n").start()
    h.ssh_port = ssh_port
    login(h)
    start_workspace(h, "alice", "nlp")
    yield h
    h.stop()


def cli_env(h: Hub, tmp_path: Path, user: str = "alice") -> dict:
    return {**os.environ, "GPUPOOL_URL": h.url, "GPUPOOL_TOKEN": h.tokens[user],
            "XDG_CONFIG_HOME": str(tmp_path / "config")}


def gp(h: Hub, tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([GPUPOOL, *args], env=cli_env(h, tmp_path), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_exec_runs_in_the_workspace_and_returns_its_status(chub, tmp_path):
    r = gp(chub, tmp_path, "workspace", "exec", "ws-alice", "--", "sh", "-c", "id -un; echo $GPUPOOL_WORKLOAD; exit 7")
    assert r.returncode == 7, r.stderr
    assert r.stdout.split() == [account("alice"), "ws-alice"]
    known = (tmp_path / "config" / "gpupool" / "known_hosts").read_text()
    assert known.startswith(f"[127.0.0.1]:{chub.ssh_port} ssh-ed25519 ")


def test_exec_prints_only_what_the_command_prints(chub, tmp_path):
    """No warning of the CLI's own (asyncssh's import makes cryptography warn about DSA)."""
    r = gp(chub, tmp_path, "workspace", "exec", "ws-alice", "--", "sh", "-c", "echo out; echo err >&2")
    assert r.returncode == 0 and r.stdout == "out\n", r.stderr
    assert r.stderr == "err\n"


def test_exec_of_a_workspace_that_is_not_running_says_so(chub, tmp_path):
    r = gp(chub, tmp_path, "workspace", "exec", "ws-alice-other", "--", "true")
    assert r.returncode == 1 and "is not running" in r.stderr


def test_ssh_print_gives_a_command_and_a_config_block_that_work(chub, tmp_path):
    r = gp(chub, tmp_path, "workspace", "ssh", "ws-alice", "--print")
    assert r.returncode == 0, r.stderr
    line = r.stdout.splitlines()[0]
    assert line.startswith("ssh -p ") and line.endswith("alice+ws-alice@127.0.0.1")
    assert "Host gpupool-ws-alice" in r.stdout and f"Port {chub.ssh_port}" in r.stdout
    out = subprocess.run(["sshpass", "-e", *line.split(), "-F", "/dev/null", "echo $GPUPOOL_WORKLOAD"],
                         env={**os.environ, "SSHPASS": chub.tokens["alice"]}, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ws-alice", out.stderr


def test_ssh_runs_openssh_with_the_token_as_its_password(chub, tmp_path):
    r = subprocess.run([GPUPOOL, "workspace", "ssh", "ws-alice"], env=cli_env(chub, tmp_path), input="echo $GPUPOOL_WORKLOAD\n",
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ws-alice"
    assert chub.tokens["alice"] not in r.stdout + r.stderr


def test_port_forward_reaches_her_jupyterlab(chub, tmp_path):
    url = run_code(chub.url, "/user/alice/", chub.tokens["alice"],
                   "import os; print(os.environ['JUPYTERHUB_SERVICE_URL'])").strip()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    p = subprocess.Popen([GPUPOOL, "workspace", "port-forward", "ws-alice", f"0:{port}"], env=cli_env(chub, tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        m = re.match(r"Forwarding 127\.0\.0\.1:(\d+) -> ", first)
        assert m, first + p.stderr.read() if p.poll() is not None else first
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/user/alice/api", timeout=20) as r:
            assert "version" in json.loads(r.read())
    finally:
        p.terminate()
        p.wait(10)
    r = gp(chub, tmp_path, "workspace", "port-forward", "ws-alice", "nonsense")
    assert r.returncode != 0 and "LOCAL:REMOTE" in r.stderr


def test_logs_and_follow(chub, tmp_path):
    r = gp(chub, tmp_path, "workspace", "logs", "ws-alice", "--tail", "500")
    assert r.returncode == 0, r.stderr
    assert "jupyterhub-singleuser" in r.stdout or "Jupyter Server" in r.stdout
    p = subprocess.Popen([GPUPOOL, "workspace", "logs", "ws-alice", "--tail", "1", "--follow"],
                         env=cli_env(chub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in p.stdout], daemon=True).start()

    def seen(text: str) -> bool:
        try:
            while True:
                if text in lines.get(timeout=1):
                    return True
        except queue.Empty:
            return False

    try:
        # the follower printed its tail: it follows from there, so the marker comes after it
        wait_for(lambda: seen(""), "the followed log's last line", timeout=60)
        marker = f"follow-marker-{time.time_ns()}"
        # a kernel's raw stdout is the workspace server's log
        run_code(chub.url, "/user/alice/", chub.tokens["alice"], f"import os; os.write(1, b'{marker}\\n')")
        wait_for(lambda: seen(marker), "the marker in the followed log", timeout=60)
    finally:
        p.terminate()
        p.wait(10)
    r = gp(chub, tmp_path, "workspace", "logs", "ws-bob")
    assert r.returncode != 0 and "HTTP 404" in r.stderr


def test_a_workspace_log_is_its_owners_alone(chub, tmp_path):
    """bob shares project nlp with alice: he sees her workspace listed, not its output."""
    r = subprocess.run([GPUPOOL, "workspace", "logs", "ws-alice"], env=cli_env(chub, tmp_path, "bob"),
                       capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "HTTP 403" in r.stderr, r.stderr
    assert "only the workspace's owner, an admin of its department or a platform admin can read its log" \
        in r.stderr, r.stderr
    assert not r.stdout


def test_training_exec_by_rank(chub, tmp_path):
    r = gp(chub, tmp_path, "training", "submit", "sleeper", "--project", "nlp", "--gpu", "0.25", "--", "sleep", "600")
    assert r.returncode == 0, r.stderr

    def running():
        _, t = call(chub.url, chub.tokens["alice"], "GET", "/trainings/sleeper")
        return t.get("status") == "Running"
    wait_for(running, "the training to run", timeout=120)
    r = gp(chub, tmp_path, "training", "exec", "sleeper", "--rank", "0", "--", "sh", "-c", "id -un; pgrep -x sleep")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == account("alice")
    r = gp(chub, tmp_path, "training", "exec", "sleeper", "--rank", "0", "--", "true")
    assert r.returncode == 0
    # bob cannot reach alice's worker
    r = subprocess.run([GPUPOOL, "training", "exec", "sleeper", "--", "true"],
                       env=cli_env(chub, tmp_path, "bob"), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "is not running" in r.stderr
    gp(chub, tmp_path, "training", "delete", "sleeper")


def test_inference_exec_and_logs_by_replica(chub, tmp_path):
    r = gp(chub, tmp_path, "inference", "submit", "echo", "--project", "nlp", "--gpu", "0.25", "--min-replicas", "1",
           "--", "python3", "-u", "-m", "http.server", "{port}", "--bind", "127.0.0.1")
    assert r.returncode == 0, r.stderr

    def running_replica():
        _, s = call(chub.url, chub.tokens["alice"], "GET", "/inferences/echo")
        return next((x["name"] for x in s["status"].get("replica_list", []) if x["state"] == "ready"), None)
    replica = wait_for(running_replica, "a running replica of echo", timeout=120,
                       detail=lambda: json.dumps(call(chub.url, chub.tokens["alice"], "GET", "/inferences/echo")[1]))
    try:
        r = gp(chub, tmp_path, "inference", "exec", "echo", "--replica", replica, "--", "sh", "-c",
               "id -un; echo $GPUPOOL_WORKLOAD")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [account("alice"), replica]
        wait_for(lambda: "Serving HTTP" in gp(chub, tmp_path, "inference", "logs", "echo", "--replica", replica).stdout,
                 "the replica's output in its logs", timeout=60)
        # port-forward to the replica's own port ($PORT)
        port = gp(chub, tmp_path, "inference", "exec", "echo", "--replica", replica, "--", "sh", "-c",
                  "echo $PORT").stdout.strip()
        p = subprocess.Popen([GPUPOOL, "inference", "port-forward", "echo", "--replica", replica, f"0:{port}"],
                             env=cli_env(chub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            m = re.match(r"Forwarding 127\.0\.0\.1:(\d+) -> ", p.stdout.readline())
            assert m, p.stderr.read() if p.poll() is not None else "no forwarding line"
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/", timeout=20) as r_:
                assert "Directory listing for /" in r_.read().decode()
        finally:
            p.terminate()
            p.wait(10)
        r = gp(chub, tmp_path, "inference", "exec", "echo", "--replica", "other-abcdef", "--", "true")
        assert r.returncode != 0 and "not a replica of 'echo'" in r.stderr
    finally:
        gp(chub, tmp_path, "inference", "delete", "echo")


def test_an_uploaded_key_logs_in(chub, tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id_ed25519"
    path.write_bytes(key.export_private_key())
    path.chmod(0o600)
    pub = key.export_public_key().decode().strip() + " me@laptop"
    status, body = call(chub.url, chub.tokens["alice"], "PUT", "/me/ssh-keys", {"keys": [pub]})
    assert status == 200 and body["keys"] == [pub]
    status, body = call(chub.url, chub.tokens["alice"], "PUT", "/me/ssh-keys", {"keys": ["ssh-ed25519 bm90IGEga2V5"]})
    assert status == 400 and body["error"]["field"] == "keys[0]"
    known = tmp_path / "known_hosts"
    _, me = call(chub.url, chub.tokens["alice"], "GET", "/me")
    known.write_text(f"[127.0.0.1]:{chub.ssh_port} {me['ssh_host_key']}\n")
    opts = ["-F", "/dev/null", "-p", str(chub.ssh_port), "-i", str(path), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes"]
    r = subprocess.run(["ssh", *opts, "alice@127.0.0.1", "id -un"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == account("alice"), r.stderr
    r = subprocess.run(["ssh", *opts, "bob@127.0.0.1", "id -un"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 255  # alice's key is not bob's
    _, data = call(chub.url, chub.tokens["admin"], "GET", "/audit?action=ssh.login&actor=alice&limit=1000")
    assert any(e["details"]["method"] == "key" for e in data["items"])


def test_the_home_page_links_to_a_keys_page_that_saves_keys_for_ssh(chub, browser, tmp_path):
    from test_browser import login as browser_login

    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id_browser"
    path.write_bytes(key.export_private_key())
    path.chmod(0o600)
    page = browser_login(browser, chub, "alice")
    page.goto(chub.url + "/hub/home")
    assert page.inner_text("#gpupool-connect .gpupool-ssh-line") == f"ssh -p {chub.ssh_port} alice@127.0.0.1"
    page.click("#gpupool-ssh-keys")
    page.wait_for_url(re.compile(r".*/services/gpupool/ssh-keys$"))
    page.fill("#ssh-keys textarea", key.export_public_key().decode().strip() + " browser")
    page.click("#ssh-keys button")
    page.wait_for_function("document.getElementById('ssh-keys-status').textContent.startsWith('Saved')")
    page.fill("#ssh-keys textarea", "ssh-ed25519 not-base64!")
    page.click("#ssh-keys button")
    page.wait_for_function("document.getElementById('ssh-keys-status').textContent.startsWith('keys[0]')")
    page.context.close()
    _, me = call(chub.url, chub.tokens["alice"], "GET", "/me")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{chub.ssh_port} {me['ssh_host_key']}\n")
    r = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(chub.ssh_port), "-i", str(path), "-o", "IdentitiesOnly=yes",
                        "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes", "alice@127.0.0.1", "id -un"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == account("alice"), r.stderr
