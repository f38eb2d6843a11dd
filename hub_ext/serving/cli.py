"""``gpupool inference ...``: inference services through the REST API (modelled on
``runai inference``).

    gpupool inference submit NAME --project P [--fraction 0.25 | --gpus 1] [--min-replicas 0]
        [--max-replicas 4] [--metric concurrency|throughput] [--target 10]
        [--scale-to-zero-after 300] [--port 8000] [--ready-path /] [--public]
        [-e NAME=VALUE ...] -- COMMAND...
    gpupool inference list [--project P]
    gpupool inference describe NAME [--json]
    gpupool inference delete NAME
    gpupool inference exec|logs NAME --replica NAME-HEX [-- COMMAND...]  (exec: through the SSH gateway)
    gpupool inference port-forward NAME --replica NAME-HEX LOCAL:REMOTE  (through the SSH gateway)

Embedded replicas listen where COMMAND says: ``{socket}`` is replaced with a unix socket
that only the owner's account and the activator reach (also ``$GPUPOOL_SOCKET``); without
it they get ``$PORT`` on 127.0.0.1 (``{port}`` is replaced too), which every local account
can reach. The service answers at ``$GPUPOOL_URL/services/gpupool-serve/NAME/`` with a JupyterHub token.
"""

from __future__ import annotations

import argparse
import sys

from hub_ext.remote.commands import remote_action
from hub_ext.remote.common import ApiCall, Resource, add_gpu_options, name_arg, submit_body

OPTIONS = (("project", "project"), ("min_replicas", "min_replicas"),
           ("max_replicas", "max_replicas"), ("metric", "metric"), ("target", "target"),
           ("scale_to_zero_after", "scale_to_zero_after_s"), ("port", "port"),
           ("ready_path", "ready_path"), ("image", "image"))


def _submit(args, api: ApiCall, parser: argparse.ArgumentParser) -> int:
    # argparse's REMAINDER after NAME takes the options too: split at "--" and parse again
    rest = list(args.command)
    cut = rest.index("--") if "--" in rest else len(rest)
    command = rest[cut + 1:]
    parser.parse_args([*rest[:cut], args.name], namespace=args)
    if not command:
        sys.exit("gpupool: inference submit needs the model server's command after -- "
                 "(for example: -- python serve.py --socket {socket})")
    options = [(key, getattr(args, attr)) for attr, key in OPTIONS] + [("public", args.public or None)]
    s = api(args, "POST", "/inferences", submit_body(args, command, options))
    print(f"{s['name']}: created in project {s['project']}; URL {args.url.rstrip('/')}{s['url']}")
    return 0


def _show(s: dict) -> None:
    sp, st = s["spec"], s["status"]
    print(f"Name:      {s['name']}\nProject:   {s['project']}\nOwner:     {s['owner']}")
    print(f"URL:       {s['url']}{'  (public)' if sp.get('public') else ''}")
    print(f"GPU:       {sp['gpu']:g} per replica; replicas {sp['min_replicas']}..{sp['max_replicas']}")
    print(f"Autoscale: {sp['metric']} target {sp['target']:g} per replica, stable window "
          f"{sp['stable_window_s']:g} s, to zero after {sp['scale_to_zero_after_s']:g} s idle")
    print(f"Now:       {s['ready']} ready of {s['replicas']}, desired {s['desired']}"
          + (f" ({st['why']})" if st.get("why") else "")
          + (f", {st['held']} requests held" if st.get("held") else ""))
    print(f"Command:   {' '.join(sp['command'])}")
    reps = st.get("replica_list", [])
    if reps:
        print("\nReplicas:")
        for r in reps:
            print(f"  {r['name']:<24} {r['state']:<9} {r['placement'] or '-':<28} {r['reason']}")
    if st.get("recent"):
        print("\nRecently stopped:")
        for r in st["recent"]:
            print(f"  {r['name']:<24} {r['state']:<9} {r['reason']}")


RESOURCE = Resource(
    path="/inferences",
    row="{name:<24} {project:<12} {ready:>5} {desired:>7}  {gpu:>5}  {url}",
    cells=lambda s: {**{k: str(s[k]) for k in ("name", "project", "ready", "desired", "url")},
                     "gpu": f"{s['spec']['gpu']:g}"},
    deleted=lambda name, _: f"{name}: deleted (replicas drain and stop)",
    show=_show,
    filters=("project",),
)


def _replica(args) -> str:
    if not args.replica.startswith(f"{args.name}-"):
        sys.exit(f"gpupool: --replica {args.replica!r} is not a replica of {args.name!r} (see describe)")
    return args.replica


def add_parser(sub, api: ApiCall) -> None:
    """Register ``inference`` on the CLI's subparsers; ``api(args, method, path, body)``
    calls the REST API."""
    inf = sub.add_parser("inference", help="scale-to-zero inference services", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = inf.add_subparsers(dest="action", required=True)
    s = acts.add_parser("submit", help="create an inference service")
    s.add_argument("name", type=name_arg(), help="the service's name (its URL)")
    s.add_argument("--project", "-p", help="the service's project (required)")
    add_gpu_options(s, " per replica", memory=False, none=False, old=True)
    s.add_argument("--min-replicas", type=int, help="replicas kept while idle (0: scale to zero)")
    s.add_argument("--max-replicas", type=int, help="the most replicas under load")
    s.add_argument("--metric", choices=["concurrency", "throughput"], help="what the autoscaler keeps at --target")
    s.add_argument("--target", type=float, help="per replica: requests in flight, or per second")
    s.add_argument("--scale-to-zero-after", type=float, help="seconds without requests")
    s.add_argument("--port", type=int, help="the server's port in a pod (Kubernetes)")
    s.add_argument("--ready-path", help="readiness probe path (default /)")
    s.add_argument("--image", help="container image (Kubernetes)")
    s.add_argument("--public", action="store_true", help="no token needed to call it")
    s.add_argument("-e", "--env", action="append", help="NAME=VALUE for the server")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    s.set_defaults(fn=lambda a: _submit(a, api, s))
    RESOURCE.add_actions(acts, api, "service", {
        "list": "your services", "describe": "one service, its replicas and why they wait",
        "delete": "delete a service"}, {"project": "only this project's services"})
    ex = acts.add_parser("exec", help="run a command in a running replica (through the SSH gateway)")
    ex.add_argument("name", type=name_arg(), help="the service")
    ex.add_argument("--replica", required=True, type=name_arg(), help="the replica (see describe)")
    ex.usage = f"gpupool {ex.prog.split()[1]} exec NAME [options] -- COMMAND..."
    ex.set_defaults(fn=lambda a: remote_action(a, api, "inference", _replica(a)))
    pf = acts.add_parser("port-forward", help="a local port to a port of a running replica (through the SSH gateway)")
    pf.add_argument("name", type=name_arg(), help="the service")
    pf.add_argument("--replica", required=True, type=name_arg(), help="the replica (see describe)")
    pf.add_argument("rest", nargs=1, metavar="LOCAL:REMOTE", help="the local and the replica's port (LOCAL 0: any free port)")
    pf.set_defaults(fn=lambda a: remote_action(a, api, "inference", _replica(a)))
    lg = acts.add_parser("logs", help="a replica's output")
    lg.add_argument("name", type=name_arg(), help="the service")
    lg.add_argument("--replica", required=True, type=name_arg(), help="the replica (see describe)")
    lg.add_argument("--tail", type=int, default=200, help="lines from the end")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new output")
    lg.set_defaults(fn=lambda a: remote_action(a, api, "inference", _replica(a)))
