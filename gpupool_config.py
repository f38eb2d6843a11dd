"""gpupool configuration (traitlets). `gpupool up` (and `make run`) reads this file.

Every gpupool option is listed below with its help text and default, commented out.
JupyterHub options (c.JupyterHub.*, c.Spawner.*, c.Authenticator.*) may go here too;
gpupool derives the hub settings it needs from the c.Gpupool options. Print the list
again with `gpupool options`.
"""

c = get_config()  # noqa: F821 (provided by traitlets)

# Rows per table page in the admin panel (workloads, events).
# c.Gpupool.admin_page_size = 200

# Shared password of the organisation's admins (at least 32 characters).
# c.Gpupool.admin_password = 'gpupool-admin-password-change-me'

# How people log in: 'shared-password' (the starter organisation's users with user_password /
# admin_password) or 'oidc' (single sign-on through an OpenID Connect provider with the oidc_*
# options; groups map to projects and roles at every login).
# c.Gpupool.auth = 'shared-password'

# code-server executable for the VS Code workspace kind; empty: VS Code is not offered.
# Default: code-server on PATH or .tools/bin/code-server.
# c.Gpupool.code_server = '.tools/bin/code-server'  # when scripts/setup-system installed it

# Seconds between idle-culler passes.
# c.Gpupool.cull_every_s = 60

# GPU utilization (percent) at or under which a GPU workspace counts as idle.
# c.Gpupool.cull_gpu_util_pct = 1.0

# Stop workspaces idle this long (GPU use from NVML where there is a GPU, JupyterHub activity
# otherwise). 0 disables culling.
# c.Gpupool.cull_idle_s = 3600

# SQLAlchemy URL of gpupool's database (organisation, workloads, events). Default:
# sqlite:///STATE_DIR/gpupool.sqlite
# c.Gpupool.db_url = 'sqlite:///STATE_DIR/gpupool.sqlite'

# GPU inventory used when NVML finds no GPU: a list of {node, model, memory_mib, count}. On a
# machine with GPUs NVML's list wins (set use_nvml=False to always use this one).
# c.Gpupool.declared_gpus = traitlets.Undefined

# Environments offered in the form: name -> {display, image}. Embedded mode starts every
# environment from the hub's Python; the Kubernetes spawner uses image.
# c.Gpupool.environments = traitlets.Undefined

# Port of the hub's internal API. Default: $GPUPOOL_HUB_PORT or 8081.
# c.Gpupool.hub_port = 8081  # or $GPUPOOL_HUB_PORT

# Address the public proxy listens on.
# c.Gpupool.ip = '127.0.0.1'

# Most CPUs a workspace may ask for.
# c.Gpupool.max_cpu = 16.0

# Most memory (GiB) a workspace may ask for.
# c.Gpupool.max_memory_gib = 128.0

# If not empty, only members of these OIDC groups may log in (others see the no-access page),
# whatever the mappings say.
# c.Gpupool.oidc_allowed_groups = []

# OAuth callback URL registered with the provider. Default: http://IP:PORT/hub/oauth_callback
# from ip and port.
# c.Gpupool.oidc_callback_url = ''

# OIDC client id registered with the provider.
# c.Gpupool.oidc_client_id = 'gpupool'

# OIDC client secret.
# c.Gpupool.oidc_client_secret = '...'

# OIDC group -> list of projects its members belong to, e.g. {'ml-team': ['nlp']}. Synced at
# every login: for the projects named here, membership follows the groups; projects named
# nowhere here keep the members set by the org file or the REST API.
# c.Gpupool.oidc_group_projects = {'ml-team': ['nlp', 'vision']}

# OIDC group -> list of roles: 'platform-admin', 'department-admin:DEPARTMENT',
# 'viewer:DEPARTMENT' or 'viewer:*' (read-only everywhere). Synced at every login. A user none
# of whose groups is mapped here or in oidc_group_projects is refused with a page that says so.
# c.Gpupool.oidc_group_roles = {'gpu-admins': ['platform-admin'],
#                               'research-leads': ['department-admin:research'],
#                               'auditors': ['viewer:*']}

# Userinfo claim that lists the user's groups (a list or a single string).
# c.Gpupool.oidc_groups_claim = 'groups'

# OIDC issuer URL (its /.well-known/openid-configuration is read at start-up), e.g.
# https://dex.example.com/dex.
# c.Gpupool.oidc_issuer = 'https://dex.example.com/dex'

# Name on the login button ('Sign in with ...').
# c.Gpupool.oidc_login_service = 'single sign-on'

# Where logout sends the browser after the hub's logout (e.g. the provider's end-session URL);
# empty: the hub's login page.
# c.Gpupool.oidc_logout_url = ''

# Scopes asked of the provider; the groups claim usually needs 'groups'.
# c.Gpupool.oidc_scopes = ['openid', 'profile', 'email', 'groups']

# Userinfo claim that becomes the gpupool/JupyterHub user name.
# c.Gpupool.oidc_username_claim = 'preferred_username'

# YAML file with the starter organisation (departments, projects with quotas, members,
# admins). Loaded into the database when it holds no department yet.
# c.Gpupool.org_file = 'hub_ext/starter_org.yaml'

# Port of the public proxy (the URL users open). Default: $GPUPOOL_PORT or 8000.
# c.Gpupool.port = 8000  # or $GPUPOOL_PORT

# The CUDA interception library put in LD_PRELOAD of GPU workloads when the file exists.
# c.Gpupool.preload_library = 'native/build/libgpupool-cuda.so'

# Port of configurable-http-proxy's API. Default: $GPUPOOL_PROXY_API_PORT or 8001.
# c.Gpupool.proxy_api_port = 8001  # or $GPUPOOL_PROXY_API_PORT

# Seconds between allocation/utilization samples for the admin chart.
# c.Gpupool.sample_period_s = 10.0

# Seconds between scheduler cycles; a submission or release also triggers one.
# c.Gpupool.schedule_period_s = 2.0

# Port of gpupool's service (admin panel and REST API), loopback only. Default:
# $GPUPOOL_SERVICE_PORT or 10101.
# c.Gpupool.service_port = 10101  # or $GPUPOOL_SERVICE_PORT

# How long a workspace may wait in the queue plus start before the spawn fails.
# c.Gpupool.start_timeout_s = 3600

# Folder for the hub's and gpupool's state (SQLite files, cookie secret, logs). Default:
# $GPUPOOL_STATE_DIR or ./.gpupool
# c.Gpupool.state_dir = './.gpupool'  # or $GPUPOOL_STATE_DIR

# Discover GPUs with NVML when the library is present.
# c.Gpupool.use_nvml = True

# Shared password of the starter organisation's users (embedded mode's
# SharedPasswordAuthenticator). Change it, or configure another authenticator.
# c.Gpupool.user_password = 'gpupool-user'
