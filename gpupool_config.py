"""gpupool configuration (traitlets). `gpupool up` (and `make run`) reads this file.

Every gpupool option is listed below with its help text and default, commented out. This
file is generated from the options themselves: `gpupool sample-config > gpupool_config.py`.
An option whose default is computed (from the environment or the machine) shows `...`; its
help says the default. JupyterHub options (c.JupyterHub.*, c.Spawner.*, c.Authenticator.*)
may go here too; gpupool derives the hub settings it needs from the c.Gpupool options.
"""

c = get_config()  # noqa: F821 (provided by traitlets)

# Prefix of the OS accounts made for users (accounts = create). Default:
# $GPUPOOL_ACCOUNT_PREFIX, else 'gpupool-'.
# c.Gpupool.account_prefix = ...

# The OS account of a hub user: {prefix} is ACCOUNT_PREFIX, {username} the hub name.
# Default: '{prefix}{username}' with accounts = create, '{username}' (the account of the
# same name) with accounts = existing.
# c.Gpupool.account_template = ''

# Which OS account runs each user's workloads. create: an account per user, made on first
# use (ACCOUNT_PREFIX + name, home under HOME_ROOT, mode 0700); existing: the account
# ACCOUNT_TEMPLATE names must exist; personal: the hub's own account, and only that OS user
# may log in. Default: create when the hub runs as root, else personal.
# c.Gpupool.accounts = ...

# Rows per table page in the admin panel (workloads, events).
# c.Gpupool.admin_page_size = 200

# Shared password of the organisation's admins (at least 32 characters).
# c.Gpupool.admin_password = 'gpupool-admin-password-change-me'

# How people log in: 'shared-password' (the starter organisation's users with user_password
# / admin_password) or 'oidc' (single sign-on through an OpenID Connect provider with the
# oidc_* options; groups map to projects and roles at every login).
# c.Gpupool.auth = 'shared-password'

# Where workloads run. embedded: processes on this server, placed by the hub's own scheduler
# on its GPUs; kubernetes: pods bound by gpupool-scheduler, with the organisation kept in
# the Department/Project objects. Default: $GPUPOOL_BACKEND, else embedded (the chart sets
# kubernetes).
# c.Gpupool.backend = ...

# Size of each training's checkpoint claim (backend = kubernetes): a PersistentVolumeClaim
# that outlives the training's pods, so a preempted training resumes from its checkpoints.
# c.Gpupool.checkpoint_storage = '10Gi'

# StorageClass of the checkpoint claims (backend = kubernetes); empty: the cluster's
# default. It must allow ReadWriteMany when a training's workers span nodes.
# c.Gpupool.checkpoint_storage_class = ''

# code-server executable for the VS Code workspace kind; empty: VS Code is not offered.
# Default: code-server on PATH or .tools/bin/code-server.
# c.Gpupool.code_server = ...

# Compute-resource templates offered in the form and the CLI (--template): name -> {display,
# gpu_mode, gpu_fraction, gpu_memory_gib, gpus, cpu, memory_gib}. A template fills the
# fields a request leaves out; policies may narrow which are allowed.
# c.Gpupool.compute_templates = {'small': {'display': 'small: 0.25 GPU, 2 CPU, 8 GiB',
#                                          'gpu_mode': 'fraction',
#                                          'gpu_fraction': 0.25,
#                                          'cpu': 2,
#                                          'memory_gib': 8},
#                                'medium': {'display': 'medium: 0.5 GPU, 4 CPU, 16 GiB',
#                                           'gpu_mode': 'fraction',
#                                           'gpu_fraction': 0.5,
#                                           'cpu': 4,
#                                           'memory_gib': 16},
#                                'large': {'display': 'large: 1 GPU, 8 CPU, 32 GiB',
#                                          'gpu_mode': 'whole',
#                                          'gpus': 1,
#                                          'cpu': 8,
#                                          'memory_gib': 32}}

# Let the scheduler move a training inside another project's quota (restarted at once on
# another node, where room is free for it) to open a whole node for a waiting pod within its
# project's fair share. Off: work in its project's quota is never evicted for another
# project.
# c.Gpupool.consolidate_in_quota = True

# File holding the Fernet key that encrypts project credentials at rest; created with mode
# 0600 when missing. Back it up: credentials cannot be read without it. Default:
# STATE_DIR/credentials.key
# c.Gpupool.credentials_key_file = ...

# Seconds between idle-culler passes.
# c.Gpupool.cull_every_s = 60

# GPU utilization (percent) at or under which a GPU workspace counts as idle.
# c.Gpupool.cull_gpu_util_pct = 1.0

# Stop workspaces idle this long: on a GPU fraction, no kernel launch or allocation of its
# own (counted by the interception library); on whole GPUs, GPU use from NVML where there is
# a GPU; JupyterHub activity otherwise. 0 disables culling.
# c.Gpupool.cull_idle_s = 3600

# SQLAlchemy URL of gpupool's database (organisation, workloads, events). Default:
# sqlite:///STATE_DIR/gpupool.sqlite
# c.Gpupool.db_url = ...

# GPU inventory used when NVML finds no GPU: a list of {node, model, memory_mib, count, pool
# (node pool, default 'default')}. On a machine with GPUs NVML's list wins (set
# use_nvml=False to always use this one).
# c.Gpupool.declared_gpus = [{'node': 'local',
#                             'model': 'NVIDIA H100 80GB HBM3',
#                             'memory_mib': 81559,
#                             'count': 4}]

# Environments offered in the form and the CLI (--environment): name -> {display, image,
# prefix, start_command}. Embedded mode runs a workload with the Python environment at
# prefix (a venv or conda prefix: its bin/ first on PATH; empty: the hub's Python) and
# start_command, if given, before the workload's own; the Kubernetes spawner uses image.
# Policies may narrow which are allowed.
# c.Gpupool.environments = {'default': {'display': 'Python 3 (hub environment)',
#                                       'image': ''}}

# Folder holding the homes of accounts gpupool creates.
# c.Gpupool.home_root = '/home'

# Port of the hub's internal API. Default: $GPUPOOL_HUB_PORT or 8081.
# c.Gpupool.hub_port = ...

# Address the public proxy listens on.
# c.Gpupool.ip = '127.0.0.1'

# kubeconfig file the hub and its service reach the API server with (backend = kubernetes).
# Default: $GPUPOOL_KUBECONFIG; empty: the pod's service account.
# c.Gpupool.kubeconfig = ...

# Largest request body (bytes) the gpupool service takes, as JupyterHub's and Jupyter
# Server's max_body_size: a bigger one is refused with 413 before it is read. The default
# holds a credential of 32 values of 64 KiB.
# c.Gpupool.max_body_size = 4194304

# Most CPUs a workspace may ask for.
# c.Gpupool.max_cpu = 16.0

# Most memory (GiB) a workspace may ask for.
# c.Gpupool.max_memory_gib = 128.0

# Kubernetes namespace of the release, where workload pods and services go (backend =
# kubernetes). Default: $POD_NAMESPACE, else the pod's service-account namespace, else
# 'default'.
# c.Gpupool.namespace = ...

# If not empty, only members of these OIDC groups may log in (others see the no-access
# page), whatever the mappings say.
# c.Gpupool.oidc_allowed_groups = []

# OAuth callback URL registered with the provider. Default:
# http://IP:PORT/hub/oauth_callback from ip and port.
# c.Gpupool.oidc_callback_url = ''

# OIDC client id registered with the provider.
# c.Gpupool.oidc_client_id = ''

# OIDC client secret.
# c.Gpupool.oidc_client_secret = ''

# OIDC group -> list of projects its members belong to, e.g. {'ml-team': ['nlp']}. Synced at
# every login: for the projects named here, membership follows the groups; projects named
# nowhere here keep the members set by the org file or the REST API.
# c.Gpupool.oidc_group_projects = {}

# OIDC group -> list of roles: 'platform-admin', 'department-admin:DEPARTMENT',
# 'viewer:DEPARTMENT' or 'viewer:*' (read-only everywhere). Synced at every login. A user
# none of whose groups is mapped here or in oidc_group_projects is refused with a page that
# says so.
# c.Gpupool.oidc_group_roles = {}

# Userinfo claim that lists the user's groups (a list or a single string).
# c.Gpupool.oidc_groups_claim = 'groups'

# OIDC issuer URL (its /.well-known/openid-configuration is read at start-up), e.g.
# https://dex.example.com/dex.
# c.Gpupool.oidc_issuer = ''

# Name on the login button ('Sign in with ...').
# c.Gpupool.oidc_login_service = 'single sign-on'

# Where logout sends the browser after the hub's logout (e.g. the provider's end-session
# URL); empty: the hub's login page.
# c.Gpupool.oidc_logout_url = ''

# Scopes asked of the provider; the groups claim usually needs 'groups'.
# c.Gpupool.oidc_scopes = ['openid', 'profile', 'email', 'groups']

# Userinfo claim that becomes the gpupool/JupyterHub user name.
# c.Gpupool.oidc_username_claim = 'preferred_username'

# YAML file with the starter organisation (departments, projects with quotas, members,
# admins). Loaded into the database when it holds no department yet.
# c.Gpupool.org_file = 'hub_ext/starter_org.yaml'

# Port of the public proxy (the URL users open). Default: $GPUPOOL_PORT or 8000.
# c.Gpupool.port = ...

# The CUDA interception library put in LD_PRELOAD of GPU workloads when the file exists.
# c.Gpupool.preload_library = 'native/build/libgpupool-cuda.so'

# Port of configurable-http-proxy's API. Default: $GPUPOOL_PROXY_API_PORT or 8001.
# c.Gpupool.proxy_api_port = ...

# Seconds between allocation/utilization samples for the admin chart.
# c.Gpupool.sample_period_s = 10.0

# Seconds between scheduler cycles; a submission or release also triggers one.
# c.Gpupool.schedule_period_s = 2.0

# Port of gpupool's service (admin panel and REST API), loopback only. Default:
# $GPUPOOL_SERVICE_PORT or 10101.
# c.Gpupool.service_port = ...

# Host name users give ssh for the gateway (shown on the home page and by `gpupool workspace
# ssh`). Empty: the host name of the hub URL the user opened.
# c.Gpupool.ssh_host = ''

# Address the SSH gateway listens on. Default: ip (the public proxy's).
# c.Gpupool.ssh_ip = ...

# Seconds an SSH user or source address stays locked out.
# c.Gpupool.ssh_lockout_s = 300.0

# Failed SSH logins in a row, per user and per source address, after which that user or
# address is locked out for ssh_lockout_s.
# c.Gpupool.ssh_max_failures = 10

# Port of the SSH gateway (ssh USER[+SERVER]@HUB -p PORT into a running workload; password:
# a JupyterHub API token, or an uploaded key). None: a free port, chosen on the first start
# and kept in STATE_DIR/ssh/port while it stays free (`gpupool up` prints it); 0: no
# gateway; 1 to 65535: that port. Default: $GPUPOOL_SSH_PORT, else None.
# c.Gpupool.ssh_port = ...

# How long a workspace may wait in the queue plus start before the spawn fails.
# c.Gpupool.start_timeout_s = 3600

# Folder for the hub's and gpupool's state (SQLite files, cookie secret, logs). Default:
# $GPUPOOL_STATE_DIR or ./.gpupool
# c.Gpupool.state_dir = ...

# Node label a training's workers prefer to share (backend = kubernetes), e.g.
# topology.kubernetes.io/zone or a rack label: gpupool-scheduler places the whole gang
# within one value of it when one has room. Empty: none.
# c.Gpupool.topology_key = ''

# Discover GPUs with NVML when the library is present.
# c.Gpupool.use_nvml = True

# Shared password of the starter organisation's users (embedded mode's
# SharedPasswordAuthenticator). Change it, or configure another authenticator.
# c.Gpupool.user_password = 'gpupool-user'

# Image of trainings whose spec names none (backend = kubernetes): the project's workspace
# image holds gpupool.checkpoint and numpy.
# c.Gpupool.workload_image = 'ghcr.io/gpupool/gpupool-workspace:0.1.0'
