"""The idle culler's choice: the library's launch count on a fraction, GPU utilization on
whole GPUs where NVML is there, activity otherwise."""

from types import SimpleNamespace

from hub_ext.host.activity import NONE, Activity
from hub_ext.service.culler import idle_servers

NOW = 10_000.0
USERS = [{"name": "alice", "servers": {"": {"ready": True, "last_activity": "1970-01-01T02:30:00Z"}}},
         {"name": "bob", "servers": {"": {"ready": True, "last_activity": "1970-01-01T00:10:00Z"}}}]
ROWS = {"ws-alice": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [0], "gpu_milli": 1000}]),
        "ws-bob": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [1], "gpu_milli": 1000}])}


def test_activity_without_gpus():
    # alice was active 1,000 s before NOW, bob 9,400 s before: only bob is idle after an hour
    assert idle_servers(USERS, ROWS, None, {}, NOW, 3600, 1.0) == [("bob", "")]


def test_gpu_use_decides_where_nvml_is_there():
    busy = {"ws-alice": NOW - 7200, "ws-bob": NOW - 7200}
    # GPU 1 (bob) is busy now, GPU 0 (alice) has been idle for two hours
    out = idle_servers(USERS, ROWS, {0: 0.0, 1: 80.0}, busy, NOW, 3600, 1.0)
    assert out == [("alice", "")] and busy["ws-bob"] == NOW


def test_a_fraction_is_judged_by_its_own_launches_not_by_nvml():
    rows = {"ws-alice": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [0], "gpu_milli": 250}]),
            "ws-bob": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [0], "gpu_milli": 250}])}
    seen = {"ws-alice": Activity(5, 1, NOW), "ws-bob": NONE}
    busy: dict[str, float] = {}
    counts: dict[str, int] = {}
    # first sight: both count as busy, whatever NVML says
    assert idle_servers(USERS, rows, {0: 0.0}, busy, NOW, 3600, 1.0, seen.get, counts) == []
    seen["ws-alice"] = Activity(9, 1, NOW + 3000)
    out = idle_servers(USERS, rows, {0: 95.0}, busy, NOW + 3601, 3600, 1.0, seen.get, counts)
    assert out == [("bob", "")] and busy["ws-alice"] == NOW + 3601


def test_a_workspace_started_again_is_seen_afresh():
    rows = {"ws-bob": SimpleNamespace(placement=[{"node": "n", "gpu_indices": [0], "gpu_milli": 250}])}
    seen = {"ws-bob": Activity(7, 0, NOW)}
    busy: dict[str, float] = {}
    counts: dict[str, int] = {}
    assert idle_servers(USERS[1:], rows, None, busy, NOW, 3600, 1.0, seen.get, counts) == []
    # stopped (no row) at one pass, started again later with the same count in its file
    assert idle_servers([], {}, None, busy, NOW + 100, 3600, 1.0, seen.get, counts) == []
    assert idle_servers(USERS[1:], rows, None, busy, NOW + 4000, 3600, 1.0, seen.get, counts) == []
    assert idle_servers(USERS[1:], rows, None, busy, NOW + 7601, 3600, 1.0, seen.get, counts) == [("bob", "")]

def test_a_policy_idle_timeout_replaces_the_hub_wide_one():
    from types import SimpleNamespace as NS

    users = [{"name": "u", "servers": {"": {"ready": True, "last_activity": "2026-01-01T00:00:00Z"}}}]
    rows = {"ws-u": NS(placement=[], project="nlp")}
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    assert idle_servers(users, rows, None, {}, start + 120, 3600, 1.0) == []
    assert idle_servers(users, rows, None, {}, start + 120, 3600, 1.0, idle_for={"nlp": 60}) == [("u", "")]
    assert idle_servers(users, rows, None, {}, start + 120, 3600, 1.0, idle_for={"other": 60}) == []


# -- trainings: the same rule per worker; idle only when every worker is ----------------------
def _training(name: str, *pods: dict, project: str = "nlp", start_time: float = 1.0):
    return SimpleNamespace(name=name, project=project, placement=list(pods), start_time=start_time)


Q0 = {"node": "n", "gpu_indices": [0], "gpu_milli": 250}
Q1 = {"node": "n", "gpu_indices": [1], "gpu_milli": 250}


def test_a_training_is_idle_only_when_every_worker_is():
    from hub_ext.service.culler import idle_trainings

    job = _training("job", Q0, Q1)
    seen = {"job-0": Activity(5, 1, NOW), "job-1": NONE}
    busy: dict[str, float] = {}
    counts: dict[str, int] = {}
    limit = {"nlp": 600}
    assert idle_trainings([job], {0: 0.0, 1: 0.0}, busy, counts, NOW, 1.0, limit, seen.get) == []
    seen["job-0"] = Activity(8, 1, NOW + 500)  # worker 0 launched, worker 1 did nothing
    assert idle_trainings([job], None, busy, counts, NOW + 601, 1.0, limit, seen.get) == []
    assert set(busy) == {"job/1.0/0", "job/1.0/1"} and busy["job/1.0/0"] == NOW + 601
    # nothing since on either: idle once the last busy worker has been idle that long
    assert idle_trainings([job], None, busy, counts, NOW + 1200, 1.0, limit, seen.get) == []
    assert idle_trainings([job], None, busy, counts, NOW + 1202, 1.0, limit, seen.get) == [job]


def test_whole_gpu_workers_are_judged_by_nvml_and_unseen_ones_never():
    from hub_ext.service.culler import idle_trainings

    whole = _training("whole", {"node": "n", "gpu_indices": [2, 3], "gpu_milli": 1000})
    cpu = _training("cpu", {"node": "n", "gpu_indices": [], "gpu_milli": 0})
    busy: dict[str, float] = {}
    counts: dict[str, int] = {}
    limit = {"nlp": 600}
    assert idle_trainings([whole, cpu], {2: 0.0, 3: 50.0}, busy, counts, NOW, 1.0, limit) == []
    assert idle_trainings([whole, cpu], {2: 0.0, 3: 0.0}, busy, counts, NOW + 601, 1.0, limit) == [whole]
    # without NVML a whole GPU's use cannot be told: never idle
    assert idle_trainings([whole, cpu], None, {}, {}, NOW + 9999, 1.0, limit) == []


def test_a_training_without_a_policy_timeout_is_never_idle_and_its_memory_goes():
    from hub_ext.service.culler import idle_trainings

    job = _training("job", Q0, project="vision")
    busy = {"job/1.0/0": NOW - 10_000, "gone/1.0/0": NOW - 10_000}
    counts = {"job/1.0/0": 0, "gone/1.0/0": 0}
    assert idle_trainings([job], None, busy, counts, NOW, 1.0, {"nlp": 60}, {"job-0": NONE}.get) == []
    assert busy == {} and counts == {}



def test_a_training_placed_again_is_seen_afresh():
    """Suspended for idleness and resumed (or requeued) between two passes: its new run
    is not judged by the old one's idle time."""
    from hub_ext.service.culler import idle_trainings

    seen = {"job-0": NONE}
    busy: dict[str, float] = {}
    counts: dict[str, int] = {}
    limit = {"nlp": 600}
    assert idle_trainings([_training("job", Q0)], None, busy, counts, NOW, 1.0, limit, seen.get) == []
    again = _training("job", Q0, start_time=NOW + 700)
    assert idle_trainings([again], None, busy, counts, NOW + 701, 1.0, limit, seen.get) == []
    assert idle_trainings([again], None, busy, counts, NOW + 1302, 1.0, limit, seen.get) == [again]
