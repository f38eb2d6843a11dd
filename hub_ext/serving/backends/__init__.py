"""Where replicas run: ``embedded`` (local processes placed by the hub's embedded
scheduler) and ``k8s`` (pods with ``schedulerName: gpupool``). Both implement
``inference.controller.Backend``."""
