"""The errors of the host package, one hierarchy so a caller can catch all of them::

    GpupoolError
    └── HostError
        ├── AccountError      no usable Unix account for a hub user
        ├── LimitsError       a limit out of range (also a ValueError)
        ├── CgroupError       a cgroup could not be made, joined or removed
        └── LaunchError       a workload could not be started or found
            ├── SpecError     a Spec field out of range (also a ValueError)
            └── NotRunning    no running process to enter (enter.py)
"""

from __future__ import annotations

from gpupool.errors import GpupoolError


class HostError(GpupoolError):
    """An error of the host package."""


class AccountError(HostError):
    """No usable Unix account for a hub user; the message names the account and why."""


class LimitsError(HostError, ValueError):
    """A CPU, memory or device limit out of its range; the message names the field."""


class CgroupError(HostError):
    """A cgroup could not be made, joined or removed."""


class LaunchError(HostError):
    """A workload could not be started, with what its monitor reported."""


class SpecError(LaunchError, ValueError):
    """A field of a Spec out of range; the message names the field."""


__all__ = ["AccountError", "CgroupError", "HostError", "LaunchError", "LimitsError", "SpecError"]
