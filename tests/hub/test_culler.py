"""The idle culler's choice: GPU utilization where NVML is there, activity otherwise."""

from types import SimpleNamespace

from hub_ext.service.culler import idle_servers

NOW = 10_000.0
USERS = [{"name": "alice", "servers": {"": {"ready": True, "last_activity": "1970-01-01T02:30:00Z"}}},
         {"name": "bob", "servers": {"": {"ready": True, "last_activity": "1970-01-01T00:10:00Z"}}}]
ROWS = {"ws-alice": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [0], "gpu_milli": 250}]),
        "ws-bob": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [1], "gpu_milli": 1000}])}


def test_activity_without_gpus():
    # alice was active 1,000 s before NOW, bob 9,400 s before: only bob is idle after an hour
    assert idle_servers(USERS, ROWS, None, {}, NOW, 3600, 1.0) == [("bob", "")]


def test_gpu_use_decides_where_nvml_is_there():
    busy = {"ws-alice": NOW - 7200, "ws-bob": NOW - 7200}
    # GPU 1 (bob) is busy now, GPU 0 (alice) has been idle for two hours
    out = idle_servers(USERS, ROWS, {0: 0.0, 1: 80.0}, busy, NOW, 3600, 1.0)
    assert out == [("alice", "")] and busy["ws-bob"] == NOW
