"""Hub users -> Unix accounts: made on first use with a 0700 home, looked up from the cache,
removed; existing and personal modes; never root; names always valid and distinct."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub_ext.host.accounts import (
    MAX_NAME,
    AccountError,
    Accounts,
    default_mode,
    owner_mark,
    unix_name,
)

from .conftest import needs_root

VALID = re.compile(r"^[a-z_][a-z0-9_-]*$")


@given(st.text(min_size=1, max_size=80))
def test_unix_name_is_always_valid(name):
    out = unix_name(name)
    assert VALID.match(out), out
    assert len(out) <= MAX_NAME


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_distinct_names_map_to_distinct_accounts(a, b):
    if a != b:
        assert unix_name(a) != unix_name(b)


@pytest.mark.parametrize("name, expected", [
    ("gpupool-alice", "gpupool-alice"),
    ("gpupool-a.b", "gpupool-a-b-" + __import__("hashlib").sha256(b"gpupool-a.b").hexdigest()[:5]),
])
def test_unix_name_keeps_valid_names_and_marks_changed_ones(name, expected):
    assert unix_name(name) == expected


def test_long_and_lookalike_names_get_a_digest():
    long = "gpupool-" + "x" * 40
    assert len(unix_name(long)) == MAX_NAME and unix_name(long) != unix_name(long + "y")
    assert unix_name("Alice") != unix_name("alice")
    # a kept name never equals a cut one: a name already ending in -HHHHH is cut too
    cut = unix_name("gpupool-a.b")
    assert unix_name(cut) != cut


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "shared"}, "mode"),
    ({"prefix": "Bad!"}, "prefix"),
    ({"home_root": "relative/home"}, "home_root"),
    ({"template": "{user}"}, "template"),
])
def test_bad_settings_name_the_setting(kwargs, field):
    with pytest.raises(AccountError, match=field):
        Accounts(**kwargs)


def test_default_mode_follows_the_hubs_user():
    assert default_mode() == ("create" if os.geteuid() == 0 else "personal")


def test_personal_mode_is_the_hubs_own_account():
    account = Accounts(mode="personal").for_user("anyone")
    assert account.uid == os.geteuid()
    assert account.name == pwd.getpwuid(os.geteuid()).pw_name


@needs_root
def test_create_lookup_remove(accounts, home_root):
    account = accounts.for_user("alice")
    p = pwd.getpwnam(account.name)
    assert (p.pw_uid, p.pw_gid, p.pw_dir) == (account.uid, account.gid, str(account.home))
    assert account.uid != 0
    assert account.home == home_root / account.name
    st = os.stat(account.home)
    assert (st.st_uid, st.st_mode & 0o777) == (account.uid, 0o700)
    assert p.pw_gecos == owner_mark("alice")
    assert accounts.for_user("alice") is account  # cached
    accounts.remove("alice")
    with pytest.raises(KeyError):
        pwd.getpwnam(account.name)
    assert not account.home.exists()
    accounts.remove("alice")  # nothing left: nothing to do


@needs_root
def test_first_use_from_many_threads_makes_one_account(accounts):
    got, errors = [], []

    def use():
        try:
            got.append(accounts.for_user("bob"))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=use) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({a.uid for a in got}) == 1


@needs_root
def test_distinct_users_get_distinct_accounts(accounts):
    a, b = accounts.for_user("a.b"), accounts.for_user("a-b")
    assert a.name != b.name and a.uid != b.uid


@needs_root
def test_refuses_root_and_accounts_it_did_not_make(home_root):
    with pytest.raises(AccountError, match="uid 0"):
        Accounts(mode="existing", template="root").for_user("alice")
    with pytest.raises(AccountError, match="uid 0"):
        Accounts(mode="create", prefix="", home_root=home_root).for_user("root")
    with pytest.raises(AccountError, match="not made by gpupool"):
        Accounts(mode="create", prefix="", home_root=home_root).for_user("daemon")


@needs_root
def test_an_account_made_for_one_user_is_not_handed_to_another(accounts):
    """Even if two hub users mapped to one name, the second would be refused, not given
    the first's account."""
    account = accounts.for_user("carol")
    other = Accounts(mode="create", prefix="", home_root=accounts.home_root)
    with pytest.raises(AccountError, match="not made by gpupool for hub user"):
        other.for_user(account.name)


def test_existing_mode_maps_to_existing_accounts():
    nobody = Accounts(mode="existing", template="nobody").for_user("alice")
    assert nobody.uid == pwd.getpwnam("nobody").pw_uid
    with pytest.raises(AccountError, match="no Unix account 'no-such-user-x1'"):
        Accounts(mode="existing", template="no-such-user-{username}").for_user("x1")


def test_existing_and_personal_modes_delete_nothing():
    with pytest.raises(AccountError, match="does not delete"):
        Accounts(mode="existing").remove("nobody")


@needs_root
def test_a_home_removed_by_hand_is_made_again(home_root):
    made = Accounts(mode="create", prefix=f"h{os.getpid() % 100000}-", home_root=home_root)
    account = made.for_user("dave")
    try:
        shutil.rmtree(account.home)
        again = Accounts(mode="create", prefix=made.prefix, home_root=home_root).for_user("dave")
        assert again == account
        st = os.stat(account.home)
        assert (st.st_uid, st.st_mode & 0o777) == (account.uid, 0o700)
    finally:
        made.remove("dave")
