"""The REST API: one module per resource, the shared handler (``base``), and the route table
(``routes``)."""
