"""The base of every error gpupool raises, so a caller can catch gpupool's errors apart from
Python's and its libraries'. Standard library only and imports nothing: the scheduler's core,
the hub and the workload package all derive from it without depending on each other.

Each error keeps the built-in class it always had as a second base (``ValidationError`` is
still a ``ValueError``, ``Forbidden`` a ``PermissionError``), so existing handlers match."""

from __future__ import annotations


class GpupoolError(Exception):
    """An error of gpupool's own."""


__all__ = ["GpupoolError"]
