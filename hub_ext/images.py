"""The image trainings and inference services run on Kubernetes when their spec names none:
the project's workspace image (docker/workspace/Dockerfile), which holds what they import
(``gpupool.checkpoint``, numpy) and the interception library. The chart sets the one it
installs (``c.Gpupool.workload_image``, the activator's ``--default-image``).
And what every such pod's spec starts from."""

WORKLOAD_IMAGE = "ghcr.io/gpupool/gpupool-workspace:0.1.0"

# Trainings, services and commands call no Kubernetes API: no service-account token is
# mounted in them, so a workload cannot act as its namespace's default account (the chart's
# workspaces have none either: ``c.KubeSpawner.automount_service_account_token = False``).
WORKLOAD_POD_SPEC = {"automountServiceAccountToken": False}
