"""gpupool's JupyterHub service: the admin panel and the REST API (``python -m
hub_ext.service``, started by the hub). Shares the database with the hub process."""
