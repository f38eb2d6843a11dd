"""What embedded mode does on the host: one Unix account per hub user (``accounts``), cgroup
limits (``cgroups``), and each workload under a small root monitor that outlives the hub
(``process``, ``monitor``). Importing this package imports nothing, so the monitor starts
with the standard library and these modules only."""
