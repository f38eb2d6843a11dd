"""Single sign-on end to end in the browser: a real OIDC provider (Dex, tests/governance/dex.py)
on 127.0.0.1, a hub with ``c.Gpupool.auth = 'oidc'``, Playwright driving Debian's chromium.

Login through the provider's form, logout, a user whose groups change at the provider gets
the new project membership at the next login, a group mapped to a role gives that role, and
a user with no mapped group sees a page that says so (403 with the reason, not a 500)."""

import re
import shutil
from pathlib import Path

import pytest
from hubproc import Hub

from .dex import CLIENT_ID, CLIENT_SECRET, Dex, dex_binary, dex_login, my_projects

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed "
                       "(scripts/setup-system installs it)"),
]
ORG = Path(__file__).parent / "org.yaml"
USERS = {
    "ann": {"password": "ann-pw-1", "groups": ["nlp-team"]},
    "lee": {"password": "lee-pw-1", "groups": ["research-leads", "staff"]},
    "kim": {"password": "kim-pw-1", "groups": ["gpu-admins"]},
    "aud": {"password": "aud-pw-1", "groups": ["auditors"]},
    "zed": {"password": "zed-pw-1", "groups": ["interns"]},  # mapped to nothing
}
MAPPING = """
c.Gpupool.oidc_group_projects = {'nlp-team': ['nlp'], 'vision-team': ['vision']}
c.Gpupool.oidc_group_roles = {'gpu-admins': ['platform-admin'],
                              'research-leads': ['department-admin:research'],
                              'auditors': ['viewer:*']}
"""


@pytest.fixture(scope="module")
def sso(tmp_path_factory):
    binary = dex_binary()
    if binary is None:
        pytest.fail("Dex is not built: run scripts/build-dex (make test does)")
    work = tmp_path_factory.mktemp("sso")
    hub = Hub(work / "hub")
    dex = Dex(work / "dex", f"{hub.url}/hub/oauth_callback", binary).start(USERS)
    hub.config = (f"c = get_config()  # noqa\nc.Gpupool.org_file = {str(ORG)!r}\n"
                  f"c.Gpupool.auth = 'oidc'\nc.Gpupool.oidc_issuer = {dex.issuer!r}\n"
                  f"c.Gpupool.oidc_client_id = {CLIENT_ID!r}\n"
                  f"c.Gpupool.oidc_client_secret = {CLIENT_SECRET!r}\n{MAPPING}")
    try:
        hub.start()
        yield hub, dex
    finally:
        hub.stop()
        dex.stop()


def sso_login(browser, hub, user, expect_home=True):
    """Log in through the hub's button and the provider's form; returns the page."""
    return dex_login(browser, hub.url, user, USERS[user]["password"], expect_home)


def test_login_and_logout(sso, browser):
    hub, _ = sso
    page = sso_login(browser, hub, "ann")
    assert "ann" in page.inner_text("body")
    assert my_projects(page, hub) == ["nlp"]
    page.goto(hub.url + "/hub/logout")
    page.goto(hub.url + "/hub/home")
    page.wait_for_url(re.compile(r".*/hub/login.*"))
    assert page.locator("text=Sign in with single sign-on").count() == 1
    page.click("text=Sign in with single sign-on")  # the provider asks for the password again
    page.wait_for_selector("#login")


def test_group_change_gives_new_membership_at_next_login(sso, browser):
    hub, dex = sso
    assert my_projects(sso_login(browser, hub, "ann"), hub) == ["nlp"]
    dex.restart({**USERS, "ann": {**USERS["ann"], "groups": ["vision-team"]}})
    try:
        page = sso_login(browser, hub, "ann")
        assert my_projects(page, hub) == ["vision"]
        # and the rule follows at once: the old project is now someone else's
        status = page.evaluate("""async () => (await fetch(API + '/projects/nlp',
            {headers: {'X-XSRFToken': XSRF}})).status""")
        assert status == 403
    finally:
        dex.restart(USERS)
    assert my_projects(sso_login(browser, hub, "ann"), hub) == ["nlp"]


def test_group_mapped_to_roles(sso, browser, shots):
    hub, _ = sso
    lee = sso_login(browser, hub, "lee")  # research-leads -> department admin of research
    assert sorted(my_projects(lee, hub)) == ["nlp", "vision"]
    assert "(department admin)" in lee.inner_text("header")
    assert lee.locator("#projects tr[data-name=nlp] button", has_text="Save").count() == 1
    lee.screenshot(path=str(shots / "sso-department-admin.png"), full_page=True)
    me = lee.evaluate("""async () => (await (await fetch(API + '/roles',
        {headers: {'X-XSRFToken': XSRF}})).json()).me""")
    assert me["department_admin_of"] == ["research"] and me["roles"] == ["department-admin"]
    kim = sso_login(browser, hub, "kim")  # gpu-admins -> platform admin
    assert sorted(my_projects(kim, hub)) == ["nlp", "serving", "vision"]
    assert "(admin)" in kim.inner_text("header")
    aud = sso_login(browser, hub, "aud")  # auditors -> viewer of every department
    assert sorted(my_projects(aud, hub)) == ["nlp", "serving", "vision"]
    assert "(read-only)" in aud.inner_text("header") and aud.locator("#projects button").count() == 0
    status = aud.evaluate("""async () => (await fetch(API + '/projects/nlp', {method: 'PATCH',
        headers: {'Content-Type': 'application/json', 'X-XSRFToken': XSRF}, body: '{}'})).status""")
    assert status == 403


def test_no_mapped_group_sees_a_clear_page(sso, browser, shots):
    hub, _ = sso
    page = sso_login(browser, hub, "zed", expect_home=False)
    page.wait_for_selector("#gpupool-no-access")
    page.screenshot(path=str(shots / "sso-no-access.png"), full_page=True)
    text = page.inner_text("#gpupool-no-access")
    assert "zed" in text and "interns" in text and "mapped" in text, text
    assert "403" in page.inner_text("body") and "500" not in page.inner_text("body")
    page.goto(hub.url + "/hub/home")
    page.wait_for_url(re.compile(r".*/hub/login.*"))  # not logged in


# -- the mapping without a browser ---------------------------------------------------------
def _cfg(**kw):
    from hub_ext.config import Gpupool

    return Gpupool(oidc_group_projects={"nlp-team": ["nlp"], "vision-team": ["vision"]},
                   oidc_group_roles={"leads": ["department-admin:research"], "ops": ["platform-admin"],
                                     "audit": ["viewer:*"]}, **kw)


def test_mapping_rules():
    from hub_ext.org import auth

    cfg = _cfg()
    assert auth.map_groups(cfg, {"nlp-team", "leads", "x"}) == (
        {"nlp"}, {("department-admin", "research")}, False)
    assert auth.map_groups(cfg, {"ops"}) == (set(), set(), True)
    assert auth.map_groups(cfg, {"x"}) == (set(), set(), False)
    for bad in ("emperor", "department-admin", "department-admin:*", "platform-admin:research"):
        with pytest.raises(auth.MappingError, match="oidc_group_roles"):
            auth.parse_role(bad)
    with pytest.raises(auth.MappingError, match=r"oidc_group_projects\['g'\]"):
        auth.check_mapping(_cfg().__class__(oidc_group_projects={"g": "nlp"}))


def test_sync_keeps_memberships_the_mapping_does_not_name(tmp_path):
    from hub_ext.org import auth, roles
    from hub_ext.org import projects as org
    from hub_ext.schema import make_sessionmaker

    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'g.sqlite'}")
    with Session() as s:
        org.load_starter(s, ORG)  # bob: serving (named by no mapping)
        auth.sync_user(s, _cfg(), "bob", {"nlp"}, {("viewer", "*")})
        s.commit()
        assert org.projects_of(s, "bob") == ["nlp", "serving"]
        auth.sync_user(s, _cfg(), "bob", {"vision"}, set())  # groups changed at the provider
        s.commit()
        assert org.projects_of(s, "bob") == ["serving", "vision"]
        assert [a for a in roles.assignments(s, "bob")] == []
        auth.sync_user(s, _cfg(), "erin", set(), {("viewer", "ops"), ("viewer", "gone")})
        s.commit()  # erin's org-file department-admin stays; an unknown department is skipped
        got = {(a["role"], a["department"], a["source"]) for a in roles.assignments(s, "erin")}
        assert got == {("department-admin", "research", "org"), ("viewer", "ops", "oidc")}
