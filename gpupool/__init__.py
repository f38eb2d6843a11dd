"""What training scripts and notebooks import: ``gpupool.checkpoint`` (standard library
only) and ``gpupool.widgets`` (ipywidgets). Nothing here imports the hub or the scheduler,
so this package works inside any workload."""
