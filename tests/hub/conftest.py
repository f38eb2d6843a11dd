import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hubclient import HubClient  # noqa: E402
from hubproc import ADMIN_PW, USER_PW, Hub  # noqa: E402


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("hub")).start()
    h.tokens = {}
    for user in ("alice", "bob", "carol", "dave"):
        h.tokens[user] = HubClient(h.url).login(user, USER_PW).token(user)
    h.tokens["admin"] = HubClient(h.url).login("admin", ADMIN_PW).token("admin")
    yield h
    h.stop()
