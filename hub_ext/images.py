"""The image trainings and inference services run on Kubernetes when their spec names none:
the project's workspace image (docker/workspace/Dockerfile), which holds what they import
(``gpupool.checkpoint``, numpy) and the interception library. The chart sets the one it
installs (``c.Gpupool.workload_image``, the activator's ``--default-image``)."""

WORKLOAD_IMAGE = "ghcr.io/gpupool/gpupool-workspace:0.1.0"
