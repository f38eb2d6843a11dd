"""What a workload carries besides its command: a project's credentials and data sources, and
their check and delivery (``attach``)."""
