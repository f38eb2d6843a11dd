"""Shared fixtures of the governance tests (single sign-on, roles, credentials, accounting):
a real hub (tests/hub/hubproc.py) loaded with ``org.yaml`` here, one user per role, a
token for each, and ``api()`` that returns (status, JSON)."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "hub"))

from hubclient import HubClient, call  # noqa: E402
from hubproc import ADMIN_PW, USER_PW, Hub  # noqa: E402

ORG = HERE / "org.yaml"
# user -> what they are in org.yaml (the role matrix reads this)
PEOPLE = {
    "admin": "platform-admin",
    "erin": "department-admin",  # of research (nlp, vision)
    "alice": "member",  # of nlp (research)
    "vic": "viewer",  # of research
    "val": "viewer-all",  # of every department
    "oscar": "none",  # no project, no role
    "bob": "member",  # of serving (ops)
    "olga": "department-admin",  # of ops
}


def gov_config(extra: str = "") -> str:
    return f"c = get_config()  # noqa\nc.Gpupool.org_file = {str(ORG)!r}\n{extra}"


@pytest.fixture(scope="session")
def gov_hub(tmp_path_factory):
    """A hub with org.yaml and a token for each of PEOPLE (``gov_hub.tokens[user]``)."""
    h = Hub(tmp_path_factory.mktemp("govhub"), config=gov_config()).start()
    h.tokens = {u: HubClient(h.url).login(u, ADMIN_PW if u == "admin" else USER_PW).token(u)
                for u in PEOPLE}
    yield h
    h.stop()


def api(hub, user: str, method: str, path: str, body=None):
    """(status, JSON body) of a gpupool API call as ``user``."""
    return call(hub.url, hub.tokens.get(user, ""), method, path, body)
