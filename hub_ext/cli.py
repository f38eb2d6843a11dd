"""``gpupool``: start the hub (``up``) and do what a user does through the REST API.

    gpupool up [--config gpupool_config.py]      start JupyterHub + proxy + scheduler + service
    gpupool options                              every configuration option with its help
    gpupool sample-config                        a gpupool_config.py with every option, commented out
    gpupool project list | show NAME | quota NAME [--gpus G] [--limit L | --no-limit] [--weight W]
    gpupool roles list | set USER [department-admin:DEPT | viewer:DEPT | viewer:*]...
    gpupool policy show SCOPE NAME | set SCOPE NAME KEY=VALUE... (SCOPE: department | project)
    gpupool workspace list | start [options] | stop NAME
    gpupool workspace ssh NAME [--print] | exec NAME -- CMD... | port-forward NAME LOCAL:REMOTE
    gpupool workspace logs NAME [--follow]
    gpupool training submit NAME [options] -- COMMAND... | list | describe | logs | delete | suspend | resume
    gpupool inference submit NAME [options] -- COMMAND... | list | describe | delete

API commands read the hub URL from $GPUPOOL_URL (default http://127.0.0.1:8000) and a
JupyterHub token from $GPUPOOL_TOKEN or $JUPYTERHUB_API_TOKEN (make one at /hub/token).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from traitlets import TraitError

from hub_ext.serving import cli as inference_cli

from . import humanize
from .config import ROOT, Gpupool, load_config
from .remote.commands import REMOTE, remote_action
from .remote.common import Resource, add_gpu_options, gpu_body, name_arg
from .training import cli as training_cli


def _api(args, method: str, path: str, body=None):
    url = args.url.rstrip("/") + "/services/gpupool/api/v1" + path
    token = args.token or os.environ.get("GPUPOOL_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            for warning in r.headers.get_all("Warning") or ():  # an older spelling (Deprecation)
                print(f"gpupool: warning: {warning.split(' ', 2)[-1].strip(chr(34))}", file=sys.stderr)
            text = r.read()
            return json.loads(text) if text else {}
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read())["error"]
            msg = f"{err['field']}: {err['message']}" if err.get("field") else err["message"]
        except Exception:
            msg = str(e)
        sys.exit(f"gpupool: {msg} (HTTP {e.code})")
    except urllib.error.URLError as e:
        sys.exit(f"gpupool: cannot reach {url}: {e.reason}")


def cmd_up(args) -> int:
    config = Path(args.config).resolve() if args.config else None
    if config:
        if not config.exists():
            sys.exit(f"gpupool: --config: no such file {config}")
        os.environ["GPUPOOL_CONFIG"] = str(config)
        exposed = exposed_secrets(config)
        if exposed:
            print(f"gpupool: warning: {config} sets {', '.join(exposed)} and other accounts can read it "
                  f"(mode {config.stat().st_mode & 0o777:04o}), every user's workload among them: "
                  f"chmod 600 it (the hub reads it as root)", file=sys.stderr, flush=True)
    if args.port:
        os.environ["GPUPOOL_PORT"] = str(args.port)
    try:
        cfg = load_config(str(config) if config else "")
        ssh_port = cfg.ssh_gateway_port(choose=True)  # the hub finds and keeps the same one
    except TraitError as e:
        sys.exit(f"gpupool: {config or 'configuration'}: {e}")
    print("\n".join(f"gpupool: {line}" for line in banner(cfg, ssh_port)), flush=True)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(ROOT / ".tools" / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cfg.backend == "kubernetes" and cfg.kubeconfig:
        # KubeSpawner reaches the API server through $KUBECONFIG (or the pod's service
        # account): the same kubeconfig as the rest of the hub
        env["KUBECONFIG"] = cfg.kubeconfig
    hub = Path(sys.executable).parent / "jupyterhub"
    argv = [str(hub), "-f", str(ROOT / "hub_ext" / "jupyterhub_config.py"), *args.hub_args]
    os.execve(argv[0], argv, env)
    return 0


def banner(cfg: Gpupool, ssh_port: int) -> list[str]:
    """What ``gpupool up`` prints before the hub starts: where to open it, who may log in,
    and the SSH gateway's port."""
    import pwd

    import yaml

    from .org.projects import org_users

    host = "127.0.0.1" if cfg.ip in ("", "0.0.0.0", "::") else cfg.ip
    url = f"http://{host}:{cfg.port}/"
    lines = [f"starting JupyterHub on {url}"]
    if cfg.auth == "oidc":
        lines.append(f"log in: single sign-on through {cfg.oidc_issuer or 'the OIDC provider (Gpupool.oidc_issuer)'}")
    elif cfg.backend == "embedded" and cfg.accounts == "personal":
        me = pwd.getpwuid(os.geteuid()).pw_name
        lines.append(f"log in: {me} only (personal mode: this hub is not root), with "
                     f"{_password(cfg, 'admin_password')}")
    else:
        try:
            users, admins = org_users(yaml.safe_load(Path(cfg.org_file).read_text()) or {})
        except (OSError, yaml.YAMLError, AttributeError):
            users, admins = set(), set()
        people = ", ".join(sorted(users - admins)) or "none yet"
        lines.append(f"log in as a user of the starter organisation ({people}) with "
                     f"{_password(cfg, 'user_password')}, or as an admin ({', '.join(sorted(admins)) or 'none'}) "
                     f"with {_password(cfg, 'admin_password')}")
    if ssh_port:
        ssh_host = cfg.ssh_host or ("127.0.0.1" if cfg.ssh_ip in ("", "0.0.0.0", "::") else cfg.ssh_ip)
        lines.append(f"SSH gateway on port {ssh_port}: ssh -p {ssh_port} USER@{ssh_host} "
                     f"(password: a token from {url}hub/token; docs/howto/ssh.md)")
    else:
        lines.append("SSH gateway off (Gpupool.ssh_port = 0)")
    return lines


def _password(cfg: Gpupool, option: str) -> str:
    """How the banner names a shared password: the default itself, else the option that holds it."""
    value = getattr(cfg, option)
    return f"password {value!r}" if value == Gpupool.class_traits()[option].default_value \
        else f"the password in Gpupool.{option}"


SECRET_OPTIONS = ("admin_password", "user_password", "oidc_client_secret")


def exposed_secrets(config: Path) -> list[str]:
    """The secret options ``config`` sets (outside comments) while accounts other than its
    owner may read it: in embedded mode workloads run as those accounts."""
    if not config.stat().st_mode & 0o044:
        return []
    text = config.read_text(errors="replace")
    return [name for name in SECRET_OPTIONS
            if re.search(rf"^[ \t]*c\.Gpupool\.{name}[ \t]*=", text, re.MULTILINE)]


def _options() -> list[tuple[str, object, bool, str]]:
    """(name, default, computed, default as the docs show it) of every Gpupool option. A
    computed default (from the environment or the machine) is the one its help states."""
    defaults = Gpupool()
    out = []
    for name, trait in sorted(Gpupool.class_traits(config=True).items()):
        if name in Gpupool._trait_default_generators:
            said = re.search(r"Default: (.*?)\.?$", " ".join(trait.help.split()))
            out.append((name, None, True, said.group(1) if said else "computed"))
        else:
            value = getattr(defaults, name)
            if isinstance(value, str) and value.startswith(str(ROOT) + os.sep):
                value = value[len(str(ROOT)) + 1:]  # paths inside the tree, as the tree names them
            out.append((name, value, False, repr(value)))
    return out


def option_rows() -> list[tuple[str, str, str, str]]:
    """(class, name, default, help) of every configuration option; the docs' options page
    and the sample gpupool_config.py are generated from this list too."""
    helps = Gpupool.class_traits(config=True)
    return [("Gpupool", name, shown, helps[name].help) for name, _value, _computed, shown in _options()]


def cmd_options(_args) -> int:
    for cls, name, default, help_text in option_rows():
        print(f"c.{cls}.{name} = {default}\n    {help_text}\n")
    return 0


SAMPLE_HEADER = '''"""gpupool configuration (traitlets). `gpupool up` (and `make run`) reads this file.

Every gpupool option is listed below with its help text and default, commented out. This
file is generated from the options themselves: `gpupool sample-config > gpupool_config.py`.
An option whose default is computed (from the environment or the machine) shows `...`; its
help says the default. JupyterHub options (c.JupyterHub.*, c.Spawner.*, c.Authenticator.*)
may go here too; gpupool derives the hub settings it needs from the c.Gpupool options.
"""

c = get_config()  # noqa: F821 (provided by traitlets)
'''


def sample_config() -> str:
    """A gpupool_config.py that lists every option with its help and default, commented out."""
    import pprint
    import textwrap

    helps = Gpupool.class_traits(config=True)
    out = [SAMPLE_HEADER]
    for name, value, computed, _shown in _options():
        out += ["# " + line for line in textwrap.wrap(" ".join(helps[name].help.split()), 90)]
        lead = f"c.Gpupool.{name} = "
        text = "..." if computed else pprint.pformat(value, width=90 - len(lead), sort_dicts=False)
        text = text.replace("\n", "\n" + " " * len(lead))
        out += ["# " + line for line in (lead + text).splitlines()] + [""]
    return "\n".join(out)


def cmd_sample_config(_args) -> int:
    sys.stdout.write(sample_config())
    return 0


def cmd_project(args) -> int:
    if args.action == "list":
        for p in _api(args, "GET", "/projects")["items"]:
            print(f"{p['name']:<16} {p['department']:<12} quota {p['gpus']:>5g}  in use {p['allocated_gpus']:>5g}"
                  f"  running {p['running']}  pending {p['pending']}")
    elif args.action == "quota":  # on Kubernetes this edits the Project object
        body = {k: v for k, v in (("gpus", args.gpus), ("limit", args.limit),
                                  ("over_quota_weight", args.weight)) if v is not None}
        if args.no_limit:
            body["limit"] = None
        p = _api(args, "PATCH", f"/projects/{args.name}", body)
        limit = "no limit" if p["limit"] is None else f"limit {p['limit']:g}"
        print(f"{p['name']}: quota {p['gpus']:g} GPUs, {limit}, over-quota weight {p['over_quota_weight']:g}")
    else:
        print(json.dumps(_api(args, "GET", f"/projects/{args.name}"), indent=2))
    return 0


def cmd_roles(args) -> int:
    if args.action == "list":
        out = _api(args, "GET", "/roles")
        me = out["me"]
        print(f"you: {me['name']} ({', '.join(me['roles']) or 'no role'})")
        for a in out["items"]:
            print(f"{a['user']:<20} {a['role']:<17} {a['department']:<16} ({a['source']})")
        return 0
    if not args.user:
        sys.exit("gpupool: roles set needs a USER and ROLE:DEPARTMENT rules (none: remove them all)")
    wanted = []
    for rule in args.rules:
        role, _, dept = rule.partition(":")
        if not dept:
            sys.exit(f"gpupool: {rule!r}: write ROLE:DEPARTMENT, e.g. department-admin:research or viewer:*")
        wanted.append({"role": role, "department": dept})
    out = _api(args, "PUT", f"/users/{args.user}/roles", {"roles": wanted})
    print(f"{out['user']}: " + (", ".join(f"{a['role']}:{a['department']}" for a in out["items"]) or "no role"))
    return 0


def workspace_url(args, owner: str, server: str) -> str:
    """Where the browser opens a workspace: JupyterHub's /user/OWNER/[SERVER/]."""
    path = "/".join(urllib.parse.quote(p, safe="") for p in (owner, server) if p)
    return f"{args.url.rstrip('/')}/user/{path}/"


def _print_workspace(args, w: dict) -> None:
    print(f"{w['name']}: {w['state']}")
    if w["state"] == "pending":
        print(f"  {humanize.row_waiting(w)}")
    print(f"  {workspace_url(args, w['owner'], w.get('server') or '')}")


WORKSPACES = Resource(
    path="/workloads?kind=workspace",
    row="{name:<24} {owner:<16} {project:<12} {state:<9} {gpu}",
    cells=lambda w: {**{k: w[k] for k in ("name", "owner", "project", "state")},
                     "gpu": f"{w['gpu_allocated']:g} GPU"
                            + (f"  {humanize.row_waiting(w)}" if w["state"] == "pending" else "")},
    deleted=lambda name, w: f"{name}: " + ("cancelled (it was waiting in the queue)"
                                           if (w or {}).get("state") == "pending" else "stopping"),
    look_first=True,
)
# The CLI's table of resources: list, describe and delete of each noun (hub_ext.cli_common.Resource).
RESOURCES = {"workspace": WORKSPACES, "training": training_cli.RESOURCE, "inference": inference_cli.RESOURCE}


def cmd_workspace(args) -> int:
    if args.action == "list":  # every workspace the caller may see: its own, its projects', all for admins
        return RESOURCES["workspace"].list(args, _api)
    if args.action == "stop":
        return RESOURCES["workspace"].delete(args, _api)
    if args.action == "start":
        body = workspace_body(args)
        # The request rules first, as Start would answer them: a bad value is refused even
        # where a server of that name already runs.
        answer = _api(args, "POST", "/capacity", body)["request"]
        if not answer["ok"]:  # in the words of the 400 POST /workloads would answer
            sys.exit(f"gpupool: {answer['message']} (HTTP 400)")
        # One server per name: the same start again reports the running one (and its URL)
        # rather than failing; a NAME starts another server beside it.
        me = _api(args, "GET", "/me")["name"]
        server = args.name or ""
        for w in _api(args, "GET", "/workloads?kind=workspace")["items"]:
            if w["owner"] == me and (w.get("server") or "") == server and w["state"] in ("pending", "running"):
                print(f"{w['name']} is already {w['state']} in project {w['project']} "
                      f"({w['gpu_allocated']:g} GPU); stop it first, or name another server (gpupool workspace start NAME ...)")
                _print_workspace(args, w)
                return 0
        w = _api(args, "POST", "/workloads", body)
        _print_workspace(args, {"owner": me, "server": server, **w})
    elif args.action in REMOTE:
        return remote_action(args, _api, "workspace")
    return 0


def workspace_body(args) -> dict:
    """``workspace start``'s options as a POST /workloads body; the values go as typed, for
    the request rules to check (``--fraction 0`` is refused there, as in the form)."""
    body = {"kind": "workspace", "server_name": args.name or "", "workspace_kind": args.kind}
    if args.project:
        body["project"] = args.project
    body.update(gpu_body(args))
    for key in ("template", "environment", "node_pool", "gpu_model", "cpu", "memory_gib"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.preemptible:
        body["preemptible"] = True
    return body


def policy_value(key: str, raw: str):
    """KEY=VALUE of ``policy set``: lists as 'a,b', numbers as numbers, '' unsets the key
    (the API's rules check the rest)."""
    from .org.policy import LISTS

    if raw == "":
        return None
    if key in LISTS:
        return [v.strip() for v in raw.split(",") if v.strip()]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def cmd_policy(args) -> int:
    path = f"/{args.scope}s/{args.name}/policy"
    if args.action == "show":
        print(json.dumps(_api(args, "GET", path), indent=2))
        return 0
    spec = {} if args.clear else dict(_api(args, "GET", path)["policy"])
    for pair in args.pairs:
        key, eq, raw = pair.partition("=")
        if not eq:
            sys.exit(f"gpupool: {pair!r}: write KEY=VALUE, e.g. gpu_fraction_max=0.5 or node_pools=a,b")
        value = policy_value(key, raw)
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    out = _api(args, "PUT", path, spec)
    print(f"{args.scope} {args.name}: " + (", ".join(f"{k}={v}" for k, v in out["policy"].items())
                                            or "no policy"))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get("GPUPOOL_URL", "http://127.0.0.1:8000"),
                   help="the hub's URL (default $GPUPOOL_URL)")
    p.add_argument("--token", default="", help="a JupyterHub token (default $GPUPOOL_TOKEN or $JUPYTERHUB_API_TOKEN)")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the hub in embedded mode")
    up.add_argument("--config", default="gpupool_config.py" if Path("gpupool_config.py").exists() else "",
                    help="configuration file (default gpupool_config.py where it exists)")
    up.add_argument("--port", type=int, default=0, help="public port (default Gpupool.port)")
    up.add_argument("hub_args", nargs="*", help="extra JupyterHub arguments (after --)")
    up.set_defaults(fn=cmd_up)
    sub.add_parser("options", help="print every option").set_defaults(fn=cmd_options)
    sub.add_parser("sample-config", help="print a gpupool_config.py listing every option, commented out"
                   ).set_defaults(fn=cmd_sample_config)
    pr = sub.add_parser("project", help="your projects")
    pr.add_argument("action", choices=["list", "show", "quota"],
                    help="list your projects, show one, or change one's quota (admins)")
    pr.add_argument("name", nargs="?", type=name_arg(), help="the project (show, quota)")
    pr.add_argument("--gpus", type=float, help="quota: guaranteed GPUs")
    pr.add_argument("--limit", type=float, help="quota: most GPUs even when idle ones exist")
    pr.add_argument("--no-limit", action="store_true", help="quota: remove the limit")
    pr.add_argument("--weight", type=float, help="quota: over-quota weight")
    pr.set_defaults(fn=cmd_project)
    ws = sub.add_parser("workspace", help="your workspaces")
    ws.add_argument("action", choices=["list", "start", "stop", *REMOTE], help="what to do")
    ws.add_argument("name", nargs="?", default="", type=name_arg("server"),
                    help="server name (start) or workload name (stop, ssh, exec, port-forward, logs)")
    ws.add_argument("rest", nargs="*", metavar="LOCAL:REMOTE | -- COMMAND",
                    help="port-forward: the local and the workspace's port; exec: the command after --")
    ws.add_argument("--print", action="store_true", help="ssh: print the ssh command and ~/.ssh/config block")
    ws.add_argument("--follow", "-f", action="store_true", help="logs: keep printing new output")
    ws.add_argument("--tail", type=int, default=200, help="logs: lines from the end")
    ws.add_argument("--project", help="the workspace's project (default: your first)")
    ws.add_argument("--kind", default="jupyterlab", choices=["jupyterlab", "vscode"], help="the editor")
    add_gpu_options(ws)
    ws.add_argument("--preemptible", action="store_true", help="may run over quota (reclaimable)")
    ws.add_argument("--template", help="a compute template (e.g. small); other options override it")
    ws.add_argument("--environment", help="an environment (Gpupool.environments)")
    ws.add_argument("--node-pool", dest="node_pool", help="the node pool to run in")
    ws.add_argument("--gpu-model", dest="gpu_model", help="the GPU model to run on")
    ws.add_argument("--cpu", type=float, help="CPUs")
    ws.add_argument("--memory", dest="memory_gib", type=float, help="memory in GiB")
    ws.set_defaults(fn=cmd_workspace)
    po = sub.add_parser("policy", help="department and project policies (hub_ext/org/policy.py)")
    po.add_argument("action", choices=["show", "set"], help="show a policy, or change keys of it")
    po.add_argument("scope", choices=["department", "project"])
    po.add_argument("name", type=name_arg(), help="the department or project")
    po.add_argument("pairs", nargs="*", help="KEY=VALUE, e.g. gpu_fraction_max=0.5, templates=small,medium; "
                    "KEY= unsets a key")
    po.add_argument("--clear", action="store_true", help="start from an empty policy")
    po.set_defaults(fn=cmd_policy)
    ro = sub.add_parser("roles", help="department admins and viewers (hub_ext/org/roles.py)")
    ro.add_argument("action", choices=["list", "set"], help="list assignments, or replace a user's")
    ro.add_argument("user", nargs="?", default="", type=name_arg("user", "USER"), help="the user (set)")
    ro.add_argument("rules", nargs="*", help="ROLE:DEPARTMENT, e.g. department-admin:research, viewer:*")
    ro.set_defaults(fn=cmd_roles)
    training_cli.add_parser(sub, _api)
    inference_cli.add_parser(sub, _api)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []  # exec's command: everything after "--", options of its own included
    if "--" in argv and "exec" in argv[:argv.index("--")]:
        argv, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = parser().parse_args(argv)
    if command:
        args.rest = command
    if args.cmd == "workspace" and args.action in REMOTE and not args.name:
        sys.exit(f"gpupool: workspace {args.action} needs the workload NAME (see gpupool workspace list)")
    if args.cmd == "project" and args.action in ("show", "quota") and not args.name:
        sys.exit(f"gpupool: project {args.action} needs a NAME")
    if args.cmd == "workspace" and args.action == "stop" and not args.name:
        sys.exit("gpupool: workspace stop needs the workload NAME (see gpupool workspace list)")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
