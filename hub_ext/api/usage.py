"""GPU-hours through the REST API: ``GET /usage`` (JSON) and ``GET /usage.csv``, both with
``from``, ``to`` and ``by`` (hub_ext/db/accounting.py says what they mean). Admins only."""

from __future__ import annotations

from ..db import accounting
from .base import ApiHandler


class UsageHandler(ApiHandler):
    def report(self) -> dict:
        self.require_admin()
        start, end, by = accounting.parse_range(
            {k: self.get_argument(k, "") for k in ("from", "to", "by")})
        with self.Session() as s:
            return accounting.report(s, start, end, by)


class UsageJsonHandler(UsageHandler):
    def get(self):
        self.send(self.report())


class UsageCsvHandler(UsageHandler):
    def get(self):
        rep = self.report()
        name = f"gpu-hours-by-{rep['by']}-{rep['from'][:10]}-{rep['to'][:10]}.csv"
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(accounting.to_csv(rep))


def routes(api_prefix: str) -> list:
    return [
        (api_prefix + "/usage", UsageJsonHandler),
        (api_prefix + r"/usage\.csv", UsageCsvHandler),
    ]
