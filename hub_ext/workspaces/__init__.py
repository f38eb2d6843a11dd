"""Workspaces: the spawners (embedded and Kubernetes), the spawn form, the home page, and
their metrics."""
