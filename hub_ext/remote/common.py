"""What every ``gpupool`` noun's subcommands share (kept apart from ``hub_ext.cli`` so the
nouns can import it without importing the CLI that registers them)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

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
