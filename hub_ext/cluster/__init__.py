"""The hub's view of a Kubernetes cluster: mirrors kept by list and watch (``mirror``), the
organisation and the inventory copied both ways, the event log from pods, and what the hub
follows at start (``follow``)."""
