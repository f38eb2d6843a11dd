"""One real hub for the attack tests (``gpupool up`` as root, tests/hub/hubproc.py) with
org.yaml here: alice (project vision) and bob (project nlp), each with a running JupyterLab
workspace; bob's workspace has a credential of nlp attached (``files`` delivery); bob runs
an inference service of nlp with one replica and a training with one worker; bob has written
a 0600 file in his home.

The hub's folder is world-traversable, so that every denial the tests see comes from the
hub's own state folder and the users' own homes, not from a private parent folder. The
accounts the hub creates (``gpupool-alice``, ``gpupool-bob`` with the default prefix) are
removed afterwards.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "hub"))

from hubclient import HubClient, call  # noqa: E402
from hubproc import ADMIN_PW, ROOT, USER_PW, Hub, account  # noqa: E402

from tests.waits import wait_for  # noqa: E402

from .attacks import find, has_args, in_kernel, processes  # noqa: E402

ORG = HERE / "org.yaml"
MODEL_SERVER = str(ROOT / "tests" / "inference" / "model_server.py")  # the test replica
ACCOUNTS = {"alice": account("alice"), "bob": account("bob")}
SERVICE = "bob-model"
TRAINING = "bob-train"
CREDENTIAL, CREDENTIAL_KEY, CREDENTIAL_VALUE = "vault", "token", "nlp-object-store-secret-5e1f"
# what alice's workspace asks for; the cgroup tests read these limits back from the kernel
ALICE_CPU, ALICE_MEMORY_GIB = 1.5, 1.5
PRIVATE_TEXT = "bob's private notes"
TRAINING_MARK = "import time; time.sleep(3600)  # bob's training worker"


@dataclass
class Site:
    hub: Hub
    tokens: dict[str, str]
    state: Path
    bob: dict = field(default_factory=dict)  # what bob's kernel reported: home, files

    @property
    def hub_api(self) -> str:
        return f"http://127.0.0.1:{self.hub.env['GPUPOOL_HUB_PORT']}/hub/api"

    def attack(self, code: str, args: dict | None = None) -> object:
        """Run attack code in alice's kernel (see attacks.in_kernel)."""
        return in_kernel(self.hub.url, "alice", self.tokens["alice"], code, args)

    def hub_pid(self) -> int:
        return self.hub.proc.pid  # `gpupool up` execs jupyterhub

    def server_of(self, user: str):
        """The jupyterhub-singleuser process of ``user``'s default server on this hub."""
        api_url = self.hub_api
        return find(lambda p: any(a.endswith("jupyterhub-singleuser") for a in p.argv)
                    and "hub_ext.host.monitor" not in p.argv
                    and p.environ().get("JUPYTERHUB_USER") == user
                    and p.environ().get("JUPYTERHUB_API_URL") == api_url,
                    f"{user}'s jupyterhub-singleuser of the hub at {api_url}")[0]

    def replicas(self):
        return find(lambda p: MODEL_SERVER in p.argv and "hub_ext.host.monitor" not in p.argv
                    and p.environ().get("GPUPOOL_INFERENCE_SERVICE") == SERVICE
                    and p.environ().get("GPUPOOL_STATE_DIR", str(self.state)) == str(self.state),
                    f"a replica of the inference service {SERVICE}")

    def training_worker(self):
        return find(lambda p: "hub_ext.host.monitor" not in p.argv and TRAINING_MARK in p.argv
                    and p.environ().get("GPUPOOL_WORKLOAD") == TRAINING,
                    f"a worker of the training {TRAINING}")[0]

    def hub_processes(self) -> dict[str, int]:
        """The hub, its proxy and the gpupool service: processes whose secrets no
        workload may read."""
        port = str(self.hub.port)
        proxy = find(lambda p: any("configurable-http-proxy" in a for a in p.argv)
                     and has_args(p, "--port", port), f"the proxy on port {port}")
        service = find(lambda p: has_args(p, "-m", "hub_ext.service")
                       and p.environ().get("GPUPOOL_STATE_DIR") == str(self.state),
                       "the gpupool service")
        return {"hub": self.hub_pid(), "proxy": proxy[0].pid, "service": service[0].pid}


def account(user: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(ACCOUNTS[user])
    except KeyError:
        return None


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _wait(what: str, check, hub: Hub, timeout: float = 240):
    return wait_for(check, what, timeout, every=0.5,
                    detail=lambda: f"; hub log:\n{hub.log.read_text(errors='replace')[-3000:]}")


def _server_ready(site: Site, user: str) -> bool:
    _, u = call(site.hub.url, site.tokens["admin"], "GET", f"/hub/api/users/{user}", api=False)
    return bool((u.get("servers") or {}).get("", {}).get("ready"))


def _training_running(site: Site) -> bool:
    _, job = call(site.hub.url, site.tokens["bob"], "GET", f"/trainings/{TRAINING}")
    assert job.get("status") not in ("Succeeded", "Failed"), job
    return job.get("status") == "Running"


def _served(site: Site) -> bool:
    code, _ = call(site.hub.url, site.tokens["bob"], "GET",
                   f"/services/gpupool-serve/{SERVICE}/predict?client=bob", api=False)
    return code == 200


BOB_SETUP = """
import hashlib
home = os.path.expanduser("~")
private = os.path.join(home, "private-notes.txt")
fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, ARGS["text"].encode())
os.close(fd)
os.chmod(private, 0o600)  # whatever the umask
folder = os.environ.get(ARGS["env"], "")
digest = ""
if folder:
    with open(os.path.join(folder, ARGS["key"])) as f:
        digest = hashlib.sha256(f.read().encode()).hexdigest()
answer({"home": home, "private": private, "credentials": folder, "digest": digest})
"""


def _end_account_processes() -> None:
    """Workloads of the test accounts that outlived the hub (their pids, one by one)."""
    uids = {a.pw_uid for a in map(account, ACCOUNTS) if a is not None}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p.pid for p in processes() if p.uid in uids]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if left:
            time.sleep(2)


def _remove_accounts() -> None:
    for user in ACCOUNTS:
        if account(user) is not None:
            subprocess.run(["userdel", "-r", ACCOUNTS[user]], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def site():
    workdir = Path(tempfile.mkdtemp(prefix="gpupool-security-"))
    workdir.chmod(0o755)
    hub = Hub(workdir, config=f"c = get_config()  # noqa\nc.Gpupool.org_file = {str(ORG)!r}\n")
    tokens: dict[str, str] = {}
    try:
        hub.start()
        tokens |= {u: HubClient(hub.url).login(u, USER_PW).token(u) for u in ("alice", "bob")}
        tokens["admin"] = HubClient(hub.url).login("admin", ADMIN_PW).token("admin")
        s = Site(hub, tokens, workdir / "state")

        status, body = call(hub.url, tokens["admin"], "POST", "/projects/nlp/credentials", {
            "name": CREDENTIAL, "delivery": "files", "data": {CREDENTIAL_KEY: CREDENTIAL_VALUE}})
        assert status == 201, body
        status, body = call(hub.url, tokens["bob"], "POST", "/workloads", {
            "kind": "workspace", "project": "nlp", "gpu_mode": "none", "credentials": [CREDENTIAL]})
        assert status == 202, body
        status, body = call(hub.url, tokens["alice"], "POST", "/workloads", {
            "kind": "workspace", "project": "vision", "gpu_mode": "none",
            "cpu": ALICE_CPU, "memory_gib": ALICE_MEMORY_GIB})
        assert status == 202, body
        status, body = call(hub.url, tokens["bob"], "POST", "/inferences", {
            "name": SERVICE, "project": "nlp", "gpu": 0.25, "min_replicas": 1, "max_replicas": 1,
            "command": [sys.executable, MODEL_SERVER, "--socket", "{socket}", "--startup-s", "0.3"],
            "ready_path": "/health", "scale_to_zero_after_s": 3600})
        assert status == 201, body

        status, body = call(hub.url, tokens["bob"], "POST", "/trainings", {
            "name": TRAINING, "project": "nlp", "gpu": 0,
            "command": [sys.executable, "-c", TRAINING_MARK]})
        assert status == 201, body
        _wait("bob's workspace start", lambda: _server_ready(s, "bob"), hub)
        _wait("alice's workspace start", lambda: _server_ready(s, "alice"), hub)
        _wait(f"a replica of {SERVICE} serving bob", lambda: _served(s), hub)
        _wait(f"bob's training {TRAINING} running", lambda: _training_running(s), hub)
        s.bob = in_kernel(hub.url, "bob", tokens["bob"], BOB_SETUP, {
            "text": PRIVATE_TEXT, "env": "GPUPOOL_CREDENTIALS_" + CREDENTIAL.upper(),
            "key": CREDENTIAL_KEY})
        yield s
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            if "admin" in tokens:  # stopped through the API: work may outlive a hub stop
                call(hub.url, tokens["bob"], "DELETE", f"/inferences/{SERVICE}")
                call(hub.url, tokens["bob"], "DELETE", f"/trainings/{TRAINING}")
                call(hub.url, tokens["bob"], "DELETE", "/workloads/ws-bob")
                call(hub.url, tokens["alice"], "DELETE", "/workloads/ws-alice")
            time.sleep(2)  # the hub stops the replica and the servers
        hub.stop()
        _end_account_processes()
        _remove_accounts()
        shutil.rmtree(workdir, ignore_errors=True)
