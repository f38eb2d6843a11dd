"""The notebook widget against a fake API client (the widget's client= seam)."""

import pytest

pytest.importorskip("ipywidgets")

from gpupool.widgets import ApiError, JobLauncher, gpu_ask  # noqa: E402


class FakeApi:
    def __init__(self):
        self.calls, self.jobs = [], []

    def __call__(self, method, path, body=None):
        self.calls.append((method, path, body))
        if path == "/me":
            return {"name": "alice", "admin": False, "projects": ["research", "prod"]}
        if path.startswith("/projects/"):
            return {"name": path.split("/")[-1], "gpus": 2, "allocated_gpus": 1.5, "limit": None,
                    "running": 1, "pending": 0}
        if method == "POST" and path == "/trainings":
            if body["workers"] > 8:
                raise ApiError(400, "must be from 1 to 8", "workers")
            job = {"name": body["name"], "status": "Pending", "gpu": f"{body['gpu_fraction']:g} GPU",
                   "preemptions": 0, "reason": "", "project": body["project"]}
            self.jobs.append(job)
            return job
        if path.startswith("/trainings"):
            return {"items": self.jobs}
        raise AssertionError(path)


def test_submit_shows_quota_and_jobs():
    api = FakeApi()
    ui = JobLauncher(client=api)
    assert ui.project.options == ("research", "prod")
    assert "quota 2 GPUs, in use 1.5" in ui.quota.value
    ui.name.value, ui.gpu.value, ui.command.value = "exp1", 0.5, "python train.py --lr 0.1"
    t = ui.submit()
    assert t["status"] == "Pending"
    post = next(c for c in api.calls if c[0] == "POST")
    assert post[2] == {"name": "exp1", "project": "research", "gpu_mode": "fraction", "gpu_fraction": 0.5,
                       "workers": 1,
                       "preemptible": True, "command": ["python", "train.py", "--lr", "0.1"]}
    assert "exp1" in ui.jobs.value and "Pending" in ui.jobs.value
    assert "exp1: Pending" in ui.message.value


def test_api_errors_show_the_field():
    ui = JobLauncher(client=FakeApi())
    ui.workers.value = 9
    ui.name.value, ui.command.value = "x", "true"
    assert ui.submit() is None
    assert "workers: must be from 1 to 8" in ui.message.value


@pytest.mark.parametrize("gpu, ask", [
    (0, {"gpu_mode": "none"}),
    (0.25, {"gpu_mode": "fraction", "gpu_fraction": 0.25}),
    (1.0, {"gpu_mode": "whole", "gpus": 1}),
    (3.0, {"gpu_mode": "whole", "gpus": 3}),
    (1.5, {"gpu_mode": "whole", "gpus": 1.5}),
])
def test_the_gpu_field_is_sent_in_the_one_spelling(gpu, ask):
    assert gpu_ask(gpu) == ask
