"""The CLI's shared helpers (``common``) and its commands that reach a running workload
(``commands``, through the SSH gateway: ``connect``)."""
