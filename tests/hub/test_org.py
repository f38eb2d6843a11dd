"""The organisation store's rules (no hub needed)."""

import pytest

from hub_ext import org
from hub_ext.requests import FieldError
from hub_ext.schema import make_sessionmaker


@pytest.fixture
def s(tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with Session() as s:
        org.create_department(s, {"name": "research", "gpus": 3})
        org.create_project(s, {"name": "nlp", "department": "research", "gpus": 1, "members": ["alice"]})
        s.commit()
        yield s


def test_department_quota_bounds_projects(s):
    with pytest.raises(FieldError, match="from 0 to 2") as e:
        org.create_project(s, {"name": "big", "department": "research", "gpus": 2.5})
    assert e.value.field == "gpus"
    with pytest.raises(FieldError, match="sum of the department"):
        org.update_department(s, "research", {"gpus": 0.5})


def test_shrinking_a_project_quota_is_allowed(s):
    assert org.update_project(s, "nlp", {"gpus": 0})["gpus"] == 0


def test_conflicts_and_not_found(s):
    with pytest.raises(org.Conflict):
        org.create_department(s, {"name": "research"})
    with pytest.raises(org.Conflict):
        org.delete_department(s, "research")
    with pytest.raises(org.NotFound):
        org.get_project(s, "nope")


@pytest.mark.parametrize("data, field", [
    ({"name": "x", "gpus": -1}, "gpus"),
    ({"name": "x", "gpus": "lots"}, "gpus"),
    ({"name": "x", "gpus": 1, "limit": 0.5}, "limit"),
    ({"name": "X Y"}, "name"),
    ({"name": "x", "colour": 1}, "colour"),
])
def test_bad_department_input(s, data, field):
    with pytest.raises(FieldError) as e:
        org.create_department(s, data)
    assert e.value.field == field


def test_members_and_starter_file(tmp_path):
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db2.sqlite'}")
    from hub_ext.config import ROOT

    with Session() as s:
        data = org.load_starter(s, ROOT / "hub_ext" / "starter_org.yaml")
        users, admins = org.org_users(data)
        assert "admin" in admins and {"alice", "bob"} <= users
        assert org.projects_of(s, "alice") == ["nlp", "vision"]
        assert org.get_department(s, "research")["projects"] == ["nlp", "vision"]
