"""Training jobs: the request rules (``spec``), the database side (``db``), the gang's
distributed environment (``gang``), the embedded job runner (``runner``), Kubernetes
manifests (``k8s``), and the CLI's ``training`` commands (``cli``)."""
