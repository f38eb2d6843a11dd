"""The SSH gateway (``gateway``): logins with a JupyterHub token or an uploaded key, and
sessions that run inside a workload's own environment (``embedded``: the host's account,
cgroup and env)."""
