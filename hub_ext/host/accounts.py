"""One Unix account per hub user, so that each user's work runs with that user's permissions
and nobody else's (as JupyterHub's LocalProcessSpawner and The Littlest JupyterHub do).

Three modes:

- ``create`` (the default as root): the account ``{prefix}{username}`` is made on first use
  with ``useradd`` and a 0700 home under ``home_root``. Its comment field carries a mark of
  the hub user it was made for, so an account gpupool did not make (``daemon``, ``root``) or
  made for someone else is never handed out.
- ``existing``: ``template`` names an account that must already exist (``{username}`` maps
  hub user alice to Unix user alice).
- ``personal`` (the default when not root): everyone is the hub's own account; only the OS
  user who started the hub may log in, which the hub enforces.

No account with uid 0 is ever returned in ``create`` or ``existing`` mode.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import AccountError

MODES = ("create", "existing", "personal")
MAX_NAME = 32  # useradd's limit on Debian and most distributions
_VALID = re.compile(r"^[a-z_][a-z0-9_-]*$")
_HASHED = re.compile(r"-[0-9a-f]{5}$")
_PREFIX = re.compile(r"^[a-z_][a-z0-9_-]{0,15}$|^$")
_LOCK_RETRIES = 6  # useradd/userdel fail while another tool holds /etc/passwd's lock


@dataclass(frozen=True)
class Account:
    """A Unix account a workload runs as."""

    name: str
    uid: int
    gid: int
    home: Path

    def to_json(self) -> dict:
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "home": str(self.home)}

    @classmethod
    def from_json(cls, d: dict) -> Account:
        return cls(d["name"], int(d["uid"]), int(d["gid"]), Path(d["home"]))

    @classmethod
    def from_pwd(cls, p: pwd.struct_passwd) -> Account:
        return cls(p.pw_name, p.pw_uid, p.pw_gid, Path(p.pw_dir))


def default_mode() -> str:
    """``create`` when the hub runs as root (it can make accounts), else ``personal``."""
    return "create" if os.geteuid() == 0 else "personal"


def default_prefix() -> str:
    """The prefix of the accounts gpupool makes: $GPUPOOL_ACCOUNT_PREFIX, else ``gpupool-``."""
    return os.environ.get("GPUPOOL_ACCOUNT_PREFIX", "gpupool-")


def unix_name(name: str) -> str:
    """A valid Unix user name for ``name`` (the template's output): lowercased, every
    character outside ``[a-z0-9_-]`` made ``-``, ``_`` in front of a leading digit or ``-``.
    A name that changed, or is longer than 32 characters, is cut and ends in ``-`` and five
    hex digits of the SHA-256 of ``name`` (as TLJH does), so that two hub users whose names
    differ only in what was replaced ("a.b", "a-b") do not share an account. A name that
    already ends so is given the suffix too, so a kept name never equals a cut one."""
    out = re.sub(r"[^a-z0-9_-]", "-", name.lower())
    if not out or not re.match(r"[a-z_]", out[0]):
        out = "_" + out
    if out != name or len(out) > MAX_NAME or _HASHED.search(out):
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:5]
        out = f"{out[: MAX_NAME - 6]}-{digest}"
    return out


def owner_mark(hub_user: str) -> str:
    """The comment field of an account made for ``hub_user``: no ``:``, ``,`` or newline
    whatever the name holds, and the same for the same user."""
    return "gpupool " + hashlib.sha256(hub_user.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class Accounts:
    """Maps hub users to Unix accounts (see the module docstring for the modes).

    ``template`` is formatted with ``prefix`` and ``username``; its default is
    ``{prefix}{username}`` in ``create`` mode and ``{username}`` in ``existing`` mode.
    Lookups are cached; ``remove`` forgets the cached entry."""

    def __init__(self, mode: str = "create", prefix: str = "gpupool-", home_root: str | Path = "/home",
                 template: str | None = None):
        if mode not in MODES:
            raise AccountError(f"accounts mode {mode!r} is not one of {', '.join(MODES)}")
        if not _PREFIX.match(prefix):
            raise AccountError(f"account prefix {prefix!r}: at most 16 characters of a-z, 0-9, _ and -, "
                               "starting with a letter or _")
        if not Path(home_root).is_absolute():
            raise AccountError(f"account home_root {str(home_root)!r} must be an absolute path")
        self.mode = mode
        self.prefix = prefix
        self.home_root = Path(home_root)
        self.template = template if template is not None else (
            "{username}" if mode == "existing" else "{prefix}{username}")
        try:
            self.template.format(prefix=prefix, username="x")
        except (KeyError, IndexError, ValueError) as e:
            raise AccountError(f"account template {self.template!r} may use only {{prefix}} and "
                               f"{{username}} ({e!r})") from None
        self._cache: dict[str, Account] = {}
        self._lock = threading.Lock()

    def name_for(self, hub_user: str) -> str:
        """The Unix name ``hub_user`` maps to (not checked against the system)."""
        if not hub_user:
            raise AccountError("hub user name is empty")
        raw = self.template.format(prefix=self.prefix, username=hub_user)
        return unix_name(raw) if self.mode == "create" else raw

    def for_user(self, hub_user: str) -> Account:
        """The account of ``hub_user``; in ``create`` mode it is made on first use."""
        cached = self._cache.get(hub_user)
        if cached is not None:
            return cached
        if self.mode == "personal":
            account = Account.from_pwd(pwd.getpwuid(os.geteuid()))
        elif self.mode == "existing":
            account = self._existing(hub_user)
        else:
            with self._lock:  # one useradd at a time, and a second caller finds the first's account
                account = self._cache.get(hub_user) or self._create(hub_user)
        self._cache[hub_user] = account
        return account

    def remove(self, hub_user: str) -> None:
        """Delete the account made for ``hub_user`` and its home (``create`` mode only: an
        account gpupool did not make is never deleted). No account: nothing to do."""
        if self.mode != "create":
            raise AccountError(f"accounts mode {self.mode!r} does not delete accounts")
        name = self.name_for(hub_user)
        with self._lock:
            self._cache.pop(hub_user, None)
            try:
                p = pwd.getpwnam(name)
            except KeyError:
                return
            self._check_ours(p, hub_user)
            _run_locked(["userdel", "--remove", name], f"deleting account {name!r}", ok=(0, 12))

    def _existing(self, hub_user: str) -> Account:
        name = self.name_for(hub_user)
        try:
            p = pwd.getpwnam(name)
        except KeyError:
            raise AccountError(f"no Unix account {name!r} for hub user {hub_user!r} (accounts mode "
                               f"'existing' maps users with template {self.template!r})") from None
        _refuse_root(p, hub_user)
        return Account.from_pwd(p)

    def _create(self, hub_user: str) -> Account:
        name = self.name_for(hub_user)
        try:
            p = pwd.getpwnam(name)
        except KeyError:
            home = self.home_root / name
            self.home_root.mkdir(parents=True, exist_ok=True)
            _run_locked(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                         "--user-group", "--comment", owner_mark(hub_user), name],
                        f"creating account {name!r} for hub user {hub_user!r}")
            p = pwd.getpwnam(name)
        self._check_ours(p, hub_user)
        home = Path(p.pw_dir)
        if home.is_symlink() or (home.exists() and not home.is_dir()):
            raise AccountError(f"account {name!r}: home {str(home)!r} is not a directory")
        home.mkdir(parents=True, exist_ok=True)  # removed by hand since: made again, empty
        os.chown(home, p.pw_uid, p.pw_gid)
        os.chmod(home, 0o700)
        return Account.from_pwd(p)

    def _check_ours(self, p: pwd.struct_passwd, hub_user: str) -> None:
        _refuse_root(p, hub_user)
        if p.pw_gecos != owner_mark(hub_user):
            raise AccountError(f"Unix account {p.pw_name!r} exists and was not made by gpupool for hub "
                               f"user {hub_user!r}; choose another account prefix or accounts mode 'existing'")


def login_shell(uid: int) -> str:
    """The shell a person works in as account ``uid`` (a terminal, an SSH session): its login
    shell, unless that is missing, not an absolute executable path or a refusal (``nologin``,
    ``false``); then bash where installed, else ``/bin/sh``."""
    try:
        shell = pwd.getpwuid(uid).pw_shell
    except KeyError:
        shell = ""
    if not shell.startswith("/") or not os.access(shell, os.X_OK) or shell.endswith(("nologin", "false")):
        shell = shutil.which("bash") or "/bin/sh"
    return shell


def _refuse_root(p: pwd.struct_passwd, hub_user: str) -> None:
    if p.pw_uid == 0:
        raise AccountError(f"Unix account {p.pw_name!r} (hub user {hub_user!r}) has uid 0: "
                           "no workload runs as root")


def _run_locked(argv: list[str], what: str, ok: tuple[int, ...] = (0,)) -> None:
    """Run useradd/userdel, again after a short pause when it could not update /etc/passwd
    or /etc/group (exit status 1 or 10): another tool held the lock or was replacing them."""
    for attempt in range(_LOCK_RETRIES):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise AccountError(f"{what}: {argv[0]} is not installed") from None
        if r.returncode in ok:
            return
        if r.returncode in (1, 10) and attempt + 1 < _LOCK_RETRIES:
            time.sleep(0.05 * 2**attempt)
            continue
        raise AccountError(f"{what}: {argv[0]} exit status {r.returncode}: {r.stderr.strip()}")


__all__ = ["Account", "AccountError", "Accounts", "MODES", "default_mode", "owner_mark", "unix_name"]
