"""Single sign-on: OIDC login through oauthenticator's GenericOAuthenticator, with the
user's groups claim mapped to gpupool project membership and roles at every login.

``c.Gpupool.auth = 'oidc'`` selects it (``hubconfig.configure`` calls ``configure_oidc``).
At each login ``GpupoolOIDCAuthenticator.update_auth_model``:

1. reads the groups claim (``c.Gpupool.oidc_groups_claim``) from the provider's userinfo;
2. maps them (``oidc_group_projects``, ``oidc_group_roles``) to projects and roles;
3. no mapped group: the login is refused with a page that says so (403 with a message);
4. otherwise writes the memberships of the projects the mapping names (a project that no
   mapping names keeps its members as they are), the user's ``oidc`` role assignments
   (hub_ext.org.roles), and JupyterHub's ``admin`` flag and roles (``manage_roles``), so a user
   whose groups changed gets the new membership at their next login.
"""

from __future__ import annotations

import html
import json
import time
import urllib.request

from oauthenticator.generic import GenericOAuthenticator
from sqlalchemy import delete, select
from tornado import web

from gpupool.errors import GpupoolError

from ..config import Gpupool
from ..db import audit
from ..db.events import add_event
from ..db.tables import DepartmentRow, MemberRow, ProjectRow, bump_version
from . import roles

DISCOVERY = "/.well-known/openid-configuration"


class MappingError(GpupoolError, ValueError):
    """A mapping rule that names an unknown role; says which option and what is allowed."""


def parse_role(rule: str) -> tuple[str, str]:
    """'platform-admin' | 'department-admin:DEPT' | 'viewer:DEPT' | 'viewer:*' -> (role, dept)."""
    role, _, dept = str(rule).partition(":")
    if role == roles.PLATFORM_ADMIN and not dept:
        return role, ""
    if role in roles.ASSIGNABLE and dept and (dept != roles.ALL_DEPARTMENTS or role == roles.VIEWER):
        return role, dept
    raise MappingError(
        f"c.Gpupool.oidc_group_roles: {rule!r} is not a role; use 'platform-admin', "
        f"'department-admin:DEPARTMENT', 'viewer:DEPARTMENT' or 'viewer:*'")


def check_mapping(cfg: Gpupool) -> None:
    """Fail at start-up, naming the option, on a malformed mapping."""
    for group, projects in cfg.oidc_group_projects.items():
        if not isinstance(projects, (list, tuple)) or not all(isinstance(p, str) for p in projects):
            raise MappingError(f"c.Gpupool.oidc_group_projects[{group!r}]: must be a list of project "
                               f"names, got {projects!r}")
    for group, rules in cfg.oidc_group_roles.items():
        if not isinstance(rules, (list, tuple)):
            raise MappingError(f"c.Gpupool.oidc_group_roles[{group!r}]: must be a list of roles, got {rules!r}")
        for r in rules:
            parse_role(r)


def map_groups(cfg: Gpupool, groups: set[str]) -> tuple[set[str], set[tuple[str, str]], bool]:
    """(projects, {(role, department)}, platform admin) for a user in ``groups``."""
    projects = {p for g in groups for p in cfg.oidc_group_projects.get(g, [])}
    assigned = {parse_role(r) for g in groups for r in cfg.oidc_group_roles.get(g, [])}
    admin = (roles.PLATFORM_ADMIN, "") in assigned
    return projects, assigned - {(roles.PLATFORM_ADMIN, "")}, admin


def sync_user(s, cfg: Gpupool, user: str, projects: set[str], assigned: set[tuple[str, str]]) -> None:
    """Memberships of the projects the mapping names, and the user's ``oidc`` roles."""
    managed = {p for ps in cfg.oidc_group_projects.values() for p in ps}
    existing = set(s.scalars(select(ProjectRow.name)))
    have = set(s.scalars(select(MemberRow.project).where(MemberRow.user == user)))
    want = (projects & existing) | (have - managed)
    if want != have:
        s.execute(delete(MemberRow).where(MemberRow.user == user, MemberRow.project.in_(have - want)))
        s.add_all(MemberRow(project=p, user=user) for p in sorted(want - have))
        add_event(s, "org", f"{user} projects from single sign-on: {', '.join(sorted(want)) or 'none'}")
        for p in sorted(want ^ have):  # the audit log: one entry per project that changed
            change = {"added": [user], "removed": []} if p in want else {"added": [], "removed": [user]}
            audit.record(s, user, "project.members", p, {**change, "via": "oidc"}, p)
        bump_version(s)
    known = {d for _, d in assigned if d == roles.ALL_DEPARTMENTS or s.get(DepartmentRow, d)}
    roles.set_assignments(s, user, [(r, d) for r, d in assigned if d in known], "oidc")


def discover(issuer: str, timeout_s: float = 30.0) -> dict:
    """The provider's discovery document; retried while the provider starts."""
    url = issuer.rstrip("/") + DISCOVERY
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except Exception as e:  # noqa: BLE001 - any failure: retry, then report the last
            last = e
            time.sleep(0.5)
    raise RuntimeError(f"c.Gpupool.oidc_issuer: cannot read {url}: {last}")


class GpupoolOIDCAuthenticator(GenericOAuthenticator):
    """GenericOAuthenticator that maps the groups claim to gpupool projects and roles."""

    gpupool: Gpupool | None = None  # set by configure_oidc
    Session = None

    async def update_auth_model(self, auth_model):
        cfg = self.gpupool
        info = (auth_model.get("auth_state") or {}).get(self.user_auth_state_key) or {}
        raw = info.get(cfg.oidc_groups_claim) or []
        groups = {raw} if isinstance(raw, str) else set(raw)
        projects, assigned, admin = map_groups(cfg, groups)
        name = auth_model["name"]
        outside = cfg.oidc_allowed_groups and not groups & set(cfg.oidc_allowed_groups)
        if outside or not (projects or assigned or admin):
            raise no_access(name, groups, cfg.oidc_groups_claim)
        with self.Session() as s:
            sync_user(s, cfg, name, projects, assigned)
            s.commit()
            who = roles.who_for(s, {"name": name, "scopes": [roles.ADMIN_SCOPE] if admin else []})
        self.log.info("gpupool: %s groups %s -> projects %s, roles %s", name, sorted(groups),
                      sorted(who.projects), who.roles)
        auth_model["admin"] = admin
        auth_model["roles"] = roles.hub_roles_for(who)
        return auth_model


def no_access(name: str, groups: set[str], claim: str) -> web.HTTPError:
    shown = ", ".join(sorted(groups)) or "none"
    text = (f"{name} signed in, but none of their groups ({shown}) gives access to gpupool: no "
            f"group in the '{claim}' claim is mapped to a project or a role. Ask a platform admin "
            "to map one of your groups (c.Gpupool.oidc_group_projects / oidc_group_roles).")
    e = web.HTTPError(403, text, reason="No access to gpupool")  # the page's heading
    e.jupyterhub_message = text
    e.jupyterhub_html_message = (
        f'<div id="gpupool-no-access">'
        f"<p>You signed in as <b>{html.escape(name)}</b>, but none of your groups "
        f"(<code>{html.escape(shown)}</code>, from the <code>{html.escape(claim)}</code> claim) "
        "is mapped to a gpupool project or role.</p>"
        "<p>Ask a platform admin to map one of your groups to a project "
        "(<code>c.Gpupool.oidc_group_projects</code>) or a role "
        "(<code>c.Gpupool.oidc_group_roles</code>), then sign in again.</p></div>")
    return e


def configure_oidc(c, cfg: Gpupool, Session) -> None:
    """JupyterHub settings for OIDC login from the c.Gpupool.oidc_* options."""
    for opt in ("oidc_issuer", "oidc_client_id", "oidc_client_secret"):
        if not getattr(cfg, opt):
            raise ValueError(f"c.Gpupool.{opt} must be set when c.Gpupool.auth = 'oidc'")
    check_mapping(cfg)
    meta = discover(cfg.oidc_issuer)
    GpupoolOIDCAuthenticator.gpupool = cfg
    GpupoolOIDCAuthenticator.Session = Session
    c.JupyterHub.authenticator_class = GpupoolOIDCAuthenticator
    a = c.GpupoolOIDCAuthenticator
    a.client_id = cfg.oidc_client_id
    a.client_secret = cfg.oidc_client_secret
    host = cfg.ip if cfg.ip not in ("", "0.0.0.0") else "127.0.0.1"
    a.oauth_callback_url = cfg.oidc_callback_url or f"http://{host}:{cfg.port}/hub/oauth_callback"
    a.authorize_url = meta["authorization_endpoint"]
    a.token_url = meta["token_endpoint"]
    a.userdata_url = meta["userinfo_endpoint"]
    a.scope = list(cfg.oidc_scopes)
    a.username_claim = cfg.oidc_username_claim
    a.login_service = cfg.oidc_login_service
    a.allow_all = True  # who gets in is the group mapping's decision (update_auth_model)
    a.manage_groups = True  # the hub's groups mirror the provider's
    a.auth_state_groups_key = f"oauth_user.{cfg.oidc_groups_claim}"
    a.manage_roles = True  # gpupool-admin / -department-admin / -viewer set at each login
    if cfg.oidc_logout_url:
        a.logout_redirect_url = cfg.oidc_logout_url
