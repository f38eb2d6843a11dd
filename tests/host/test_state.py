"""What a run directory's files say: how an end is described, and a pid taken for the
workload only while it is the same process (pid and start time)."""

from __future__ import annotations

import os
import signal

import pytest

from hub_ext.host.process import Handle
from hub_ext.host.state import Exit, proc_start_time, read_json, write_json


@pytest.mark.parametrize("end, text", [
    (Exit(0, None), "exit code 0"),
    (Exit(1, None), "exit code 1"),
    (Exit(None, signal.SIGKILL), "killed by SIGKILL"),
    (Exit(None, 77), "killed by signal 77"),
    (Exit(None, signal.SIGKILL, oom=True, memory_limit_bytes=512 * 2**20), "killed: out of memory (limit 512 MiB)"),
    (Exit(None, signal.SIGKILL, oom=True), "killed: out of memory"),
    (Exit(None, None), "ended; its monitor was killed"),
])
def test_describe(end, text):
    assert end.describe() == text
    assert Exit.from_json(end.to_json()) == end


def test_a_reused_pid_is_not_the_workload(tmp_path):
    run = tmp_path / "w"
    run.mkdir()
    me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid()), "monitor_pid": os.getpid(),
          "monitor_start_time": proc_start_time(os.getpid())}
    assert Handle(run, me).alive()
    assert not Handle(run, {**me, "start_time": me["start_time"] + 1}).alive()
    write_json(run / "exit.json", Exit(0, None).to_json())
    assert not Handle(run, me).alive() and Handle(run, me).exit() == Exit(0, None)


def test_json_files_are_replaced_whole(tmp_path):
    path = tmp_path / "x.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2} and os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert read_json(tmp_path / "absent.json") is None
