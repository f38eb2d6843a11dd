# JupyterHub config used by `gpupool up`: loads the user's gpupool_config.py (traitlets,
# both c.Gpupool.* and any c.JupyterHub.* options) and then derives the hub's settings.
import os

c = get_config()  # noqa: F821 (provided by traitlets when JupyterHub loads this file)
_user = os.environ.get("GPUPOOL_CONFIG", "")
if _user and os.path.exists(_user):
    load_subconfig(_user)  # noqa: F821

from hub_ext.hubconfig import configure  # noqa: E402

configure(c)
