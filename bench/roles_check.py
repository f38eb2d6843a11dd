"""What the role rule costs a request: ``roles.who_for`` (memberships, role assignments, the
project -> department map) plus one ``roles.allowed``, against the check it replaced
(``org.projects_of`` and a membership test), on an organisation of 50 departments, 1,000
projects, 5,000 memberships and 200 role assignments in SQLite. CPU time per request
(time.process_time), both measured in this run; prints one JSON object last.

    .venv/bin/python bench/roles_check.py [--requests 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub_ext.db.tables import DepartmentRow, MemberRow, ProjectRow  # noqa: E402
from hub_ext.org import projects as org  # noqa: E402
from hub_ext.org import roles
from hub_ext.schema import make_sessionmaker  # noqa: E402


def populate(Session) -> None:
    with Session() as s:
        for d in range(50):
            s.add(DepartmentRow(name=f"d{d}", gpus=100.0))
        s.flush()
        for p in range(1000):
            s.add(ProjectRow(name=f"p{p}", department=f"d{p % 50}", gpus=0.1))
        s.flush()
        for u in range(1000):
            for k in range(5):
                s.add(MemberRow(project=f"p{(u * 7 + k * 131) % 1000}", user=f"u{u}"))
        for u in range(200):
            s.add(roles.RoleRow(user=f"u{u}", role=roles.DEPARTMENT_ADMIN if u % 2 else roles.VIEWER,
                                department=f"d{u % 50}", source="org"))
        s.commit()


def per_request(fn, n: int) -> float:
    t0 = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        Session = make_sessionmaker(f"sqlite:///{d}/bench.sqlite")
        populate(Session)

        def old(i):
            with Session() as s:
                return f"p{i % 1000}" in set(org.projects_of(s, f"u{i % 1000}"))

        def new(i):
            with Session() as s:
                who = roles.who_for(s, {"name": f"u{i % 1000}", "scopes": [roles.USE_SCOPE]})
            return bool(roles.allowed(who, "manage_project", project=f"p{i % 1000}"))

        old(0), new(0)  # warm the engine and the caches
        base = per_request(old, args.requests)
        rule = per_request(new, args.requests)
    out = {"requests": args.requests, "membership_check_cpu_ms": round(base * 1e3, 3),
           "role_rule_cpu_ms": round(rule * 1e3, 3), "ratio": round(rule / base, 2),
           "loadavg": [round(x, 2) for x in os.getloadavg()]}
    if not args.json:
        print(f"membership check {out['membership_check_cpu_ms']} ms CPU/request, role rule "
              f"{out['role_rule_cpu_ms']} ms ({out['ratio']}x), load {out['loadavg']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
