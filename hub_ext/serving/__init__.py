"""Inference services on the hub: their table, request rules and CLI, the hub service that
runs the activator (``hub``), the services published for the chart's activator, and the
replica backends. The activator, controller and autoscaler themselves are the top-level
``inference`` package."""
