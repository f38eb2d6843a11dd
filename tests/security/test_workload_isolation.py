"""Attacks made from inside alice's running JupyterLab (a kernel, through the Jupyter API, as
a notebook would), each of which must be denied on an embedded hub started as root.

Every target is first found as root by the test (the file exists, the process runs, the
socket listens), so that a denial is a denial and not a wrong path. Each test asserts
the precise refusal: EACCES for a file or a folder, EPERM for a signal, a refused
connection or a 401/403 for a service. Write attacks only open files for writing and write
nothing; a signal attack sends SIGTERM only after signal 0 was refused.

The hub and its workloads are set up once for the module (conftest.py).
"""

from __future__ import annotations

import json
import os
import stat
import sysconfig
from pathlib import Path

import pytest
from hubproc import ROOT

from .attacks import EACCES, EPERM, REFUSED, Proc, listening, secrets_in
from .conftest import (
    ACCOUNTS,
    ALICE_CPU,
    ALICE_MEMORY_GIB,
    CREDENTIAL_KEY,
    CREDENTIAL_VALUE,
    PRIVATE_TEXT,
    SERVICE,
    account,
    sha,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="accounts per user need a hub started as root "
                       "(otherwise it runs in personal mode)"),
]

STATE_FILES = {  # the hub's own files in STATE_DIR
    "cookie_secret": "jupyterhub_cookie_secret",
    "credentials_key": "credentials.key",
    "serve_token": "gpupool-serve-token",
    "hub_database": "jupyterhub.sqlite",
    "gpupool_database": "gpupool.sqlite",
}


def existing(path: Path) -> str:
    """``path`` as a string, once the test (root) has seen it exist: a denial of a path
    that is not there would prove nothing."""
    assert path.exists(), f"{path} does not exist: the attack would have no target"
    return str(path)


def hub_secrets(site) -> dict[str, str]:
    """Every secret of the hub (label -> value): its state files and what the hub, the
    proxy and the gpupool service hold in their environment; the admin's API token."""
    out = {"admin API token": site.tokens["admin"]}
    for label in ("cookie_secret", "credentials_key", "serve_token"):
        out[label] = (site.state / STATE_FILES[label]).read_text().strip()
    for proc, pid in site.hub_processes().items():
        env = Proc(pid, 0, ()).environ()
        assert env, f"the {proc}'s environment could not be read as root"
        out.update({f"{proc} ${k}": v for k, v in secrets_in(env).items()})
    return out


# -- who the workload is ---------------------------------------------------------------------
def test_workload_runs_as_its_own_account_not_root(site):
    me = site.attack("""
        ids = {l.split(":")[0]: l.split()[1:] for l in open("/proc/self/status")
               if l.startswith(("Uid:", "Gid:"))}
        answer({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "ids": ids,
                "name": pwd.getpwuid(os.getuid()).pw_name})
    """)
    hub_uid = os.stat(f"/proc/{site.hub_pid()}").st_uid
    assert me["name"] == ACCOUNTS["alice"], me
    assert me["uid"] not in (0, hub_uid), me
    assert set(me["ids"]["Uid"]) == {str(me["uid"])}, me  # real, effective, saved, fs
    assert me["gid"] != 0 and "0" not in me["ids"]["Gid"] and 0 not in me["groups"], me


# -- the hub's state -------------------------------------------------------------------------
def test_workload_cannot_list_the_state_dir(site):
    got = site.attack("answer(attempt(os.listdir, ARGS['state']))", {"state": str(site.state)})
    assert got == EACCES, got
    st = site.state.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700), f"{site.state}: {oct(st.st_mode)}"


def _read_denied(site, path: Path) -> None:
    got = site.attack("answer(attempt(read, ARGS['path']))", {"path": existing(path)})
    assert got == EACCES, f"{path}: {got}"


def test_workload_cannot_read_cookie_secret(site):
    _read_denied(site, site.state / STATE_FILES["cookie_secret"])


def test_workload_cannot_read_credentials_key(site):
    _read_denied(site, site.state / STATE_FILES["credentials_key"])


def test_workload_cannot_read_serve_token(site):
    _read_denied(site, site.state / STATE_FILES["serve_token"])


@pytest.mark.parametrize("db", ["hub_database", "gpupool_database"])
def test_workload_cannot_read_databases(site, db):
    _read_denied(site, site.state / STATE_FILES[db])


def test_workload_cannot_read_any_file_of_the_state_dir(site):
    files = sorted(str(Path(d) / f) for d, _, names in os.walk(site.state) for f in names
                   if (Path(d) / f).is_file())  # a fifo or a socket cannot be read
    assert files
    got = site.attack("answer({p: attempt(read, p) for p in ARGS['files']})", {"files": files[:500]})
    read_anyway = {p: r for p, r in got.items() if r != EACCES}
    assert not read_anyway, f"{len(read_anyway)} of {len(got)} files: {read_anyway}"


def test_workload_cannot_read_another_workloads_secrets(site):
    folder = site.bob["credentials"]
    assert folder and site.bob["digest"] == sha(CREDENTIAL_VALUE), site.bob  # bob got it
    targets = {"folder": existing(Path(folder)), "file": existing(Path(folder) / CREDENTIAL_KEY)}
    if (site.state / "secrets").exists():  # the tree of every workload's delivered files
        targets["tree"] = str(site.state / "secrets")
    got = site.attack("""
        answer({k: attempt(read if k == "file" else os.listdir, p) for k, p in ARGS.items()})
    """, targets)
    assert got == {k: EACCES for k in targets}, got


def test_delivered_credential_file_belongs_to_its_workload_account(site):
    path = Path(site.bob["credentials"]) / CREDENTIAL_KEY
    st = path.stat()
    bob = account("bob")
    assert bob is not None, f"no account {ACCOUNTS['bob']}"
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (bob.pw_uid, 0o400), (st.st_uid, oct(st.st_mode))


def test_workload_cannot_decrypt_credentials_of_another_project(site):
    """The sealed values (gpupool's database) and the key that opens them are the hub's;
    the opened value was delivered to bob's workspace only."""
    got = site.attack("answer([attempt(read, p) for p in ARGS['paths']])", {"paths": [
        existing(site.state / STATE_FILES["credentials_key"]),
        existing(site.state / STATE_FILES["gpupool_database"]),
        existing(Path(site.bob["credentials"]) / CREDENTIAL_KEY)]})
    assert got == [EACCES, EACCES, EACCES], got


# -- tokens ------------------------------------------------------------------------------------
ALICE_ENVIRONMENTS = """
envs = {"kernel": dict(os.environ)}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        continue
    envs[pid] = dict(i.decode(errors="replace").partition("=")[::2] for i in raw.split(b"\\0") if i)
token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
answer({"envs": envs, "token": token,
        "who": http_get(os.environ.get("JUPYTERHUB_API_URL", ARGS["api"]) + "/user", token)})
"""


@pytest.fixture(scope="module")
def alice_environments(site):
    """The environment of alice's kernel and of every process whose environment she can read."""
    return site.attack(ALICE_ENVIRONMENTS, {"api": site.hub_api})


def _leaks(envs: dict[str, dict[str, str]], secrets: dict[str, str]) -> list[str]:
    return sorted({f"{label} in the environment of {where} (${k})"
                   for where, env in envs.items() for k, v in env.items()
                   for label, secret in secrets.items() if secret and secret in v})


def test_workload_cannot_forge_the_admin_cookie(site, alice_environments):
    """Signing a cookie needs the cookie secret: not readable, and in no environment that
    alice's workload can see."""
    _read_denied(site, site.state / STATE_FILES["cookie_secret"])
    secret = (site.state / STATE_FILES["cookie_secret"]).read_text().strip()
    assert not _leaks(alice_environments["envs"], {"cookie secret": secret})


def test_workload_environment_holds_only_its_own_server_token(site, alice_environments):
    token, who = alice_environments["token"], alice_environments["who"]
    assert token and who["status"] == 200, who
    model = json.loads(who["body"])
    assert model["name"] == "alice" and model.get("admin") is not True, model
    assert not [s for s in model.get("scopes", []) if "admin" in s], model["scopes"]
    others = sorted({f"{where}: ${k}" for where, env in alice_environments["envs"].items()
                     for k, v in secrets_in(env).items() if v != token})
    assert not others, f"secrets other than alice's server token: {others}"
    assert not _leaks(alice_environments["envs"], hub_secrets(site))


def test_workload_cannot_find_a_secret_in_command_lines(site):
    """Command lines are world-readable: none carries a token or a key."""
    secrets = {**hub_secrets(site),
               "bob's server token": site.server_of("bob").environ()["JUPYTERHUB_API_TOKEN"]}
    argvs = site.attack("""
        out = {}
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    out[pid] = f.read().decode(errors="replace")
            except OSError:
                pass
        answer(out)
    """)
    assert not _leaks({f"pid {p}'s command line": {"argv": a} for p, a in argvs.items()}, secrets)


# -- other users -------------------------------------------------------------------------------
def test_workload_cannot_read_a_private_file_in_another_home(site):
    private = existing(Path(site.bob["private"]))
    assert Path(private).read_text() == PRIVATE_TEXT
    got = site.attack("answer([attempt(read, ARGS['file']), attempt(os.listdir, ARGS['home'])])",
                      {"file": private, "home": site.bob["home"]})
    assert got == [EACCES, EACCES], got


def test_home_is_private_and_outside_the_checkout(site):
    home = Path(site.bob["home"]).resolve()
    bob = account("bob")
    assert bob is not None, f"no account {ACCOUNTS['bob']}; bob's home is {home}"
    assert home == Path(bob.pw_dir).resolve()
    for outside in (ROOT, site.state):
        assert not home.is_relative_to(outside.resolve()), f"bob's home {home} is inside {outside}"
    st = home.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (bob.pw_uid, 0o700), (st.st_uid, oct(st.st_mode))


def test_workload_cannot_read_another_servers_environment(site):
    server = site.server_of("bob")
    assert "JUPYTERHUB_API_TOKEN" in server.environ()  # what the attack is after
    got = site.attack("answer(attempt(read, '/proc/%d/environ' % ARGS['pid']))", {"pid": server.pid})
    assert got == EACCES, got


def test_workload_cannot_use_another_users_server_with_its_own_token(site):
    """Through the proxy and at the server's own port: JupyterHub's per-server scopes."""
    server = site.server_of("bob")
    direct = [a for a in listening(server.pid) if a["family"] == "tcp"]
    assert direct, "bob's server listens nowhere"
    got = site.attack("""
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        answer([http_get(u, token)["status"] for u in ARGS["urls"]])
    """, {"urls": [f"{site.hub.url}/user/bob/api/contents"]
          + [f"http://{a['host']}:{a['port']}/user/bob/api/contents" for a in direct]})
    assert got == [403] * (1 + len(direct)), got


def test_workload_cannot_signal_another_users_server(site):
    pid = site.server_of("bob").pid
    got = site.attack("""
        probe = attempt(os.kill, ARGS["pid"], 0)
        # SIGTERM only once signal 0 was refused: a working attack must not stop the server
        term = attempt(os.kill, ARGS["pid"], signal.SIGTERM) if probe.get("error") else "not sent"
        answer({"probe": probe, "term": term, "hub": attempt(os.kill, ARGS["hub"], 0)})
    """, {"pid": pid, "hub": site.hub_pid()})
    assert got == {"probe": EPERM, "term": EPERM, "hub": EPERM}, got
    assert site.server_of("bob").pid == pid  # still running


def test_workload_cannot_read_the_environment_of_hub_processes(site):
    procs = site.hub_processes()
    got = site.attack("answer({n: attempt(read, '/proc/%d/environ' % p) for n, p in ARGS.items()})",
                      procs)
    assert got == {name: EACCES for name in procs}, got


WRITE_TARGETS = {
    "checkout_spawner": ROOT / "hub_ext" / "workspaces" / "spawner.py",
    "etc_shadow": Path("/etc/shadow"),
    "etc_passwd": Path("/etc/passwd"),
}


@pytest.mark.parametrize("target", sorted(WRITE_TARGETS))
def test_workload_cannot_write_system_or_checkout_files(site, target):
    path = existing(WRITE_TARGETS[target])
    got = site.attack("answer(attempt(open_for_writing, ARGS['path']))", {"path": path})
    assert got == EACCES, f"{path}: {got}"


def test_workload_cannot_add_code_to_the_checkout_or_the_hubs_python(site):
    """A new module in the checkout or in the hub's site-packages would run in the hub."""
    folders = [existing(ROOT / "hub_ext"), existing(Path(sysconfig.get_paths()["purelib"]))]
    got = site.attack("""
        def create(folder):
            path = os.path.join(folder, "gpupool_attack_probe.py")
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)  # the attack worked: leave nothing behind
            return "created"
        answer([attempt(create, f) for f in ARGS["folders"]])
    """, {"folders": folders})
    assert got == [EACCES, EACCES], dict(zip(folders, got))


def test_workload_cannot_read_or_signal_another_users_training(site):
    pid = site.training_worker().pid
    got = site.attack("""
        probe = attempt(os.kill, ARGS["pid"], 0)
        term = attempt(os.kill, ARGS["pid"], signal.SIGTERM) if probe.get("error") else "not sent"
        answer({"environ": attempt(read, "/proc/%d/environ" % ARGS["pid"]), "probe": probe, "term": term})
    """, {"pid": pid})
    assert got == {"environ": EACCES, "probe": EPERM, "term": EPERM}, got


def test_training_worker_runs_as_its_owner_without_hub_secrets(site):
    worker, bob = site.training_worker(), account("bob")
    assert bob is not None and worker.uid == bob.pw_uid, (worker.uid, ACCOUNTS["bob"])
    assert not _leaks({f"training worker {worker.pid}": worker.environ()}, hub_secrets(site))


# -- inference ---------------------------------------------------------------------------------
def test_workload_cannot_reach_a_replica_directly(site):
    where = [a for r in site.replicas() for a in listening(r.pid)]
    assert where, "the replica listens nowhere (the activator reaches it somewhere)"
    got = site.attack("""
        out = []
        for a in ARGS["where"]:
            if a["family"] == "tcp":
                fam = socket.AF_INET6 if ":" in a["host"] else socket.AF_INET
                out.append(attempt(raw_http_status, fam, (a["host"], a["port"])))
            else:
                path = "\\0" + a["path"][1:] if a["path"].startswith("@") else a["path"]
                out.append(attempt(raw_http_status, socket.AF_UNIX, path))
        answer(out)
    """, {"where": where})
    reached = [(a, r) for a, r in zip(where, got) if r not in REFUSED and r.get("ok") not in (401, 403)]
    assert not reached, f"the replica answered alice directly: {reached}"


def test_workload_cannot_call_a_replica_through_the_activator_without_access(site):
    got = site.attack("""
        url = ARGS["url"]
        answer({"none": http_get(url)["status"],
                "own": http_get(url, os.environ.get("JUPYTERHUB_API_TOKEN", ""))["status"]})
    """, {"url": f"{site.hub.url}/services/gpupool-serve/{SERVICE}/predict?client=alice"})
    assert got == {"none": 401, "own": 403}, got  # alice is not a member of bob's project


def test_replica_runs_as_its_owner_without_hub_secrets(site):
    bob = account("bob")
    for replica in site.replicas():
        assert bob is not None and replica.uid == bob.pw_uid, (replica.uid, ACCOUNTS["bob"])
        assert not _leaks({f"replica {replica.pid}": replica.environ()}, hub_secrets(site))


# -- GPU accounting: the interception library's account files ----------------------------------
def _bobs_region(site) -> Path:
    """The account file of bob's replica (a 0.25 GPU): its environment names it."""
    region = Path(site.replicas()[0].environ()["GPUPOOL_SHARED_REGION"])
    existing(region)
    return region


def test_gpu_account_belongs_to_its_workload_in_a_folder_of_the_hubs(site):
    region, bob = _bobs_region(site), account("bob")
    st, folder = os.lstat(region), os.lstat(region.parent)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert bob is not None and st.st_uid == bob.pw_uid, (st.st_uid, ACCOUNTS["bob"])
    assert stat.S_ISDIR(folder.st_mode) and folder.st_uid == 0 and stat.S_IMODE(folder.st_mode) == 0o711
    assert region.parent.parent == Path("/dev/shm")


def test_workload_cannot_write_read_or_replace_another_workloads_gpu_account(site):
    region = _bobs_region(site)
    before = region.read_bytes()
    got = site.attack("""
        region, folder = ARGS["region"], os.path.dirname(ARGS["region"])
        def create(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(path)  # the attack worked: leave nothing behind
            return "created"
        def rename(old, new):
            os.rename(old, new)
            return "renamed"
        answer({"write": attempt(open_for_writing, region), "read": attempt(read, region),
                "unlink": attempt(os.unlink, region), "list": attempt(os.listdir, folder),
                "precreate": attempt(create, os.path.join(folder, "ws-bob-next")),
                "swap_folder": attempt(rename, folder, folder + ".mine")})
    """, {"region": str(region)})
    assert got == {"write": EACCES, "read": EACCES, "unlink": EACCES, "list": EACCES,
                   "precreate": EACCES, "swap_folder": EPERM}, got
    assert region.read_bytes() == before


GPU_DEVICES = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))


@pytest.mark.skipif(not GPU_DEVICES, reason="no /dev/nvidiaN on this machine: the device cgroup "
                    "cannot be checked here")
def test_workload_without_gpus_cannot_open_a_gpu(site):
    """alice asked for no GPU: her device cgroup refuses every GPU node (the nodes
    themselves are usually mode 0666, so the refusal is the cgroup's EPERM)."""
    got = site.attack("""
        def open_device(path):
            os.close(os.open(path, os.O_RDWR))
            return "opened"
        answer({p: attempt(open_device, p) for p in ARGS["devices"]})
    """, {"devices": GPU_DEVICES})
    assert got == {p: EPERM for p in GPU_DEVICES}, got


# -- limits ------------------------------------------------------------------------------------
CGROUP_LIMITS = """
mounts = []
for line in open("/proc/self/mountinfo"):
    left, _, right = line.partition(" - ")
    fstype, _, opts = right.split()[:3]
    if fstype in ("cgroup", "cgroup2"):
        f = left.split()
        mounts.append((fstype, f[3], f[4], set(opts.split(","))))
dirs = {}  # controller ("" for cgroup v2) -> the folder of this process's cgroup
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.rstrip("\\n").split(":", 2)
    for fstype, root, point, opts in mounts:
        v1 = fstype == "cgroup" and ctrls and set(ctrls.split(",")) <= opts
        if (v1 or (fstype == "cgroup2" and not ctrls)) and (path + "/").startswith(root.rstrip("/") + "/"):
            rel = path[len(root.rstrip("/")):].lstrip("/")
            for c in (ctrls.split(",") if ctrls else [""]):
                dirs[c] = os.path.join(point, rel)

def limits(ctrl, name):  # [file, value] of name in this process's cgroup and its ancestors
    if ctrl not in dirs:
        return []
    out, d = [], dirs[ctrl]
    while True:
        path = os.path.join(d, name)
        if os.path.exists(path):
            out.append([path, open(path).read().strip()])
        if os.path.ismount(d) or d == "/":
            return out
        d = os.path.dirname(d)

memory = limits("memory", "memory.limit_in_bytes") or limits("", "memory.max")
if limits("cpu", "cpu.cfs_quota_us"):
    cpu = [[q[0], q[1] + " " + p[1]] for q, p in zip(limits("cpu", "cpu.cfs_quota_us"),
                                                      limits("cpu", "cpu.cfs_period_us"))]
else:
    cpu = limits("", "cpu.max")
answer({"cgroup": open("/proc/self/cgroup").read(), "memory": memory, "cpu": cpu})
"""


@pytest.fixture(scope="module")
def alice_cgroup(site):
    return site.attack(CGROUP_LIMITS)


def test_kernel_runs_under_the_requested_memory_limit(alice_cgroup):
    """The tightest memory limit on the kernel's cgroup and its ancestors is the request."""
    values = [int(v) for _, v in alice_cgroup["memory"] if v != "max"]
    assert values, f"no memory limit on {alice_cgroup['cgroup']}: {alice_cgroup['memory']}"
    assert min(values) == int(ALICE_MEMORY_GIB * 1024**3), alice_cgroup


def test_kernel_runs_under_the_requested_cpu_quota(alice_cgroup):
    """The tightest CPU quota (QUOTA PERIOD, v1 or v2) on the kernel's cgroup and its
    ancestors is the request, in CPUs."""
    cpus = [int(q) / int(p) for _, v in alice_cgroup["cpu"] for q, p in [v.split()]
            if q not in ("max", "-1")]
    assert cpus, f"no CPU quota on {alice_cgroup['cgroup']}: {alice_cgroup['cpu']}"
    assert min(cpus) == pytest.approx(ALICE_CPU), alice_cgroup
