"""How sizes, times, GPU shares, placements and the waiting reason are written for people."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from hub_ext import humanize
from hub_ext.workspaces.home import asked

NOW = datetime(2026, 12, 3, 6, 35, tzinfo=UTC).timestamp()


def test_sizes_keep_one_decimal_and_drop_a_zero():
    assert humanize.gib(79.6475) == "79.6 GiB"
    assert humanize.mib(81559) == "79.6 GiB"
    assert humanize.gib(80) == "80 GiB"
    assert humanize.mib(512) == "512 MiB"
    assert humanize.size(1023.99 * 2**30) == "1 TiB"
    assert humanize.size(0) == "0 B"
    assert humanize.size(None) == "—"


@given(st.floats(min_value=0, max_value=2**60, allow_nan=False))
def test_a_size_is_a_short_number_and_a_unit(n):
    number, unit = humanize.size(n).split(" ")
    assert unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    assert len(number.partition(".")[2]) <= 1 and float(number) < 1024


def test_times_are_relative_to_today_in_utc():
    assert humanize.when(NOW - 600, NOW) == "today 06:25 UTC"
    assert humanize.when(NOW - 86400, NOW) == "yesterday 06:35 UTC"
    assert humanize.when(NOW - 30 * 86400, NOW) == "3 Nov 06:35 UTC"
    assert humanize.when(NOW - 400 * 86400, NOW) == "29 Oct 2025 06:35 UTC"
    assert humanize.when(None) == "—"
    assert humanize.ago(NOW - 3 * 3600 - 300, NOW) == "3 h 5 min ago"
    assert humanize.ago(0, NOW) == "never"
    assert humanize.duration(45) == "45 s" and humanize.duration(2 * 86400) == "2 d"


def test_gpu_shares_and_placements():
    assert humanize.gpus(250) == "0.25 GPU" and humanize.gpus(1000) == "1 GPU"
    assert humanize.gpus(2000) == "2 GPUs" and humanize.gpus(0) == "no GPU"
    two = [{"node": "local", "gpu_indices": [2], "gpu_milli": 1000},
           {"node": "local", "gpu_indices": [3], "gpu_milli": 1000}]
    assert humanize.placement(two) == "local GPU 2 × 1; local GPU 3 × 1"
    assert asked({"gpu_mode": "fraction", "gpu_fraction": 0.25}) == "0.25 GPU"
    assert asked({"gpu_mode": "memory", "gpu_memory_gib": 19.9}) == "19.9 GiB of GPU memory"


def test_one_waiting_text_for_a_row_its_rest_form_and_an_update():
    reason = "project nlp is at its quota 1/1 GPUs"
    want = "Waiting in the queue (position 2): project nlp is at its quota 1/1 GPUs"

    class Row:
        queue_position = 2

    Row.reason = reason
    assert humanize.waiting(reason, 2) == want
    assert humanize.row_waiting(Row()) == want
    assert humanize.row_waiting({"reason": reason, "queue_position": 2}) == want
    assert humanize.waiting("", None) == "Waiting in the queue"


def test_a_range_end_is_a_full_utc_time_from_a_timestamp_or_iso():
    assert humanize.moment("2026-11-28T23:17:07.458666Z") == "2026-11-28 23:17 UTC"
    assert humanize.moment("2026-11-29T00:47:00+01:30") == "2026-11-28 23:17 UTC"
    assert humanize.moment(NOW) == "2026-12-03 06:35 UTC"
    assert humanize.moment(None) == "—"


def test_a_gpu_share_says_what_the_workload_holds():
    quarter = {"GPUPOOL_NODE": "local", "GPUPOOL_GPU_INDICES": "0", "GPUPOOL_GPU_FRACTION": "0.25",
               "GPUPOOL_MEMORY_LIMIT": str(81559 * 2**20 // 4), "GPUPOOL_COMPUTE_SHARE": "25"}
    assert humanize.gpu_share(quarter) == "0.25 GPU of local GPU 0: 19.9 GiB GPU memory, 25% compute"
    assert humanize.gpu_share({"GPUPOOL_NODE": "a", "GPUPOOL_GPU_INDICES": "0,1", "GPUPOOL_GPU_FRACTION": "1"}) \
        == "2 GPUs (a GPU 0,1)"
    assert humanize.gpu_share({"GPUPOOL_NODE": "a", "GPUPOOL_GPU_INDICES": "3", "GPUPOOL_GPU_FRACTION": "1"}) \
        == "1 GPU (a GPU 3)"
    assert humanize.gpu_share({}) == "no GPU"
