"""What every ``gpupool`` noun's subcommands share (kept apart from ``hub_ext.cli`` so the
nouns can import it without importing the CLI that registers them)."""

from __future__ import annotations

import sys
from collections.abc import Callable

ApiCall = Callable[..., dict]  # api(args, method, path, body=None) -> the JSON answer


def env_option(items: list[str]) -> dict[str, str]:
    """``-e NAME=VALUE`` options as a dict; a malformed one ends the command with a message."""
    env = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            sys.exit(f"gpupool: -e/--env: must be NAME=VALUE, got {item!r}")
        env[name] = value
    return env
