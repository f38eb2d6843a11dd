"""The SSH gateway (``gateway``): logins with a JupyterHub token or an uploaded key, and
sessions that run inside a workload's own environment (``embedded``: the host's account,
cgroup and env).

Code outside this package imports asyncssh from it (``from hub_ext.ssh import asyncssh``),
so that the filter below is in place before asyncssh is first imported."""

import warnings

from cryptography.utils import CryptographyDeprecationWarning

# asyncssh names cryptography's DSA classes at import (its type hints and DSA key support,
# which gpupool never uses: its host key is ed25519), and cryptography warns once per name.
# Only that warning, and only from asyncssh, is silenced.
warnings.filterwarnings("ignore", message="DSA is deprecated", category=CryptographyDeprecationWarning,
                        module=r"asyncssh(\.|$)")

import asyncssh  # noqa: E402

__all__ = ["asyncssh"]
