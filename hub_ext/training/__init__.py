"""Training jobs: the request rules (``spec``), the database side (``db``), the gang's
distributed environment (``gang``), the embedded job runner (``embedded``), the Kubernetes
controller (``kubernetes``) and its manifests (``pods``), and the CLI's ``training`` commands
(``cli``)."""
