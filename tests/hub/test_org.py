"""The organisation store's rules (no hub needed)."""

import pytest

from hub_ext.org import projects as org
from hub_ext.requests.rules import FieldError
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


def test_quotas_per_node_pool_reach_the_scheduler_model(s):
    org.update_department(s, "research", {"pools": {"fast": {"gpus": 2, "limit": 3}}})
    p = org.update_project(s, "nlp", {"pools": {"fast": {"gpus": 1.5, "over_quota_weight": 2}}})
    assert p["pools"] == {"fast": {"gpus": 1.5, "over_quota_weight": 2, "limit": None,
                                   "cpu_quota": None, "memory_quota_gib": None}}
    assert p["gpus"] == 1  # the default pool's quota is untouched
    (nlp,) = org.model_projects(s)
    assert (nlp.quotas["default"].gpus, nlp.quotas["fast"].gpus, nlp.quotas["fast"].over_quota_weight) == (1, 1.5, 2)
    (research,) = org.model_departments(s)
    assert (research.quotas["fast"].gpus, research.quotas["fast"].limit) == (2, 3)
    # a pool named again is merged; null removes its quota
    assert org.update_project(s, "nlp", {"pools": {"fast": {"limit": 4}}})["pools"]["fast"]["gpus"] == 1.5
    assert org.update_project(s, "nlp", {"pools": {"fast": None}})["pools"] == {}


def test_the_department_rule_holds_per_pool(s):
    org.update_department(s, "research", {"pools": {"fast": {"gpus": 2}}})
    org.update_project(s, "nlp", {"pools": {"fast": {"gpus": 1.5}}})
    with pytest.raises(FieldError, match="from 0 to 0.5: department 'research' has a quota of 2 GPUs in node pool fast") as e:
        org.create_project(s, {"name": "cv", "department": "research", "pools": {"fast": {"gpus": 1}}})
    assert e.value.field == "pools.fast.gpus"
    with pytest.raises(FieldError, match="in node pool slow") as e:  # the department has none there
        org.update_project(s, "nlp", {"pools": {"slow": {"gpus": 0.5}}})
    assert e.value.field == "pools.slow.gpus"
    with pytest.raises(FieldError, match=">= 1.5, the sum of the department's project quotas in node pool fast") as e:
        org.update_department(s, "research", {"pools": {"fast": {"gpus": 1}}})
    assert e.value.field == "pools.fast.gpus"
    with pytest.raises(FieldError) as e:
        org.update_department(s, "research", {"pools": {"fast": None}})
    assert e.value.field == "pools.fast.gpus"


@pytest.mark.parametrize("pools, field, says", [
    ({"fast": {"gpus": -1}}, "pools.fast.gpus", "from 0 to"),
    ({"fast": {"gpus": 1, "limit": 0.5}}, "pools.fast.limit", ">= the quota"),
    ({"fast": {"colour": 1}}, "pools.fast.colour", "unknown field"),
    ({"fast": 3}, "pools.fast", "JSON object"),
    ({"Fast Pool": {"gpus": 1}}, "pools", "got 'Fast Pool'"),
    ({"default": {"gpus": 1}}, "pools.default", "top-level fields"),
    ([1], "pools", "object of node pool"),
])
def test_bad_pool_quotas_name_the_field_and_pool(s, pools, field, says):
    with pytest.raises(FieldError, match=says) as e:
        org.update_department(s, "research", {"pools": pools})
    assert e.value.field == field


def test_pool_quota_changes_are_audited(s):
    from sqlalchemy import select

    from hub_ext.db.audit import AuditRow
    org.update_department(s, "research", {"pools": {"fast": {"gpus": 2}}}, actor="admin")
    org.update_project(s, "nlp", {"pools": {"fast": {"gpus": 1}}}, actor="admin")
    rows = s.scalars(select(AuditRow).where(AuditRow.actor == "admin")).all()
    assert [(r.action, r.target, list(r.details)) for r in rows] == [
        ("department.updated", "research", ["pools"]), ("project.quota", "nlp", ["pools"])]
    assert rows[1].details["pools"][1]["fast"]["gpus"] == 1


def test_org_file_sets_quotas_per_pool(tmp_path):
    f = tmp_path / "org.yaml"
    f.write_text("departments:\n  - name: research\n    gpus: 3\n    pools: {fast: {gpus: 2}}\n"
                 "    projects:\n      - name: nlp\n        gpus: 1\n"
                 "        pools: {fast: {gpus: 1, over_quota_weight: 2}}\n")
    Session = make_sessionmaker(f"sqlite:///{tmp_path / 'db3.sqlite'}")
    with Session() as s:
        org.load_starter(s, f)
        assert org.get_project(s, "nlp")["pools"]["fast"]["over_quota_weight"] == 2
        assert org.get_department(s, "research")["pools"]["fast"]["gpus"] == 2
    f.write_text("departments:\n  - name: research\n    gpus: 3\n    pools: {fast: {gpus: 1}}\n"
                 "    projects:\n      - name: nlp\n        pools: {fast: {gpus: 2}}\n")
    with make_sessionmaker(f"sqlite:///{tmp_path / 'db4.sqlite'}")() as s:
        with pytest.raises(FieldError) as e:
            org.load_starter(s, f)
    assert e.value.field == "departments[0].projects[0].pools.fast.gpus"
