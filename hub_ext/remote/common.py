"""What every ``gpupool`` noun's subcommands share (kept apart from ``hub_ext.cli`` so the
nouns can import it without importing the CLI that registers them)."""

from __future__ import annotations

import argparse
import json
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .. import validation

ApiCall = Callable[..., dict]  # api(args, method, path, body=None) -> the JSON answer


def name_arg(kind: str = "name", field: str = "NAME") -> Callable[[str], str]:
    """An argparse ``type`` for a name that goes into a URL path: the validation layer's
    pattern for ``kind``, so that no argument can point a request at another path."""

    def check(raw: str) -> str:
        if raw == "":  # an optional argument left out
            return raw
        try:
            return validation.name(raw, field, kind)
        except validation.FieldError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    check.__name__ = kind  # argparse names the type in its message
    return check


def env_option(items: list[str]) -> dict[str, str]:
    """``-e NAME=VALUE`` options as a dict; a malformed one ends the command with a message."""
    env = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            sys.exit(f"gpupool: -e/--env: must be NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def add_gpu_options(p: argparse.ArgumentParser, per: str = "", memory: bool = True,
                    none: bool = True, old: bool = False) -> None:
    """The GPU ask's options, one set for every noun, in the request's one spelling
    (hub_ext.requests.reader): ``--fraction``, ``--gpus``, ``--gpu-memory``, ``--no-gpu``.
    ``old``: ``--gpu``, the older spelling, sent as written (the hub answers a warning)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fraction", help=f"a share of one GPU{per}, from 0.05 to 1 in steps of 0.05")
    g.add_argument("--gpus", type=int, help=f"whole GPUs{per}")
    if memory:
        g.add_argument("--gpu-memory", help=f"GPU memory{per} in GiB, or a size such as 20GiB or 512MiB")
    if none:
        g.add_argument("--no-gpu", action="store_true", help="no GPU: CPUs and memory only")
    if old:
        g.add_argument("--gpu", "-g", type=float,
                       help=f"deprecated (use --fraction or --gpus): GPUs{per}, below 1 a fraction")


def submit_body(args, command: list[str], options) -> dict:
    """A submission's body: its name, command and GPU options, each ``(field, value)`` of
    ``options`` that is given, and its ``-e`` environment."""
    body: dict = {"name": args.name, "command": command, **gpu_body(args)}
    body.update((key, value) for key, value in options if value is not None)
    if args.env:
        body["env"] = env_option(args.env)
    return body


def gpu_body(args) -> dict:
    """The GPU options given, as request fields (the values as typed, for the hub's rules
    to check: ``--fraction 0`` is refused there, as in the form)."""
    from ..requests.reader import gib

    if getattr(args, "no_gpu", False):
        return {"gpu_mode": "none"}
    if getattr(args, "gpus", None) is not None:
        return {"gpu_mode": "whole", "gpus": args.gpus}
    if getattr(args, "gpu_memory", None) is not None:
        try:
            size = gib(args.gpu_memory, "--gpu-memory")
        except validation.FieldError as e:
            sys.exit(f"gpupool: {e}")
        return {"gpu_mode": "memory", "gpu_memory_gib": size}
    if getattr(args, "fraction", None) is not None:
        return {"gpu_mode": "fraction", "gpu_fraction": args.fraction}
    if getattr(args, "gpu", None) is not None:
        return {"gpu": args.gpu}
    return {}


@dataclass(frozen=True)
class Resource:
    """One row of the CLI's table of resources: what ``list``, ``describe`` and ``delete``
    do for a noun (workspace, training, inference), from its REST path. ``row``: a
    ``str.format`` line over the strings ``cells`` makes of one item (the header line is the
    same format over the field names in capitals); ``show``: ``describe``'s text; ``deleted``: what
    ``delete`` prints, given the name and (where ``look_first``) the item before it went."""

    path: str
    row: str
    cells: Callable[[dict], dict[str, str]]
    deleted: Callable[[str, dict | None], str]
    show: Callable[[dict], None] | None = None
    filters: tuple[str, ...] = ()  # list's query options (args attributes)
    look_first: bool = False

    def list(self, args, api: ApiCall) -> int:
        q = "&".join(f"{k}={v}" for k in self.filters if (v := getattr(args, k, None)))
        path = self.path + (("&" if "?" in self.path else "?") + q if q else "")
        print(self.row.format(**{f: f.upper() for _, f, _, _ in string.Formatter().parse(self.row) if f}))
        for item in api(args, "GET", path)["items"]:
            print(self.row.format(**self.cells(item)))
        return 0

    def describe(self, args, api: ApiCall) -> int:
        item = api(args, "GET", f"{self.item_path}/{args.name}")
        if args.json or self.show is None:
            print(json.dumps(item, indent=2))
        else:
            self.show(item)
        return 0

    def delete(self, args, api: ApiCall) -> int:
        before = api(args, "GET", f"{self.item_path}/{args.name}") if self.look_first else None
        api(args, "DELETE", f"{self.item_path}/{args.name}")
        print(self.deleted(args.name, before))
        return 0

    @property
    def item_path(self) -> str:
        return self.path.split("?")[0]

    def add_actions(self, acts, api: ApiCall, noun: str, helps: dict[str, str],
                    filters: dict[str, str]) -> None:
        """``list``, ``describe`` and ``delete`` on a noun's subparsers. ``helps``: each
        action's help; ``filters``: list's options (name -> help)."""
        ls = acts.add_parser("list", help=helps["list"])
        for key, what in filters.items():
            ls.add_argument(f"--{key}", *(("-p",) if key == "project" else ()), help=what)
        ls.set_defaults(fn=lambda a: self.list(a, api))
        d = acts.add_parser("describe", help=helps["describe"])
        d.add_argument("name", type=name_arg(), help=f"the {noun}")
        d.add_argument("--json", action="store_true", help="the REST API's JSON")
        d.set_defaults(fn=lambda a: self.describe(a, api))
        rm = acts.add_parser("delete", help=helps["delete"])
        rm.add_argument("name", type=name_arg(), help=f"the {noun}")
        rm.set_defaults(fn=lambda a: self.delete(a, api))
