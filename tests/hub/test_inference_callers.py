"""``POST /api/v1/inference-callers`` on a live hub (``gpupool up``) that registers an
activator's service token ($GPUPOOL_ACTIVATOR_TOKEN, the chart's activator): with that token,
a caller's JupyterHub token answers its user, whether they are a platform admin and their
projects (the same as the user's own ``/me``); a token nobody holds answers ``name`` null.
Only the activator's token may ask, and it may ask nothing else; bad bodies get a 400 naming
the field. ``serving.auth.HubApiAuth`` (the chart's activator's authorizer) turns the answer
into the rule's verdicts: 200, 401, 403."""

from __future__ import annotations

import asyncio
import secrets
from types import SimpleNamespace

import pytest
from hubclient import HubClient, call
from hubproc import ADMIN_PW, USER_PW, Hub

from hub_ext.serving.auth import BAD_TOKEN, NO_TOKEN, HubApiAuth

pytestmark = pytest.mark.timeout(300)
ACTIVATOR_TOKEN = secrets.token_hex(24)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    hub = Hub(tmp_path_factory.mktemp("hub-callers"),
              extra_env={"GPUPOOL_ACTIVATOR_TOKEN": ACTIVATOR_TOKEN}).start()
    hub.tokens = {u: HubClient(hub.url).login(u, USER_PW).token(u) for u in ("alice", "dave")}
    hub.tokens["admin"] = HubClient(hub.url).login("admin", ADMIN_PW).token("admin")
    yield hub
    hub.stop()


def ask(live, body, token: str = ACTIVATOR_TOKEN):
    return call(live.url, token, "POST", "/inference-callers", body)


def test_a_caller_s_token_answers_their_user_and_projects(live):
    for user in ("alice", "dave", "admin"):
        code, me = call(live.url, live.tokens[user], "GET", "/me")
        assert code == 200, me
        code, who = ask(live, {"token": live.tokens[user]})
        assert code == 200, who
        assert who == {"name": user, "admin": user == "admin", "projects": me["projects"]}
    assert "nlp" in ask(live, {"token": live.tokens["alice"]})[1]["projects"]
    assert "nlp" not in ask(live, {"token": live.tokens["dave"]})[1]["projects"]
    # a token nobody holds, and a service's token (the activator's own), are nobody
    assert ask(live, {"token": secrets.token_hex(16)}) == (
        200, {"name": None, "admin": False, "projects": []})
    assert ask(live, {"token": ACTIVATOR_TOKEN})[1]["name"] is None


def test_only_the_activator_s_token_may_ask_and_only_this(live):
    code, body = ask(live, {"token": live.tokens["dave"]}, token="")
    assert code == 401, body
    for user in ("alice", "admin"):  # a person, even a platform admin, may not
        code, body = ask(live, {"token": live.tokens["dave"]}, token=live.tokens[user])
        assert code == 403 and "custom:gpupool:inference-auth" in body["error"]["message"], body
    # the activator's token reaches no other part of the API
    for path in ("/me", "/projects", "/inferences", "/nodes"):
        code, body = call(live.url, ACTIVATOR_TOKEN, "GET", path)
        assert code == 403, (path, body)


@pytest.mark.parametrize("body, field", [
    ({}, "token"),
    ({"token": ""}, "token"),
    ({"token": "   "}, "token"),
    ({"token": 42}, "token"),
    ({"token": ["a"]}, "token"),
    ({"token": "two words"}, "token"),
    ({"token": "x" * 513}, "token"),
    ({"token": "abc\u0000def"}, "token"),
    ({"token": "abc", "project": "nlp"}, "project"),
    ([1, 2], "body"),
])
def test_bad_bodies_name_the_field(live, body, field):
    code, answer = ask(live, body)
    assert code == 400, answer
    assert answer["error"]["field"] == field, answer


def test_the_activator_s_authorizer_gives_the_rule_s_verdicts(live):
    """HubApiAuth against this hub: alice (member of nlp) is let in, dave (not a member)
    gets 403 with the rule's reason, an unknown token 401, no token 401; the admin is let
    in; a second check of a known token answers at once (the cache)."""
    auth = HubApiAuth(live.url + "/services/gpupool/", ACTIVATOR_TOKEN, cache_s=60)
    svc = SimpleNamespace(spec=SimpleNamespace(project="nlp"))

    def request(token: str = ""):
        headers = {"Authorization": f"token {token}"} if token else {}
        return SimpleNamespace(header=lambda name, d="": headers.get(name, d),
                               argument=lambda name, d="": d)

    async def verdicts():
        out = {}
        for who, token in (("alice", live.tokens["alice"]), ("dave", live.tokens["dave"]),
                           ("admin", live.tokens["admin"]), ("nobody", secrets.token_hex(16))):
            out[who] = await auth.check(request(token), svc)
        out["cached"] = auth.check(request(live.tokens["dave"]), svc)  # no round trip
        return out

    v = asyncio.run(verdicts())
    assert v["alice"] is None and v["admin"] is None
    assert v["dave"][0] == 403 and "dave is not a member of project 'nlp'" in v["dave"][1]
    assert v["nobody"] == (401, BAD_TOKEN, "Authorization")
    assert v["cached"] == v["dave"]
    assert auth.check(request(), svc) == (401, NO_TOKEN, "Authorization")

    # the activator's own token wrong: the hub's 401 is told (a 503 to the caller), not a verdict
    wrong = HubApiAuth(live.url + "/services/gpupool/", secrets.token_hex(24))
    with pytest.raises(RuntimeError, match="answered 401"):
        asyncio.run(wrong.resolve(live.tokens["alice"]))
