"""What training scripts and notebooks import: ``gpupool.checkpoint`` (standard library
only) and ``gpupool.widgets`` (ipywidgets); and ``gpupool.errors``, the base of every
gpupool error, which the scheduler and the hub import too. Nothing here imports the hub or
the scheduler, so this package works inside any workload."""
