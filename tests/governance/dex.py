"""Dex, a real OIDC provider, on 127.0.0.1 for the single sign-on tests.

The binary comes from ``scripts/build-dex`` (built once from Dex's Go module and cached
under ~/.cache/gpupool/dex-VERSION; ``make test`` builds it). Users are Dex static passwords
with groups; ``restart(users)`` changes them (Dex reads its config at start), which is how a
test changes someone's groups at the provider."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import bcrypt

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "gpupool", "gpupool-test-secret-0123456789"


def dex_binary() -> str | None:
    """Path of the cached Dex, or None when scripts/build-dex has not built it yet."""
    try:
        subprocess.run([str(ROOT / "scripts" / "build-dex"), "cached"], check=True)
    except subprocess.CalledProcessError:
        return None
    out = subprocess.run([str(ROOT / "scripts" / "build-dex")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dex:
    def __init__(self, workdir: Path, redirect_uri: str, binary: str):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}/dex"
        self.redirect_uri = redirect_uri
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "dex.log"
        self._hashes: dict[str, str] = {}

    def _hash(self, password: str) -> str:
        if password not in self._hashes:  # cost 10: Dex's minimum, and quick
            self._hashes[password] = bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()
        return self._hashes[password]

    def config(self, users: dict[str, dict]) -> dict:
        """users: name -> {password, groups}; the login is NAME@example.com."""
        return {
            "issuer": self.issuer,
            "storage": {"type": "memory"},
            "web": {"http": f"127.0.0.1:{self.port}"},
            "logger": {"level": "info"},
            "oauth2": {"skipApprovalScreen": True},
            "enablePasswordDB": True,
            "staticClients": [{"id": CLIENT_ID, "secret": CLIENT_SECRET, "name": "gpupool",
                               "redirectURIs": [self.redirect_uri]}],
            "staticPasswords": [
                {"email": f"{name}@example.com", "username": name, "preferredUsername": name,
                 "userID": f"id-{name}", "hash": self._hash(u["password"]), "groups": list(u["groups"])}
                for name, u in users.items()
            ],
        }

    def start(self, users: dict[str, dict], timeout: float = 60) -> Dex:
        cfg = self.workdir / "dex.yaml"
        cfg.write_text(json.dumps(self.config(users), indent=1))  # JSON is YAML
        self.proc = subprocess.Popen([self.binary, "serve", str(cfg)], stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dex exited: {self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.issuer + "/.well-known/openid-configuration", timeout=2)
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"dex did not come up: {self.log.read_text()[-3000:]}")

    def restart(self, users: dict[str, dict]) -> Dex:
        self.stop()
        return self.start(users)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def dex_login(browser, hub_url: str, user: str, password: str, expect_home: bool = True):
    """Log in to the hub at ``hub_url`` through its single sign-on button and Dex's form
    (login ``USER@example.com``); returns the page."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(60_000)
    page.goto(hub_url + "/hub/login")
    page.click("text=Sign in with single sign-on")
    page.wait_for_selector("#login")  # Dex's password form
    page.fill("#login", f"{user}@example.com")
    page.fill("#password", password)
    page.click("#submit-login")
    if expect_home:
        page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"))
    return page


def my_projects(page, hub) -> list[str]:
    """The projects the logged-in user of ``page`` belongs to, as the org page lists them."""
    page.goto(hub.url + "/services/gpupool/org")
    page.wait_for_selector("#projects")
    return page.locator("#projects tr[data-name]").evaluate_all("rows => rows.map(r => r.dataset.name)")
