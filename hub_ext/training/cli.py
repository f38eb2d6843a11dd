"""``gpupool training ...``: training jobs through the REST API (modelled on
``runai training``).

    gpupool training submit NAME --project P [--fraction 0.5 | --gpus 4 | --gpu-memory 20GiB | --no-gpu]
        [--workers N]
        [--preemptible | --non-preemptible] [--node-pool POOL] [--checkpoint-dir DIR]
        [--image IMAGE] [--grace-period S] [--restart-policy OnFailure|Never]
        [--backoff-limit N] [-e NAME=VALUE ...] -- COMMAND...
    gpupool training list [--project P] [--status S]
    gpupool training describe NAME
    gpupool training logs NAME [--rank R] [--tail N] [--follow]
    gpupool training exec NAME [--rank R] -- COMMAND...   (through the SSH gateway)
    gpupool training port-forward NAME [--rank R] LOCAL:REMOTE   (through the SSH gateway)
    gpupool training delete|suspend|resume NAME
"""

from __future__ import annotations

import argparse
import sys
import time

from hub_ext.remote.commands import remote_action
from hub_ext.remote.common import ApiCall, Resource, add_gpu_options, name_arg, submit_body


def _age(ts: float) -> str:
    s = max(0, int(time.time() - ts))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _submit(args, api: ApiCall) -> int:
    command = list(args.command)
    if not command:
        sys.exit("gpupool: training submit needs a command after -- (for example: -- python train.py)")
    options = (("project", args.project), ("workers", args.workers), ("preemptible", args.preemptible),
               ("node_pool", args.node_pool), ("checkpoint_dir", args.checkpoint_dir),
               ("image", args.image), ("grace_period_s", args.grace_period),
               ("restart_policy", args.restart_policy), ("backoff_limit", args.backoff_limit))
    t = api(args, "POST", "/trainings", submit_body(args, command, options))
    print(f"{t['name']}: {t['status']} in project {t['project']} ({t['gpu']})")
    return 0


def _show(t: dict) -> None:
    spec = t["spec"]
    print(f"Name:        {t['name']}\nProject:     {t['project']}\nOwner:       {t['owner']}")
    print(f"Status:      {t['status']}" + (f" ({t['reason']})" if t["reason"] else ""))
    print(f"GPU:         {t['gpu']}{' over quota' if t['over_quota'] else ''}")
    print(f"Preemptible: {spec.get('preemptible')}   grace period {spec.get('grace_period_s'):g} s")
    print(f"Restarts:    {t['failures']} of {spec.get('backoff_limit')} ({spec.get('restart_policy')})"
          f"   preemptions {t['preemptions']}   attempts {t['attempt']}")
    print(f"Command:     {' '.join(spec.get('command', []))}")
    if t["placement"]:
        print("Placement:   " + "; ".join(f"{p['node']} GPU {','.join(map(str, p['gpu_indices']))}"
                                          for p in t["placement"]))
    print("\nTransitions:")
    for tr in t["transitions"]:
        print(f"  {time.strftime('%H:%M:%S', time.localtime(tr['ts']))}  {tr['status']:<10} {tr['reason']}")
    print("\nEvents:")
    for e in t.get("events", []):
        print(f"  {time.strftime('%H:%M:%S', time.localtime(e['ts']))}  {e['kind']:<10} {e['message']}")


RESOURCE = Resource(
    path="/trainings",
    row="{name:<24} {project:<12} {status:<10} {gpu:<22} {age:>5}  {reason}",
    cells=lambda t: {**{k: t[k] for k in ("name", "project", "status", "gpu", "reason")},
                     "age": _age(t["created"])},
    deleted=lambda name, _: f"{name}: deleting",
    show=_show,
    filters=("project", "status"),
)


def _logs(args, api: ApiCall) -> int:
    seen: list[str] = []
    while True:
        lines = api(args, "GET", f"/trainings/{args.name}/logs?rank={args.rank}&tail={args.tail}")["lines"]
        # print what is new since the last poll (the tail window overlaps the previous one)
        start = 0
        for k in range(min(len(seen), len(lines)), 0, -1):
            if seen[-k:] == lines[:k]:
                start = k
                break
        for line in lines[start:]:
            print(line)
        seen = lines
        if not args.follow:
            return 0
        time.sleep(1.0)


def _control(args, api: ApiCall) -> int:
    t = api(args, "POST", f"/trainings/{args.name}/{args.action}")
    print(f"{args.name}: {args.action} requested (was {t['status']})")
    return 0


class _DashDashParser(argparse.ArgumentParser):
    """Everything after the first ``--`` is the job's command (``args.command``); argparse
    alone would bind a trailing list positional too early when options sit between."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        tail: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, tail = args[:i], args[i + 1:]
        ns, extra = super().parse_known_args(args, namespace)
        ns.command = tail
        return ns, extra


def add_parser(sub, api: ApiCall) -> None:
    """Register ``training`` on the CLI's subparsers; ``api(args, method, path, body)``
    calls the REST API."""
    tr = sub.add_parser("training", help="training jobs", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = tr.add_subparsers(dest="action", required=True, parser_class=_DashDashParser)
    s = acts.add_parser("submit", help="submit a training job")
    s.add_argument("name", type=name_arg(), help="the job's name")
    s.add_argument("--project", "-p", help="the job's project (default: your first)")
    add_gpu_options(s, " per worker", old=True)
    s.add_argument("--workers", type=int, help="gang size (all placed or none), default 1")
    s.add_argument("--preemptible", dest="preemptible", action="store_true", default=None,
                   help="may run over quota and be preempted (the default for training)")
    s.add_argument("--non-preemptible", dest="preemptible", action="store_false",
                   help="in quota only, never preempted")
    s.add_argument("--node-pool", help="node pool to run in (default: any)")
    s.add_argument("--checkpoint-dir", help="absolute path kept across preemptions")
    s.add_argument("--image", help="container image (Kubernetes)")
    s.add_argument("--grace-period", type=float, help="seconds between SIGTERM and SIGKILL (default 60)")
    s.add_argument("--restart-policy", choices=["OnFailure", "Never"], help="restart the gang after a failure (default OnFailure)")
    s.add_argument("--backoff-limit", type=int, help="gang restarts after failures (default 3)")
    s.add_argument("-e", "--env", action="append", help="NAME=VALUE for every worker (repeatable)")
    s.usage = "gpupool training submit NAME [options] -- COMMAND..."
    s.set_defaults(fn=lambda a: _submit(a, api))
    RESOURCE.add_actions(acts, api, "job", {
        "list": "training jobs of your projects", "describe": "status, transitions and events of a job",
        "delete": "delete a job"}, {"project": "only this project's jobs", "status": "only jobs in this status"})
    lg = acts.add_parser("logs", help="a worker's output")
    lg.add_argument("name", type=name_arg(), help="the job")
    lg.add_argument("--rank", type=int, default=0, help="the worker")
    lg.add_argument("--tail", type=int, default=200, help="lines from the end")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new output")
    lg.set_defaults(fn=lambda a: _logs(a, api))
    ex = acts.add_parser("exec", help="run a command in a running worker (through the SSH gateway)")
    ex.add_argument("name", type=name_arg(), help="the job")
    ex.add_argument("--rank", type=int, default=0, help="the worker")
    ex.usage = f"gpupool {ex.prog.split()[1]} exec NAME [options] -- COMMAND..."
    ex.set_defaults(fn=lambda a: remote_action(a, api, "training", f"{a.name}-w{a.rank}"))
    pf = acts.add_parser("port-forward", help="a local port to a port of a running worker (through the SSH gateway)")
    pf.add_argument("name", type=name_arg(), help="the job")
    pf.add_argument("--rank", type=int, default=0, help="the worker")
    pf.add_argument("rest", nargs=1, metavar="LOCAL:REMOTE", help="the local and the worker's port (LOCAL 0: any free port)")
    pf.set_defaults(fn=lambda a: remote_action(a, api, "training", f"{a.name}-w{a.rank}"))
    for action, what in (("suspend", "stop a job and free its GPUs"), ("resume", "queue a suspended job again")):
        c = acts.add_parser(action, help=what)
        c.add_argument("name", type=name_arg(), help="the job")
        c.set_defaults(fn=lambda a: _control(a, api))
