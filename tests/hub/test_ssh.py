"""The SSH gateway on a real hub, with Debian's OpenSSH client: a login with a JupyterHub
token lands in the workspace's own environment (account, cgroup, GPU env), SFTP and local
forwards work as VS Code Remote-SSH needs them, and the refusals hold."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hubclient import HubClient, call
from hubkernel import run_code
from hubproc import USER_PW, Hub, account, free_ports
from test_embedded_accounts import login, start_workspace

from hub_ext import validation
from hub_ext.ssh import asyncssh
from hub_ext.ssh.throttle import Throttle
from hub_ext.validation import FieldError
from tests.waits import wait_for

pytestmark = pytest.mark.slow

PROBE = ("import json, os; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'home': os.environ['HOME'], "
         "'env': {k: os.environ.get(k, '') for k in ('CUDA_VISIBLE_DEVICES', 'GPUPOOL_MEMORY_LIMIT', "
         "'GPUPOOL_GPU_FRACTION', 'LD_PRELOAD', 'GPUPOOL_WORKLOAD')}, "
         "'cgroup': open('/proc/self/cgroup').read()}))")


@pytest.fixture(scope="module")
def shub(tmp_path_factory):
    (ssh_port,) = free_ports(1)
    h = Hub(tmp_path_factory.mktemp("ssh"), extra_env={"GPUPOOL_SSH_PORT": str(ssh_port)},
            config="c = get_config()  # noqa\nc.Gpupool.schedule_period_s = 0.5\n"
                   "c.Gpupool.ssh_ip = '127.0.0.1'\nc.Gpupool.ssh_max_failures = 10\n").start()
    h.ssh_port = ssh_port
    login(h)
    start_workspace(h, "alice", "nlp")
    _, me = call(h.url, h.tokens["alice"], "GET", "/me")
    assert me["ssh_port"] == ssh_port and me["ssh_host_key"].startswith("ssh-ed25519 ")
    h.known_hosts = h.workdir / "known_hosts"
    h.known_hosts.write_text(f"[127.0.0.1]:{ssh_port} {me['ssh_host_key']}\n")
    yield h
    h.stop()


def ssh_opts(h: Hub) -> list[str]:
    return ["-p", str(h.ssh_port), "-o", f"UserKnownHostsFile={h.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no",
            "-o", "NumberOfPasswordPrompts=1", "-o", "ConnectTimeout=20", "-F", "/dev/null"]


def ssh(h: Hub, user: str, token: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["sshpass", "-e", "ssh", *ssh_opts(h), *args[:-1], f"{user}@127.0.0.1", args[-1]]
                          if args else ["sshpass", "-e", "ssh", *ssh_opts(h), f"{user}@127.0.0.1"],
                          env={**os.environ, "SSHPASS": token}, capture_output=True, text=True, timeout=timeout)


def kernel_view(h: Hub) -> dict:
    return json.loads(run_code(h.url, "/user/alice/", h.tokens["alice"], PROBE))


def test_a_shell_sees_what_the_workspace_kernel_sees(shub):
    r = ssh(shub, "alice", shub.tokens["alice"], f"python3 -c \"{PROBE}\"")
    assert r.returncode == 0, r.stderr
    over_ssh = json.loads(r.stdout)
    assert over_ssh == kernel_view(shub)
    assert over_ssh["uid"] != 0 and over_ssh["env"]["GPUPOOL_WORKLOAD"] == "ws-alice"
    assert over_ssh["env"]["CUDA_VISIBLE_DEVICES"] != ""  # a GPU share was placed
    r = ssh(shub, "alice", shub.tokens["alice"], "id -un")
    assert r.stdout.strip() == account("alice")


def test_a_pty_session_has_a_terminal(shub):
    r = ssh(shub, "alice", shub.tokens["alice"], "-tt", "tty; echo TERM=$TERM; exit 3")
    assert r.returncode == 3, r.stderr
    assert "/dev/pts/" in r.stdout and "TERM=" in r.stdout


def test_sftp_puts_and_gets_files_as_the_account(shub, tmp_path):
    src = tmp_path / "up.txt"
    src.write_text("hello over sftp\n")
    batch = tmp_path / "batch"
    batch.write_text(f"put {src} up.txt\nget up.txt {tmp_path / 'down.txt'}\n")
    r = subprocess.run(["sshpass", "-e", "sftp", *[o.replace("-p", "-P") if o == "-p" else o for o in ssh_opts(shub)],
                        "-o", "BatchMode=no", "-b", str(batch), "alice@127.0.0.1"],  # -b alone: no passwords
                       env={**os.environ, "SSHPASS": shub.tokens["alice"]}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "down.txt").read_text() == "hello over sftp\n"
    home = Path(kernel_view(shub)["home"])
    st = (home / "up.txt").stat()
    assert st.st_uid == kernel_view(shub)["uid"]


def jupyter_port(h: Hub) -> int:
    url = run_code(h.url, "/user/alice/", h.tokens["alice"],
                   "import os; print(os.environ['JUPYTERHUB_SERVICE_URL'])").strip()
    return int(url.rsplit(":", 1)[1].split("/")[0])


def forward(h: Hub, remote_port: int, opts: list[str] | None = None):
    (local,) = free_ports(1)
    p = subprocess.Popen(["sshpass", "-e", "ssh", *(opts or ssh_opts(h)), "-N", "-o", "ExitOnForwardFailure=yes",
                          "-L", f"{local}:127.0.0.1:{remote_port}", "alice@127.0.0.1"],
                         env={**os.environ, "SSHPASS": h.tokens["alice"]}, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", local)) == 0
    wait_for(listening, "the forwarded port", timeout=30)
    return p, local


def stop(p: subprocess.Popen) -> str:
    """End sshpass and its ssh (one process group); their stderr."""
    os.killpg(p.pid, signal.SIGTERM)
    try:
        return p.communicate(timeout=20)[1]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.communicate()[1]


def test_local_forward_reaches_her_jupyterlab_and_nothing_of_the_hub(shub):
    p, local = forward(shub, jupyter_port(shub))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/user/alice/api", timeout=20) as r:
            assert "version" in json.loads(r.read())
    finally:
        stop(p)
    hub_api = int(shub.env["GPUPOOL_HUB_PORT"])
    p, local = forward(shub, hub_api)
    try:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{local}/hub/api", timeout=20).read()
    finally:
        err = stop(p)
    assert "administratively prohibited" in err or "open failed" in err


RELAY = """
import os, selectors, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                s.shutdown(socket.SHUT_WR)
                sel.unregister(0)
            else:
                s.sendall(data)
        else:
            data = s.recv(65536)
            if not data:
                sys.exit(0)
            os.write(1, data)
"""


def test_an_openssh_config_block_as_vs_code_uses_it(shub, tmp_path):
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho {shub.tokens['alice']}\n")
    askpass.chmod(0o700)
    relay = tmp_path / "relay.py"  # a ProxyCommand (a jump host's `ssh -W` or `nc` in real life)
    relay.write_text(RELAY)
    config = tmp_path / "config"
    config.write_text(
        "Host gpupool-alice\n"
        "  HostName 127.0.0.1\n"
        f"  Port {shub.ssh_port}\n"
        "  User alice\n"
        f"  UserKnownHostsFile {shub.known_hosts}\n"
        "  PreferredAuthentications password\n"
        f"  ProxyCommand {sys.executable} {relay} %h %p\n")
    r = subprocess.run(["ssh", "-F", str(config), "gpupool-alice", "echo $GPUPOOL_WORKLOAD"], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
                            "DISPLAY": ":0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ws-alice"


def test_refusals(shub):
    r = ssh(shub, "alice", shub.tokens["bob"], "id")
    assert r.returncode == 255 and "Permission denied" in r.stderr
    r = ssh(shub, "alice", "not-a-token", "id")
    assert r.returncode == 255
    # a revoked token
    _, tok = call(shub.url, shub.tokens["alice"], "POST", "/hub/api/users/alice/tokens", {"note": "ssh"}, api=False)
    assert ssh(shub, "alice", tok["token"], "true").returncode == 0
    call(shub.url, shub.tokens["alice"], "DELETE", f"/hub/api/users/alice/tokens/{tok['id']}", api=False)
    assert ssh(shub, "alice", tok["token"], "true").returncode == 255
    # a token of hers made only to read her name through the API opens no shell
    _, narrow = call(shub.url, shub.tokens["alice"], "POST", "/hub/api/users/alice/tokens",
                     {"scopes": ["read:users:name!user"]}, api=False)
    assert "access:servers!user=alice" not in narrow["scopes"]
    assert ssh(shub, "alice", narrow["token"], "true").returncode == 255
    # a workspace that is not running: a clear message, nothing runs
    r = ssh(shub, "alice+lab2", shub.tokens["alice"], "echo ran")
    assert r.returncode == 1 and "ran" not in r.stdout
    assert "is not running" in r.stderr and "gpupool workspace start lab2" in r.stderr
    # bob has no running workspace; he cannot name alice's
    r = ssh(shub, "bob+ws-alice", shub.tokens["bob"], "echo ran")
    assert "is not running" in r.stderr and "ran" not in r.stdout


def test_every_login_is_audited(shub):
    _, data = call(shub.url, shub.tokens["admin"], "GET", "/audit?action=ssh.login&actor=alice&limit=1000")
    assert data["total"] >= 5
    e = data["items"][0]
    assert e["target"] in ("ws-alice", "lab2") and e["details"]["method"] == "token"
    assert e["details"]["source"] == "127.0.0.1"
    _, data = call(shub.url, shub.tokens["admin"], "GET", "/audit?action=ssh.refused&actor=alice")
    assert data["total"] >= 4 and all(e["details"]["reason"].startswith("bad ") for e in data["items"])


def test_the_home_page_shows_how_to_connect_to_each_running_workspace(shub):
    page = HubClient(shub.url).login("alice", USER_PW).opener.open(shub.url + "/hub/home").read().decode()
    block = page[page.index('id="gpupool-connect"'):]
    line = re.search(r'<pre class="gpupool-ssh-line">(.*?)</pre>', block).group(1)
    assert re.sub(r"<[^>]+>", "", line) == f"ssh -p {shub.ssh_port} alice@"  # the host: the page's own
    assert "Host gpupool-alice\n  HostName" in block and f"Port {shub.ssh_port}\n  User alice" in block
    assert "Existing JupyterHub Server" in block and "/hub/token" in block
    r = ssh(shub, "alice", shub.tokens["alice"], "echo $GPUPOOL_WORKLOAD")  # what the line runs
    assert r.stdout.strip() == "ws-alice"
    page = HubClient(shub.url).login("bob", USER_PW).opener.open(shub.url + "/hub/home").read().decode()
    assert 'id="gpupool-connect"' not in page  # nothing of bob's runs


def test_a_hundred_bad_logins_lock_the_user_out_and_nothing_crashes(shub):
    async def attempt(user: str, password: str) -> bool:
        try:
            async with asyncssh.connect("127.0.0.1", shub.ssh_port, username=user, password=password,
                                        known_hosts=str(shub.known_hosts), client_keys=None,
                                        preferred_auth="password") as conn:
                await conn.run("true")
                return True
        except (asyncssh.PermissionDenied, asyncssh.DisconnectError):
            return False

    async def flood():
        results = []
        for i in range(100):
            results.append(await attempt("alice", f"bad-token-{i}"))
        return results

    assert not any(asyncio.run(flood()))
    assert not asyncio.run(attempt("alice", shub.tokens["alice"]))  # locked out, even with the right token
    # the gateway still answers, and the lockout is written once, not a hundred times
    _, data = call(shub.url, shub.tokens["admin"], "GET", "/audit?action=ssh.refused&actor=alice&limit=1000")
    assert sum(e["details"]["reason"].startswith("too many") for e in data["items"]) == 1
    assert data["total"] < 30
    assert shub.proc.poll() is None
    with socket.create_connection(("127.0.0.1", shub.ssh_port), timeout=10) as s:
        assert s.recv(64).startswith(b"SSH-2.0-")


def test_the_throttle_locks_after_max_failures_and_lets_go_after_the_lockout():
    now = [0.0]
    t = Throttle(3, 60, clock=lambda: now[0])
    keys = ("user:alice", "source:10.0.0.1")
    assert [t.fail(keys) for _ in range(3)] == [False, False, True]
    assert t.locked(keys) and t.locked(("source:10.0.0.1",)) and not t.locked(("user:bob", "source:10.0.0.2"))
    now[0] = 59
    assert t.locked(keys)
    now[0] = 61
    assert not t.locked(keys)
    t.fail(keys)
    t.succeed(keys[:1])  # a good login clears the user's count, not the address's
    assert [t.fail(keys) for _ in range(2)] == [False, True]


@pytest.mark.parametrize("keys, field", [
    ("ssh-ed25519 AAAA", "keys"),
    (["ssh-dss AAAAB3NzaC1kc3M="], "keys[0]"),
    (["ssh-ed25519 not-base64!"], "keys[0]"),
    (["ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQAB"], "keys[0]"),  # an ssh-rsa blob named ed25519
    ([""], "keys[0]"),
    (["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA=="] * 17, "keys"),
])
def test_ssh_keys_are_checked(keys, field):
    with pytest.raises(FieldError) as e:
        validation.ssh_keys(keys)
    assert e.value.field == field


def test_an_ssh_key_is_kept_with_its_comment():
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    assert validation.ssh_keys([f"{key}  me@laptop "]) == [f"{key} me@laptop"]


# -- on by default: the session's hub and the one below set no SSH option ----------------------
BANNER_SSH = re.compile(r"^gpupool: SSH gateway on port (\d+): ssh -p (\d+) USER@127\.0\.0\.1 ", re.M)


def banner_port(h: Hub) -> int:
    """The SSH port the start-up banner of ``gpupool up`` names."""
    m = BANNER_SSH.search(h.log.read_text())
    assert m and m.group(1) == m.group(2), h.log.read_text()[:3000]
    return int(m.group(1))


def gateway_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def test_the_start_banner_names_the_users_and_the_gateways_port(hub):
    text = hub.log.read_text()
    port = banner_port(hub)
    wait_for(lambda: gateway_answers(port), "the gateway on the banner's port", timeout=30)
    _, me = call(hub.url, hub.tokens["alice"], "GET", "/me")
    assert me["ssh_port"] == port and me["ssh_host_key"].startswith("ssh-ed25519 ")
    login_line = next(line for line in text.splitlines() if line.startswith("gpupool: log in as "))
    users, _, admins = login_line.partition(" or as an admin ")
    assert all(name in users for name in ("alice", "bob", "carol", "dave")) and "'gpupool-user'" in users
    assert "(admin)" in admins and "'gpupool-admin-password-change-me'" in admins


def test_the_hubs_output_carries_no_cryptography_warning(hub):
    """asyncssh's import makes cryptography warn about DSA, once per name it touches; the
    hub's log (the hub, its service with the gateway, the proxy) shows none of it."""
    text = hub.log.read_text()
    assert "gpupool-service" in text  # the service's output is in this log
    assert "CryptographyDeprecationWarning" not in text and "DSA is deprecated" not in text


def test_two_hubs_on_one_machine_each_get_a_free_port_kept_across_restarts(hub, tmp_path):
    other = Hub(tmp_path / "other").start()
    try:
        port = banner_port(other)
        assert port != banner_port(hub)
        wait_for(lambda: gateway_answers(port), "the second hub's gateway", timeout=30)
        assert gateway_answers(banner_port(hub))
        assert (other.workdir / "state" / "ssh" / "port").read_text().strip() == str(port)
        other.stop()
        other.start()
        assert banner_port(other) == port  # users' ssh configs and known_hosts stay valid
        wait_for(lambda: gateway_answers(port), "the restarted hub's gateway", timeout=30)
    finally:
        other.stop()
