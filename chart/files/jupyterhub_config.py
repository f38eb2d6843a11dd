# JupyterHub configuration of the chart's hub (mounted from the hub ConfigMap).
# 1. gpupool's settings: gpupool_config.py, rendered from the chart's values;
# 2. hub_ext.hubconfig.configure: what `gpupool up` derives from them (roles, the gpupool
#    service, the proxy, state files, the shared-password authenticator);
#    and the spawner of the mode (GpupoolKubeSpawner: hub_ext/backends/kubernetes.py);
# 3. what differs on Kubernetes: the hub API reachable from workspace pods, and the
#    authenticator the values chose.
# Everything that differs between the cluster and a test run comes from the environment.
import os

c = get_config()  # noqa: F821
load_subconfig(os.environ.get("GPUPOOL_CONFIG", "/etc/gpupool/gpupool_config.py"))  # noqa: F821

from hub_ext.hubconfig import configure  # noqa: E402

configure(c)

c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = os.environ["GPUPOOL_HUB_CONNECT_IP"]
c.JupyterHub.cleanup_servers = False  # workspace pods outlive a hub restart (as in z2jh)

# Single sign-on (hub.auth.type oidc) is set up by configure(c) above from the c.Gpupool.oidc_*
# options that gpupool_config.py renders from hub.auth.oidc (hub_ext/org/auth.py: the groups claim
# mapped to projects and roles at every login).
