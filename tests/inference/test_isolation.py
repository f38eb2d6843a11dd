"""A replica runs as its service owner's account, with an environment built from scratch
(nothing of the hub's), and one that listens on ``{socket}`` is reachable only through the
activator: the socket's folder is the account's, mode 0700, so another account cannot
connect. Real accounts (made as root, removed after), real processes and sockets."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import MODEL_SERVER, OWNER, stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accounts are made only as root")

NAME = "iso-" + "x" * 56  # the longest name: its socket's path must still fit (107 bytes)
CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(type(e).__name__)
else:
    print("connected")
"""


def proc_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if item)


def test_a_socket_replica_runs_as_its_owner_and_only_the_activator_reaches_it(monkeypatch):
    monkeypatch.setenv("GPUPOOL_TEST_HUB_SECRET", "only-the-hub-has-this")

    async def main():
        async with stack() as st:
            svc = st.put(name=NAME, max_replicas=1, scale_to_zero_after_s=60,
                         command=[sys.executable, MODEL_SERVER, "--socket", "{socket}", "--startup-s", "0"])
            async with st.http.get(f"{st.url}/{NAME}/predict", params={"client": "a"}) as r:
                assert r.status == 200, await r.text()
                pid = json.loads(await r.read())["pid"]
            (replica,) = svc.ready()
            owner, other = st.accounts.for_user(OWNER), st.accounts.for_user("bob")
            try:
                assert replica.handle.proc.pid == pid
                assert replica.socket and replica.port == 0
                assert replica.to_dict()["endpoint"] == f"unix:{replica.socket}"
                uid, env = proc_uid(pid), proc_env(pid)
                denied = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", CONNECT, replica.socket],
                                                 user=other.uid, group=other.gid, env={}, capture_output=True,
                                                 text=True, check=True)
                mine = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", CONNECT, replica.socket],
                                               user=owner.uid, group=owner.gid, env={}, capture_output=True,
                                               text=True, check=True)
                folder = Path(replica.socket).parent.stat()
                return uid, owner, env, denied.stdout.strip(), mine.stdout.strip(), folder
            finally:
                st.accounts.remove("bob")

    uid, owner, env, denied, mine, folder = asyncio.run(main())
    assert uid == owner.uid != 0
    assert env["USER"] == owner.name and env["HOME"] == str(owner.home)
    assert env["GPUPOOL_SOCKET"].startswith(str(owner.home) + "/")
    assert "PORT" not in env and "GPUPOOL_TEST_HUB_SECRET" not in env
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (owner.uid, 0o700)
    assert denied == "PermissionError"  # another account cannot reach the replica
    assert mine == "connected"
