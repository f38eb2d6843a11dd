# JupyterHub configuration of the chart's hub (mounted from the hub ConfigMap).
# 1. gpupool's settings: gpupool_config.py, rendered from the chart's values;
# 2. hub_ext.hubconfig.configure: what `gpupool up` derives from them (roles, the gpupool
#    service, the proxy, state files, the shared-password authenticator);
# 3. what differs on Kubernetes: GpupoolKubeSpawner, the hub API reachable from workspace
#    pods, and the authenticator the values chose.
# Everything that differs between the cluster and a test run comes from the environment.
import json
import os
import urllib.request

c = get_config()  # noqa: F821
load_subconfig(os.environ.get("GPUPOOL_CONFIG", "/etc/gpupool/gpupool_config.py"))  # noqa: F821

from hub_ext.hubconfig import configure  # noqa: E402

configure(c)

c.JupyterHub.spawner_class = "hub_ext.k8s_spawner.GpupoolKubeSpawner"
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = os.environ["GPUPOOL_HUB_CONNECT_IP"]
c.JupyterHub.cleanup_servers = False  # workspace pods outlive a hub restart (as in z2jh)

if os.environ.get("GPUPOOL_AUTH", "shared-password") == "oidc":
    # OpenID Connect (oauthenticator's GenericOAuthenticator); endpoints from the issuer's
    # discovery document. Issue #10 maps the groups claim onto gpupool's roles.
    issuer = os.environ["GPUPOOL_OIDC_ISSUER"].rstrip("/")
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            disco = json.load(r)
    except Exception as e:
        raise SystemExit(f"hub.auth.oidc.issuer: cannot read {url}: {e}") from None
    c.JupyterHub.authenticator_class = "generic-oauth"
    g = c.GenericOAuthenticator
    g.client_id = os.environ["GPUPOOL_OIDC_CLIENT_ID"]
    g.client_secret = os.environ.get("GPUPOOL_OIDC_CLIENT_SECRET", "")
    g.oauth_callback_url = os.environ.get("GPUPOOL_OIDC_CALLBACK_URL", "")
    g.authorize_url = disco["authorization_endpoint"]
    g.token_url = disco["token_endpoint"]
    g.userdata_url = disco["userinfo_endpoint"]
    g.scope = json.loads(os.environ.get("GPUPOOL_OIDC_SCOPES", '["openid"]'))
    g.username_claim = os.environ.get("GPUPOOL_OIDC_USERNAME_CLAIM", "preferred_username")
    g.claim_groups_key = os.environ.get("GPUPOOL_OIDC_GROUPS_CLAIM", "groups")
    g.admin_groups = set(json.loads(os.environ.get("GPUPOOL_OIDC_ADMIN_GROUPS", "[]")))
    g.allowed_groups = set(json.loads(os.environ.get("GPUPOOL_OIDC_ALLOWED_GROUPS", "[]")))
    g.manage_groups = True
