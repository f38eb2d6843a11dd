"""Workloads on the host: each runs as its account with exactly the environment it was
given, in its own cgroup, under a root monitor that records how it ended (exit code,
signal, OOM) and outlives the process that started it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hub_ext.host.cgroups import Cgroups, Limits
from hub_ext.host.errors import LaunchError, SpecError
from hub_ext.host.process import Launcher, Spec
from hub_ext.host.state import proc_start_time

from .conftest import needs_root, run

pytestmark = needs_root
PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
ROOT = Path(__file__).resolve().parents[2]


def spec(name, account, script, env=None, limits=None, **kw):
    return Spec(name, ["sh", "-c", script], env if env is not None else dict(PATH), None, account,
                limits or Limits(), **kw)


def status_ids(pid: int) -> dict[str, list[int]]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: [int(x) for x in v.split()] for k, _, v in (ln.partition(":") for ln in lines)
            if k in ("Uid", "Gid", "Groups")}


def test_runs_as_its_account_with_only_its_environment(launcher, alice):
    env = {**PATH, "JUPYTERHUB_API_TOKEN": "its-own-token", "LANG": "C.UTF-8"}
    h = run(launcher.start(spec("w-ids", alice, "sleep 30", env=env)))
    try:
        ids = status_ids(h.pid)
        assert ids["Uid"] == [alice.uid] * 4 and ids["Gid"] == [alice.gid] * 4
        assert 0 not in ids["Groups"]
        environ = Path(f"/proc/{h.pid}/environ").read_bytes().split(b"\0")[:-1]
        assert dict(e.decode().split("=", 1) for e in environ) == env
        assert os.readlink(f"/proc/{h.pid}/cwd") == str(alice.home)
        assert os.getpgid(h.pid) == h.pid and os.getsid(h.pid) == h.pid  # its own session
        assert h.alive() and h.exit() is None
        assert not (launcher.run_dir / "w-ids" / "spec.json").exists()  # its env held secrets
        assert os.stat(launcher.run_dir).st_mode & 0o777 == 0o700
        log = os.stat(launcher.run_dir / "w-ids" / "output.log")
        assert (log.st_uid, log.st_mode & 0o777) == (alice.uid, 0o600)
    finally:
        run(h.terminate(grace_s=2))


def test_cannot_read_roots_private_files(launcher, alice, home_root):
    """The hub's state directory (0700, root's) on a path the account can walk."""
    secret = home_root / "state"
    secret.mkdir(mode=0o700)
    try:
        (secret / "cookie_secret").write_text("hub's own")
        h = run(launcher.start(spec("w-secret", alice, f"cat {secret}/cookie_secret; echo cat=$?; ls {home_root}; umask")))
        end = run(h.wait(0.05))
        out = (launcher.run_dir / "w-secret" / "output.log").read_text()
        assert end.code == 0, out
        assert "Permission denied" in out and "cat=1" in out and "hub's own" not in out
        assert "state" in out  # it could walk the path: the 0700 directory is what stopped it
        assert "0077" in out  # files it makes are its own
    finally:
        shutil.rmtree(secret)


@pytest.mark.parametrize("script, code, sig, text", [
    ("exit 0", 0, None, "exit code 0"),
    ("exit 3", 3, None, "exit code 3"),
    ("kill -TERM $$", None, signal.SIGTERM, "killed by SIGTERM"),
    ("kill -SEGV $$", None, signal.SIGSEGV, "killed by SIGSEGV"),
])
def test_reports_exit_codes_and_signals(launcher, alice, script, code, sig, text):
    h = run(launcher.start(spec("w-exit", alice, script)))
    end = run(h.wait(0.05))
    assert (end.code, end.signal, end.oom) == (code, sig, False)
    assert end.describe() == text
    assert not h.alive() and not h.group.exists()


def test_sigkill_from_outside_is_reported(launcher, alice):
    h = run(launcher.start(spec("w-kill", alice, "sleep 60")))
    os.kill(h.pid, signal.SIGKILL)
    end = run(h.wait(0.05))
    assert (end.code, end.signal, end.oom) == (None, signal.SIGKILL, False)
    assert end.describe() == "killed by SIGKILL"


def test_over_its_memory_it_is_oom_killed_and_reported(launcher, alice, cgroups):
    if not cgroups.enforced:
        pytest.skip(cgroups.reason)
    hog = [sys.executable, "-c", "b = []\nwhile True: b.append(bytearray(1 << 20))"]
    h = run(launcher.start(Spec("w-oom", hog, PATH, None, alice, Limits(memory_bytes=64 * 2**20))))
    end = run(h.wait(0.1))
    assert end.oom and end.signal == signal.SIGKILL
    assert end.describe() == "killed: out of memory (limit 64 MiB)"
    assert not h.group.exists()


def test_cpu_bound_loop_stays_near_its_quota(launcher, alice, cgroups):
    """Under cpu=0.5 a busy loop gets about half a core (measured by its cgroup); unlimited
    it would take a whole one. Printed, and bounded only generously."""
    if not cgroups.enforced:
        pytest.skip(cgroups.reason)
    loop = [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    h = run(launcher.start(Spec("w-cpu", loop, PATH, None, alice, Limits(cpu=0.5))))
    end = run(h.wait(0.1))
    assert end.code == 0, (end, (launcher.run_dir / "w-cpu" / "output.log").read_text())
    wall = end.ended_at - h.started_at
    ratio = end.cpu_seconds / wall
    print(json.dumps({"cpu_limit": 0.5, "cpu_seconds": round(end.cpu_seconds, 3), "wall_s": round(wall, 3),
                      "ratio": round(ratio, 3)}))
    assert 0 < ratio < 0.9, (end, wall)
    assert h.cpu_seconds() == end.cpu_seconds


def test_what_it_leaves_behind_is_killed(launcher, alice):
    pidfile = alice.home / "bg.pid"
    h = run(launcher.start(spec("w-bg", alice, f"setsid sleep 300 & echo $! > {pidfile}; sleep 0.2; exit 0")))
    end = run(h.wait(0.05))
    assert end.code == 0
    bg = int(pidfile.read_text())
    for _ in range(100):
        if proc_start_time(bg) is None:
            break
        time.sleep(0.02)
    assert proc_start_time(bg) is None, "a process it left in its cgroup still runs"


def test_terminate_escalates_to_sigkill_after_grace(launcher, alice):
    h = run(launcher.start(spec("w-stubborn", alice, "trap '' TERM; sleep 60 & wait; sleep 60")))
    time.sleep(0.2)
    end = run(h.terminate(grace_s=0.5))
    assert end is not None and end.signal == signal.SIGKILL
    assert not h.group.exists()


def test_terminate_sends_sigterm_first(launcher, alice):
    h = run(launcher.start(spec("w-polite", alice, "trap 'exit 7' TERM; while :; do sleep 0.05; done")))
    time.sleep(0.2)
    end = run(h.terminate(grace_s=10))
    assert end is not None and end.code == 7


def test_adopt_after_the_launcher_is_gone(launcher, alice, cgroups):
    h = run(launcher.start(spec("w-adopt", alice, "sleep 60")))
    pid, run_dir = h.pid, launcher.run_dir
    del h
    again = Launcher(run_dir, cgroups)
    assert again.names() == ["w-adopt"]
    adopted = again.adopt("w-adopt")
    assert adopted is not None and adopted.pid == pid and adopted.alive()
    assert adopted.cpu_seconds() is not None and adopted.memory_bytes() > 0
    end = run(adopted.terminate(grace_s=2))
    assert end.signal == signal.SIGTERM
    assert again.adopt("w-adopt").exit() == end  # the end stays readable until forgotten
    again.forget("w-adopt")
    assert again.names() == [] and again.adopt("w-adopt") is None


STARTER = textwrap.dedent("""
    import asyncio, sys
    from hub_ext.host.accounts import Account
    from hub_ext.host.cgroups import detect
    from hub_ext.host.process import Launcher, Spec
    account = Account.from_json({account})
    h = asyncio.run(Launcher({run_dir!r}).start(Spec("w-orphan", ["sleep", "60"], {env!r}, None, account)))
    print(h.pid, flush=True)
    sys.stdin.read()  # until killed
""")


def test_monitor_survives_the_death_of_the_hub(launcher, alice):
    code = STARTER.format(account=alice.to_json(), run_dir=str(launcher.run_dir), env=PATH)
    hub = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid = int(hub.stdout.readline())
    hub.send_signal(signal.SIGKILL)
    hub.wait()
    time.sleep(0.2)
    h = launcher.adopt("w-orphan")
    assert h is not None and h.pid == pid and h.alive() and h.monitor_alive()
    end = run(h.terminate(grace_s=2))
    assert end.signal == signal.SIGTERM  # recorded by the monitor the dead hub started


def test_a_killed_monitor_leaves_an_end_without_status(launcher, alice):
    h = run(launcher.start(spec("w-nomon", alice, "sleep 60")))
    os.kill(h.monitor_pid, signal.SIGKILL)
    for _ in range(100):
        if not h.monitor_alive():
            break
        time.sleep(0.02)
    assert h.alive() and h.exit() is None  # the workload itself runs on
    os.kill(h.pid, signal.SIGKILL)
    end = run(h.wait(0.05))
    assert (end.code, end.signal) == (None, None)
    assert end.describe() == "ended; its monitor was killed"
    assert h.group.exists()  # no monitor left to remove it: forget does
    launcher.forget("w-nomon")
    assert not h.group.exists()


def test_without_cgroups_it_still_runs_ends_and_stops(tmp_path, alice):
    launcher = Launcher(tmp_path / "run", Cgroups("test: without cgroups"))
    h = run(launcher.start(spec("w-none", alice, "sleep 60")))
    assert h.alive() and h.cpu_seconds() is not None and h.memory_bytes() > 0
    end = run(h.terminate(grace_s=2))
    assert end.signal == signal.SIGTERM
    launcher.forget("w-none")


def test_a_command_that_cannot_run_is_an_error(launcher, alice):
    with pytest.raises(LaunchError, match="cannot run 'no-such-command-x'"):
        run(launcher.start(Spec("w-missing", ["no-such-command-x"], PATH, None, alice)))
    with pytest.raises(LaunchError, match="/nonexistent"):
        run(launcher.start(Spec("w-nocwd", ["true"], PATH, "/nonexistent", alice)))
    assert launcher.names() == []  # nothing started: nothing to adopt


def test_a_running_name_is_not_started_twice(launcher, alice):
    h = run(launcher.start(spec("w-twice", alice, "sleep 60")))
    with pytest.raises(LaunchError, match="already running"):
        run(launcher.start(spec("w-twice", alice, "sleep 60")))
    with pytest.raises(LaunchError, match="still running"):
        launcher.forget("w-twice")
    run(h.terminate(grace_s=2))
    h2 = run(launcher.start(spec("w-twice", alice, "exit 0")))  # an ended one is replaced
    assert run(h2.wait(0.05)).code == 0


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "../x"}, "workload name"),
    ({"name": ""}, "workload name"),
    ({"argv": []}, "argv"),
    ({"argv": "sleep 1"}, "argv"),
    ({"env": {"A=B": "c"}}, "env"),
    ({"env": {"A": 1}}, "env"),
])
def test_bad_spec_fields_are_named(alice, kwargs, field):
    base = {"name": "ok", "argv": ["true"], "env": PATH, "cwd": None, "account": alice}
    with pytest.raises(SpecError, match=field):
        Spec(**{**base, **kwargs})


PERSONAL = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from hub_ext.host.accounts import Accounts
    from hub_ext.host.process import Launcher, Spec
    account = Accounts(mode="personal").for_user("anyone")
    launcher = Launcher(Path(account.home) / "run")
    async def main():
        h = await launcher.start(Spec("w-personal", ["sh", "-c", "id -u; exit 5"], {env!r}, None, account))
        return await h.wait(0.05)
    end = asyncio.run(main())
    out = (launcher.run_dir / "w-personal" / "output.log").read_text()
    print(json.dumps({{"uid": account.uid, "code": end.code, "out": out, "enforced": launcher.cgroups.enforced,
                      "reason": launcher.cgroups.reason}}))
""")


def _world_readable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def test_personal_mode_without_root(alice):
    """A hub that is not root runs everything as its own user, with nothing enforced and a
    reason for the start-up log."""
    if not _world_readable(ROOT / "hub_ext" / "host"):
        pytest.skip("the checkout is not readable by another account")
    hub = subprocess.run([sys.executable, "-c", PERSONAL.format(env=PATH)], user=alice.uid, group=alice.gid,
                         extra_groups=[], env={"PYTHONPATH": str(ROOT), "HOME": str(alice.home)},
                         cwd=alice.home, capture_output=True, text=True, timeout=60)
    assert hub.returncode == 0, hub.stderr
    got = json.loads(hub.stdout.splitlines()[-1])
    assert got["uid"] == alice.uid and got["code"] == 5
    assert got["out"].strip() == str(alice.uid)
    assert not got["enforced"] and "not running as root" in got["reason"]


def test_a_log_in_the_accounts_home_is_opened_as_the_account(launcher, alice, home_root):
    """Root never follows a link the account planted on the way to its log: in its home the
    workload opens the log itself, so a link to a root-only directory gets it nothing."""
    h = run(launcher.start(spec("w-homelog", alice, "echo hello", log_path=alice.home / "w.log")))
    assert run(h.wait(0.05)).code == 0
    st = os.stat(alice.home / "w.log")
    assert (st.st_uid, st.st_mode & 0o777) == (alice.uid, 0o600)
    assert (alice.home / "w.log").read_text() == "hello\n"
    target = home_root / "root-only"
    target.mkdir(mode=0o755)
    try:
        (alice.home / "logs").symlink_to(target)
        with pytest.raises(LaunchError, match="Permission denied"):
            run(launcher.start(spec("w-linklog", alice, "echo no", log_path=alice.home / "logs" / "w.log")))
        assert not (target / "w.log").exists()
    finally:
        shutil.rmtree(target)


def test_two_starts_of_one_name_at_once(launcher, alice):
    async def both():
        return await asyncio.gather(launcher.start(spec("w-race", alice, "sleep 60")),
                                    launcher.start(spec("w-race", alice, "sleep 60")), return_exceptions=True)

    first, second = run(both())
    assert isinstance(second, LaunchError) and "being started already" in str(second)
    assert first.alive() and launcher.adopt("w-race").pid == first.pid
