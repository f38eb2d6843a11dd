"""The database: the core tables and the engine (``tables``), the event log (``events``), the
audit log (``audit``), and GPU-hours from the event log (``accounting``)."""
