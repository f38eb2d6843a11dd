"""Scale-to-zero inference: the activator (HTTP front that holds requests until a replica is
ready), the controller (replicas per service, through a ``controller.Backend``), the
autoscaler, and their metrics. It imports the scheduler's contract and nothing of the hub: the
hub (``hub_ext.serving``) gives it service descriptions (``contract.ServiceSpec``) and the
replica backends, and runs it in the hub or as the chart's activator."""
