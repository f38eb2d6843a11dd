"""gpupool's settings, one traitlets class read from ``gpupool_config.py``.

Every option has a help text; ``gpupool options`` prints them all. The same file is a
JupyterHub config file too, so hub options (``c.JupyterHub.*``) can sit beside these.
"""

from __future__ import annotations

import os
from pathlib import Path

from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from . import ports
from .host.accounts import default_prefix
from .images import WORKLOAD_IMAGE
from .validation import MAX_BODY_BYTES

ROOT = Path(__file__).resolve().parent.parent


def _ssh_port_checked(port, field: str):
    """``port`` when it is a valid Gpupool.ssh_port, else a TraitError naming ``field``."""
    if port is None or (isinstance(port, int) and 0 <= port <= 65535):
        return port
    raise TraitError(f"{field}: must be 0 (no gateway), a port from 1 to 65535, or unset "
                     f"(None: a free port), got {port!r}")


class Gpupool(Configurable):
    """Options of gpupool's embedded mode (hub, spawner, scheduler loop, admin service)."""

    state_dir = Unicode(
        help="Folder for the hub's and gpupool's state (SQLite files, cookie secret, logs). "
        "Default: $GPUPOOL_STATE_DIR or ./.gpupool",
    ).tag(config=True)

    @default("state_dir")
    def _state_dir(self):
        return os.environ.get("GPUPOOL_STATE_DIR", str(Path.cwd() / ".gpupool"))

    db_url = Unicode(
        help="SQLAlchemy URL of gpupool's database (organisation, workloads, events). "
        "Default: sqlite:///STATE_DIR/gpupool.sqlite",
    ).tag(config=True)

    @default("db_url")
    def _db_url(self):
        return f"sqlite:///{Path(self.state_dir) / 'gpupool.sqlite'}"

    org_file = Unicode(
        str(ROOT / "hub_ext" / "starter_org.yaml"),
        help="YAML file with the starter organisation (departments, projects with quotas, "
        "members, admins). Loaded into the database when it holds no department yet.",
    ).tag(config=True)

    ip = Unicode("127.0.0.1", help="Address the public proxy listens on.").tag(config=True)
    port = Integer(help="Port of the public proxy (the URL users open). Default: $GPUPOOL_PORT or 8000.").tag(config=True)

    @default("port")
    def _port_default(self):
        return int(os.environ.get("GPUPOOL_PORT", "8000"))

    hub_port = Integer(help="Port of the hub's internal API. Default: $GPUPOOL_HUB_PORT or 8081.").tag(config=True)

    @default("hub_port")
    def _hub_port_default(self):
        return int(os.environ.get("GPUPOOL_HUB_PORT", "8081"))

    service_port = Integer(help="Port of gpupool's service (admin panel and REST API), loopback only. Default: $GPUPOOL_SERVICE_PORT or 10101.").tag(config=True)

    @default("service_port")
    def _service_port_default(self):
        return int(os.environ.get("GPUPOOL_SERVICE_PORT", "10101"))

    ssh_port = Integer(
        None, allow_none=True,
        help="Port of the SSH gateway (ssh USER[+SERVER]@HUB -p PORT into a running workload; "
        "password: a JupyterHub API token, or an uploaded key). None: a free port, chosen on the "
        "first start and kept in STATE_DIR/ssh/port while it stays free (`gpupool up` prints it); "
        "0: no gateway; 1 to 65535: that port. Default: $GPUPOOL_SSH_PORT, else None.",
    ).tag(config=True)

    @default("ssh_port")
    def _ssh_port_default(self):
        raw = os.environ.get("GPUPOOL_SSH_PORT", "").strip()
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            port = raw
        return _ssh_port_checked(port, "GPUPOOL_SSH_PORT")

    @validate("ssh_port")
    def _ssh_port_valid(self, proposal):
        return _ssh_port_checked(proposal["value"], "Gpupool.ssh_port")

    def ssh_gateway_port(self, choose: bool = False) -> int:
        """The SSH gateway's port, 0 for none: ssh_port when set, else the port kept in
        STATE_DIR/ssh/port. ``choose`` (at the hub's start): keep that port while it is free,
        else choose a free one and keep it, so that users' ssh configs and known_hosts
        entries stay valid across restarts."""
        if self.ssh_port is not None:
            return self.ssh_port
        kept = Path(self.state_dir) / "ssh" / "port"
        try:
            port = int(kept.read_text())
        except (OSError, ValueError):
            port = 0
        if port and (not choose or ports.is_free(self.ssh_ip, port)):
            return port
        (port,) = ports.free_ports(1, self.ssh_ip)
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        kept.write_text(f"{port}\n")
        return port

    ssh_ip = Unicode(help="Address the SSH gateway listens on. Default: ip (the public proxy's).").tag(config=True)

    @default("ssh_ip")
    def _ssh_ip_default(self):
        return self.ip
    ssh_host = Unicode(
        "", help="Host name users give ssh for the gateway (shown on the home page and by "
        "`gpupool workspace ssh`). Empty: the host name of the hub URL the user opened.",
    ).tag(config=True)
    ssh_max_failures = Integer(
        10, help="Failed SSH logins in a row, per user and per source address, after which "
        "that user or address is locked out for ssh_lockout_s.",
    ).tag(config=True)
    ssh_lockout_s = Float(300.0, help="Seconds an SSH user or source address stays locked out.").tag(config=True)

    proxy_api_port = Integer(help="Port of configurable-http-proxy's API. Default: $GPUPOOL_PROXY_API_PORT or 8001.").tag(config=True)

    @default("proxy_api_port")
    def _proxy_api_port_default(self):
        return int(os.environ.get("GPUPOOL_PROXY_API_PORT", "8001"))

    user_password = Unicode(
        "gpupool-user",
        help="Shared password of the starter organisation's users (embedded mode's "
        "SharedPasswordAuthenticator). Change it, or configure another authenticator.",
    ).tag(config=True)
    admin_password = Unicode(
        "gpupool-admin-password-change-me",
        help="Shared password of the organisation's admins (at least 32 characters).",
    ).tag(config=True)

    declared_gpus = List(
        Dict(),
        default_value=[
            {"node": "local", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "count": 4}
        ],
        help="GPU inventory used when NVML finds no GPU: a list of "
        "{node, model, memory_mib, count, pool (node pool, default 'default')}. On a machine with GPUs NVML's list wins "
        "(set use_nvml=False to always use this one).",
    ).tag(config=True)
    use_nvml = Bool(True, help="Discover GPUs with NVML when the library is present.").tag(
        config=True
    )

    schedule_period_s = Float(
        2.0, help="Seconds between scheduler cycles; a submission or release also triggers one."
    ).tag(config=True)
    consolidate_in_quota = Bool(
        False,
        help="Let the scheduler move work inside another project's quota (restarted at once on another node, "
        "where room is free for it) to open a whole node for a waiting pod within its project's fair share. "
        "Off: work in its project's quota is never evicted for another project.",
    ).tag(config=True)
    sample_period_s = Float(
        10.0, help="Seconds between allocation/utilization samples for the admin chart."
    ).tag(config=True)
    start_timeout_s = Integer(
        3600,
        help="How long a workspace may wait in the queue plus start before the spawn fails.",
    ).tag(config=True)

    cull_idle_s = Integer(
        3600,
        help="Stop workspaces idle this long: on a GPU fraction, no kernel launch or "
        "allocation of its own (counted by the interception library); on whole GPUs, GPU use "
        "from NVML where there is a GPU; JupyterHub activity otherwise. 0 disables culling.",
    ).tag(config=True)
    cull_gpu_util_pct = Float(
        1.0, help="GPU utilization (percent) at or under which a GPU workspace counts as idle."
    ).tag(config=True)
    cull_every_s = Integer(60, help="Seconds between idle-culler passes.").tag(config=True)

    max_cpu = Float(16.0, help="Most CPUs a workspace may ask for.").tag(config=True)
    max_memory_gib = Float(128.0, help="Most memory (GiB) a workspace may ask for.").tag(
        config=True
    )
    environments = Dict(
        default_value={"default": {"display": "Python 3 (hub environment)", "image": ""}},
        help="Environments offered in the form and the CLI (--environment): name -> {display, "
        "image, prefix, start_command}. Embedded mode runs a workload with the Python "
        "environment at prefix (a venv or conda prefix: its bin/ first on PATH; empty: the "
        "hub's Python) and start_command, if given, before the workload's own; the "
        "Kubernetes spawner uses image. Policies may narrow which are allowed.",
    ).tag(config=True)
    compute_templates = Dict(
        default_value={
            "small": {"display": "small: 0.25 GPU, 2 CPU, 8 GiB", "gpu_mode": "fraction",
                      "gpu_fraction": 0.25, "cpu": 2, "memory_gib": 8},
            "medium": {"display": "medium: 0.5 GPU, 4 CPU, 16 GiB", "gpu_mode": "fraction",
                       "gpu_fraction": 0.5, "cpu": 4, "memory_gib": 16},
            "large": {"display": "large: 1 GPU, 8 CPU, 32 GiB", "gpu_mode": "whole", "gpus": 1,
                      "cpu": 8, "memory_gib": 32},
        },
        help="Compute-resource templates offered in the form and the CLI (--template): name -> "
        "{display, gpu_mode, gpu_fraction, gpu_memory_gib, gpus, cpu, memory_gib}. A template "
        "fills the fields a request leaves out; policies may narrow which are allowed.",
    ).tag(config=True)

    preload_library = Unicode(
        str(ROOT / "native" / "build" / "libgpupool-cuda.so"),
        help="The CUDA interception library put in LD_PRELOAD of GPU workloads when the "
        "file exists.",
    ).tag(config=True)
    code_server = Unicode(
        help="code-server executable for the VS Code workspace kind; empty: VS Code is not "
        "offered. Default: code-server on PATH or .tools/bin/code-server.",
    ).tag(config=True)

    @default("code_server")
    def _code_server(self):
        import shutil

        found = shutil.which("code-server")
        local = ROOT / ".tools" / "bin" / "code-server"
        return found or (str(local) if local.exists() else "")

    backend = Enum(
        ["embedded", "kubernetes"],
        help="Where workloads run. embedded: processes on this server, placed by the hub's own "
        "scheduler on its GPUs; kubernetes: pods bound by gpupool-scheduler, with the "
        "organisation kept in the Department/Project objects. Default: $GPUPOOL_BACKEND, "
        "else embedded (the chart sets kubernetes).",
    ).tag(config=True)

    @default("backend")
    def _backend_default(self):
        return os.environ.get("GPUPOOL_BACKEND", "embedded")

    namespace = Unicode(
        help="Kubernetes namespace of the release, where workload pods and services go "
        "(backend = kubernetes). Default: $POD_NAMESPACE, else the pod's service-account "
        "namespace, else 'default'.",
    ).tag(config=True)

    @default("namespace")
    def _namespace_default(self):
        sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return os.environ.get("POD_NAMESPACE") or (sa.read_text().strip() if sa.exists() else "default")

    kubeconfig = Unicode(
        help="kubeconfig file the hub and its service reach the API server with (backend = "
        "kubernetes). Default: $GPUPOOL_KUBECONFIG; empty: the pod's service account.",
    ).tag(config=True)

    @default("kubeconfig")
    def _kubeconfig_default(self):
        return os.environ.get("GPUPOOL_KUBECONFIG", "")

    checkpoint_storage = Unicode(
        "10Gi", help="Size of each training's checkpoint claim (backend = kubernetes): a "
        "PersistentVolumeClaim that outlives the training's pods, so a preempted training "
        "resumes from its checkpoints.",
    ).tag(config=True)

    checkpoint_storage_class = Unicode(
        "", help="StorageClass of the checkpoint claims (backend = kubernetes); empty: the "
        "cluster's default. It must allow ReadWriteMany when a training's workers span nodes.",
    ).tag(config=True)
    workload_image = Unicode(
        WORKLOAD_IMAGE, help="Image of trainings whose spec names none (backend = kubernetes): "
        "the project's workspace image holds gpupool.checkpoint and numpy.",
    ).tag(config=True)

    topology_key = Unicode(
        "", help="Node label a training's workers prefer to share (backend = kubernetes), e.g. "
        "topology.kubernetes.io/zone or a rack label: gpupool-scheduler places the whole gang "
        "within one value of it when one has room. Empty: none.",
    ).tag(config=True)

    accounts = Enum(
        ["create", "existing", "personal"],
        help="Which OS account runs each user's workloads. create: an account per user, made on "
        "first use (ACCOUNT_PREFIX + name, home under HOME_ROOT, mode 0700); existing: the "
        "account ACCOUNT_TEMPLATE names must exist; personal: the hub's own account, and only "
        "that OS user may log in. Default: create when the hub runs as root, else personal.",
    ).tag(config=True)

    @default("accounts")
    def _accounts_default(self):
        return "create" if os.geteuid() == 0 else "personal"

    account_prefix = Unicode(
        help="Prefix of the OS accounts made for users (accounts = create). Default: "
        "$GPUPOOL_ACCOUNT_PREFIX, else 'gpupool-'.",
    ).tag(config=True)

    @default("account_prefix")
    def _account_prefix(self):
        return default_prefix()
    account_template = Unicode(
        "",
        help="The OS account of a hub user: {prefix} is ACCOUNT_PREFIX, {username} the hub "
        "name. Default: '{prefix}{username}' with accounts = create, '{username}' (the account "
        "of the same name) with accounts = existing.",
    ).tag(config=True)
    home_root = Unicode(
        "/home", help="Folder holding the homes of accounts gpupool creates."
    ).tag(config=True)

    credentials_key_file = Unicode(
        help="File holding the Fernet key that encrypts project credentials at rest; created "
        "with mode 0600 when missing. Back it up: credentials cannot be read without it. "
        "Default: STATE_DIR/credentials.key",
    ).tag(config=True)

    @default("credentials_key_file")
    def _credentials_key_file(self):
        return str(Path(self.state_dir) / "credentials.key")

    admin_page_size = Integer(
        200, help="Rows per table page in the admin panel (workloads, events)."
    ).tag(config=True)

    max_body_size = Integer(
        MAX_BODY_BYTES, min=1024,
        help="Largest request body (bytes) the gpupool service takes, as JupyterHub's and "
        "Jupyter Server's max_body_size: a bigger one is refused with 413 before it is read. "
        "The default holds a credential of 32 values of 64 KiB.",
    ).tag(config=True)


    # -- single sign-on (hub_ext/org/auth.py) and roles (hub_ext/org/roles.py) -------------
    auth = Enum(
        ["shared-password", "oidc"], "shared-password",
        help="How people log in: 'shared-password' (the starter organisation's users with "
        "user_password / admin_password) or 'oidc' (single sign-on through an OpenID Connect "
        "provider with the oidc_* options; groups map to projects and roles at every login).",
    ).tag(config=True)
    oidc_issuer = Unicode(
        "", help="OIDC issuer URL (its /.well-known/openid-configuration is read at start-up), "
        "e.g. https://dex.example.com/dex.",
    ).tag(config=True)
    oidc_client_id = Unicode("", help="OIDC client id registered with the provider.").tag(config=True)
    oidc_client_secret = Unicode("", help="OIDC client secret.").tag(config=True)
    oidc_scopes = List(
        Unicode(), ["openid", "profile", "email", "groups"],
        help="Scopes asked of the provider; the groups claim usually needs 'groups'.",
    ).tag(config=True)
    oidc_username_claim = Unicode(
        "preferred_username", help="Userinfo claim that becomes the gpupool/JupyterHub user name.",
    ).tag(config=True)
    oidc_groups_claim = Unicode(
        "groups", help="Userinfo claim that lists the user's groups (a list or a single string).",
    ).tag(config=True)
    oidc_group_projects = Dict(
        help="OIDC group -> list of projects its members belong to, e.g. {'ml-team': ['nlp']}. "
        "Synced at every login: for the projects named here, membership follows the groups; "
        "projects named nowhere here keep the members set by the org file or the REST API.",
    ).tag(config=True)
    oidc_group_roles = Dict(
        help="OIDC group -> list of roles: 'platform-admin', 'department-admin:DEPARTMENT', "
        "'viewer:DEPARTMENT' or 'viewer:*' (read-only everywhere). Synced at every login. A "
        "user none of whose groups is mapped here or in oidc_group_projects is refused with a "
        "page that says so.",
    ).tag(config=True)
    oidc_allowed_groups = List(
        Unicode(), help="If not empty, only members of these OIDC groups may log in (others see "
        "the no-access page), whatever the mappings say.",
    ).tag(config=True)
    oidc_login_service = Unicode(
        "single sign-on", help="Name on the login button ('Sign in with ...').",
    ).tag(config=True)
    oidc_callback_url = Unicode(
        "", help="OAuth callback URL registered with the provider. Default: "
        "http://IP:PORT/hub/oauth_callback from ip and port.",
    ).tag(config=True)
    oidc_logout_url = Unicode(
        "", help="Where logout sends the browser after the hub's logout (e.g. the provider's "
        "end-session URL); empty: the hub's login page.",
    ).tag(config=True)

def load_config(path: str | None = None) -> Gpupool:
    """The settings from a gpupool_config.py (default: $GPUPOOL_CONFIG), for processes
    other than the hub (the service, the CLI)."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    path = path or os.environ.get("GPUPOOL_CONFIG", "")
    config = Config()
    if path and os.path.exists(path):
        p = Path(path).resolve()
        config = PyFileConfigLoader(p.name, str(p.parent)).load_config()
    return Gpupool(config=config)
