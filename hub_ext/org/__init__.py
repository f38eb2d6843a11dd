"""The organisation: departments, projects and members (``projects``), roles, policies, GPU
sharing, SSH keys, and single sign-on (``auth``)."""
