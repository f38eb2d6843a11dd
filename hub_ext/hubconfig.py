"""Turn gpupool's settings into JupyterHub's: spawner, authenticator, roles and custom
scopes, the gpupool service (admin panel + REST API), ports and state files."""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
from pathlib import Path

from sqlalchemy import select

from .backends.embedded import personal_notice
from .config import ROOT, Gpupool
from .db.tables import MemberRow
from .org import roles
from .org.projects import org_users
from .runtime import Runtime
from .workspaces.home import home_context

SCOPES = roles.SCOPES  # custom:gpupool:admin, :department-admin, :use, :view


def configure(c) -> Runtime:
    cfg = Gpupool(config=c)
    state = Path(cfg.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    cfg.ssh_port = cfg.ssh_gateway_port(choose=True)  # a concrete port (0: none) for every reader
    rt = Runtime.instance(cfg)
    try:
        asyncio.get_running_loop().call_soon(rt.start)
    except RuntimeError:  # config loaded outside the hub (e.g. a check): no loop yet
        pass

    users, admins = org_users(rt.org_file)
    with rt.Session() as s:
        users |= set(s.scalars(select(MemberRow.user)))
        assigned = roles.assignments(s)
    users |= {a["user"] for a in assigned}

    c.JupyterHub.ip = cfg.ip
    c.JupyterHub.port = cfg.port
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = cfg.hub_port
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{cfg.proxy_api_port}"
    c.ConfigurableHTTPProxy.command = [_chp()]
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
    c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = 5
    c.JupyterHub.default_url = "/hub/home"
    # Workloads outlive the hub (hub_ext.host): a restart finds the servers again.
    c.JupyterHub.cleanup_servers = False
    # gpupool's versions of JupyterHub pages (the home page with the user's workloads and
    # quotas, the spawn progress page with its steps and Cancel)
    c.JupyterHub.template_paths = [str(Path(__file__).parent / "templates" / "hub")]
    # a function, called only by the home page (every page gets the template variables)
    c.JupyterHub.template_vars = {"gpupool_home": lambda user: lambda: home_context(rt, user)}

    sso = cfg.auth == "oidc"
    if sso:  # single sign-on: who gets in and their roles come from the groups claim
        from .org.auth import configure_oidc

        configure_oidc(c, cfg, rt.Session)
    else:
        c.JupyterHub.authenticator_class = "shared-password"
        c.SharedPasswordAuthenticator.user_password = cfg.user_password
        c.SharedPasswordAuthenticator.admin_password = cfg.admin_password
        c.Authenticator.admin_users = admins
        c.Authenticator.allowed_users = users - admins
    if rt.backend.single_account:
        # Every workload would run as the hub's own account: only its owner may log in.
        me = pwd.getpwuid(os.geteuid()).pw_name
        admins = {me}
        c.Authenticator.admin_users = admins
        c.Authenticator.allowed_users = admins
        c.JupyterHub.template_vars["announcement_login"] = f"Personal mode: {personal_notice()}."

    # the home page's "Connect from your machine" block (templates/hub/connect.html)
    c.JupyterHub.template_vars = {**c.JupyterHub.get("template_vars", {}),
                                  "gpupool_ssh": {"port": cfg.ssh_port, "host": cfg.ssh_host}}

    c.JupyterHub.spawner_class = rt.backend.spawner_class
    c.Spawner.start_timeout = cfg.start_timeout_s
    c.Spawner.http_timeout = 180
    c.Spawner.default_url = "/lab"

    c.JupyterHub.custom_scopes = SCOPES
    c.JupyterHub.load_roles = [
        roles.USER_ROLE,
        # with single sign-on the authenticator assigns these at each login (manage_roles)
        {**roles.HUB_ROLES[roles.PLATFORM_ADMIN], **({} if sso else {"users": sorted(admins)})},
        *({**roles.HUB_ROLES[kind],
           **({} if sso else {"users": sorted({a["user"] for a in assigned if a["role"] == kind})})}
          for kind in roles.ASSIGNABLE),
        {"name": "gpupool-service", "scopes": ["admin:servers", "read:users", "list:users"],
         "services": ["gpupool"]},
    ]
    # KUBERNETES_SERVICE_* or KUBECONFIG: the service reaches the API server as the hub does
    # (the pod's service account, or the hub's kubeconfig; hub_ext.cluster.org.kubeconfig_path)
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("GPUPOOL_", "KUBERNETES_SERVICE_")) or k == "KUBECONFIG"}
    env["GPUPOOL_STATE_DIR"] = cfg.state_dir
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    c.JupyterHub.services = [
        {
            "name": "gpupool",
            "display": True,
            "url": f"http://127.0.0.1:{cfg.service_port}",
            "command": [sys.executable, "-m", "hub_ext.service"],
            "environment": env,
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": sorted(roles.USER_SCOPES),
        }
    ]
    from .serving import hub as inference_hub  # scale-to-zero inference services

    inference_hub.configure(c, cfg, rt)
    return rt


def _chp() -> str:
    import shutil

    local = ROOT / ".tools" / "bin" / "configurable-http-proxy"
    return str(local) if local.exists() else (shutil.which("configurable-http-proxy") or str(local))
