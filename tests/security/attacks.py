"""Helpers of the attack tests: run an attack step in a user's JupyterLab kernel and get a
structured answer back; find, as root, exactly what an attacker would aim at (a process,
its environment, its listening sockets), so that each denial is checked against a target
that is known to exist.

An attack step answers ``{"ok": what it got}`` or ``{"error": exception class, "errno":
symbol}``; the tests compare that with ``EACCES`` / ``EPERM`` / ``REFUSED`` below.
"""

from __future__ import annotations

import json
import re
import socket
import textwrap
from dataclasses import dataclass
from pathlib import Path

from hubkernel import run_code

EACCES = {"error": "PermissionError", "errno": "EACCES"}  # a file or folder: permission denied
EPERM = {"error": "PermissionError", "errno": "EPERM"}  # a signal to another account's process
# what "no direct connection" may look like: nothing listening that this user may reach
REFUSED = ({"error": "ConnectionRefusedError", "errno": "ECONNREFUSED"}, EACCES, EPERM)

# Runs before every attack in the kernel. Opening for writing is the step a write attack
# is checked on: nothing is ever written, so an attack that succeeds changes no file.
PRELUDE = r'''
import errno as _errno, json as _json, os, pwd, signal, socket, stat, urllib.request, urllib.error

def attempt(fn, *args):
    try:
        got = fn(*args)
    except OSError as e:
        return {"error": type(e).__name__, "errno": _errno.errorcode.get(e.errno, str(e.errno))}
    return {"ok": got if isinstance(got, (str, int, float, bool, list, dict, type(None))) else repr(got)}

def read(path):
    with open(path, "rb") as f:
        return "read %d bytes" % len(f.read())

def open_for_writing(path):
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    return "opened for writing"

def http_get(url, token=""):
    req = urllib.request.Request(url, headers={"Authorization": "token " + token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return {"status": r.status, "body": r.read(2000).decode(errors="replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read(2000).decode(errors="replace")}

def raw_http_status(family, address):
    """The status line a server at ``address`` answers to a request without credentials."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(address)
        s.sendall(b"GET /predict HTTP/1.0\r\nHost: replica\r\n\r\n")
        line = s.makefile("rb").readline().decode(errors="replace")
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else line

def answer(value):
    print("\n@@ANSWER@@" + _json.dumps(value))
'''
MARK = "@@ANSWER@@"


def in_kernel(url: str, user: str, token: str, code: str, args: dict | None = None,
              server: str = "") -> object:
    """Run ``code`` (which calls ``answer(...)`` once) in a new kernel of ``user``'s
    JupyterLab; ``args`` arrive as the dict ``ARGS``. Returns what it answered."""
    source = (PRELUDE + f"ARGS = _json.loads({json.dumps(args or {})!r})\n" + textwrap.dedent(code))
    out = run_code(url, f"/user/{user}/{server}", token, source, timeout=120)
    at = out.rfind(MARK)
    if at < 0:
        raise AssertionError(f"the kernel of {user} gave no answer:\n{out[-4000:]}")
    return json.loads(out[at + len(MARK):].splitlines()[0])


# -- targets, found as root ------------------------------------------------------------------
@dataclass(frozen=True)
class Proc:
    pid: int
    uid: int
    argv: tuple[str, ...]

    def environ(self) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{self.pid}/environ").read_bytes()
        except OSError:
            return {}
        pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
        return {k: v for k, _, v in pairs}


def processes() -> list[Proc]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = tuple(a.decode(errors="replace")
                         for a in (entry / "cmdline").read_bytes().split(b"\0") if a)
            uid = entry.stat().st_uid
        except OSError:  # gone meanwhile
            continue
        if argv:
            out.append(Proc(int(entry.name), uid, argv))
    return out


def find(pred, what: str) -> list[Proc]:
    found = [p for p in processes() if pred(p)]
    if not found:
        raise AssertionError(f"no process found: {what}")
    return found


def has_args(p: Proc, *seq: str) -> bool:
    """``seq`` appears in the argument list as consecutive arguments."""
    n = len(seq)
    return any(p.argv[i:i + n] == seq for i in range(len(p.argv) - n + 1))


# Environment variables that hold a secret of whoever runs with them.
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD", re.IGNORECASE)


def secrets_in(env: dict[str, str]) -> dict[str, str]:
    """The values of ``env`` that look like secrets (named so, long enough to be one)."""
    return {k: v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 16}


# -- listening sockets of a process ------------------------------------------------------------
def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = str(fd.readlink())
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", link)
        if m:
            inodes.add(int(m.group(1)))
    return inodes


def _ipv4(hexaddr: str) -> str:
    return socket.inet_ntoa(bytes.fromhex(hexaddr)[::-1])


def _ipv6(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)  # four 32-bit words, each in host (little-endian) order
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening(pid: int) -> list[dict]:
    """Where process ``pid`` accepts connections: ``{"family": "tcp", "host", "port"}``
    (an any-address is given as loopback, what a local attacker dials) or
    ``{"family": "unix", "path"}`` (an abstract name starts with ``@``)."""
    inodes = _socket_inodes(pid)
    found = []
    for table, decode, anyaddr, loop in (("tcp", _ipv4, "0.0.0.0", "127.0.0.1"),
                                         ("tcp6", _ipv6, "::", "::1")):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[9]) in inodes:  # state LISTEN
                host, port = f[1].split(":")
                addr = decode(host)
                found.append({"family": "tcp", "host": loop if addr == anyaddr else addr,
                              "port": int(port, 16)})
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        # Flags __SO_ACCEPTCON (0x10000): a listening socket; only a named one can be dialled
        if len(f) >= 8 and int(f[6]) in inodes and int(f[3], 16) & 0x10000:
            found.append({"family": "unix", "path": f[7]})
    return found
