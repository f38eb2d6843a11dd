"""Notebook widgets (ipywidgets): submit and watch training jobs, see the project's quota.

    from gpupool.widgets import JobLauncher
    JobLauncher()          # in a gpupool JupyterLab: URL and token come from the environment

It talks to gpupool's REST API (``/services/gpupool/api/v1``) with the notebook's
JupyterHub token; ``client=`` takes any ``call(method, path, body) -> dict`` instead (a
test seam, or another transport). Only ipywidgets and the standard library are imported.
"""

from __future__ import annotations

import html
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

import ipywidgets as w

from .errors import GpupoolError

__all__ = ["JobLauncher", "ApiError"]

Client = Callable[[str, str, "dict | None"], dict]


class ApiError(GpupoolError, RuntimeError):
    """The API refused a request; ``field`` names the bad input when there is one."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field = status, field


def http_client(url: str | None = None, token: str | None = None) -> Client:
    base = (url or os.environ.get("GPUPOOL_URL") or "http://127.0.0.1:8000").rstrip("/")
    base += "/services/gpupool/api/v1"
    token = token or os.environ.get("GPUPOOL_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def call(method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method, headers={
            "Authorization": f"token {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read()
                return json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read())["error"]
            except Exception:
                raise ApiError(e.code, str(e)) from None
            raise ApiError(e.code, err.get("message", ""), err.get("field")) from None

    return call


def gpu_ask(gpu: float) -> dict:
    """The form's one GPU number in the request's one spelling: 0 no GPU, below 1 a share of
    one GPU, from 1 whole GPUs (a number between whole ones is sent as it is, for the hub's
    rules to refuse by name)."""
    if gpu == 0:
        return {"gpu_mode": "none"}
    if gpu < 1:
        return {"gpu_mode": "fraction", "gpu_fraction": gpu}
    return {"gpu_mode": "whole", "gpus": int(gpu) if gpu == int(gpu) else gpu}


class JobLauncher(w.VBox):
    """A form that submits a training job, the project's quota, and its jobs' states."""

    def __init__(self, url: str | None = None, token: str | None = None, client: Client | None = None,
                 **kwargs):
        self.api = client or http_client(url, token)
        me = self._call("GET", "/me") or {"projects": []}
        projects = me.get("projects") or [""]
        self.name = w.Text(description="Name", placeholder="my-job")
        self.project = w.Dropdown(options=projects, value=projects[0], description="Project")
        self.gpu = w.BoundedFloatText(value=1.0, min=0, max=64, step=0.05, description="GPU")
        self.workers = w.BoundedIntText(value=1, min=1, max=64, description="Workers")
        self.preemptible = w.Checkbox(value=True, description="Preemptible (may run over quota)")
        self.command = w.Text(description="Command", placeholder="python train.py --epochs 10")
        self.submit_button = w.Button(description="Submit", button_style="primary")
        self.refresh_button = w.Button(description="Refresh")
        self.message = w.HTML()
        self.quota = w.HTML()
        self.jobs = w.HTML()
        self.submit_button.on_click(lambda _b: self.submit())
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.project.observe(lambda _c: self.refresh(), names="value")
        self._watching: threading.Event | None = None
        super().__init__([
            w.HTML("<b>gpupool training job</b>"), self.name, self.project, self.gpu, self.workers,
            self.preemptible, self.command, w.HBox([self.submit_button, self.refresh_button]),
            self.message, self.quota, self.jobs,
        ], **kwargs)
        self.refresh()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict | None:
        try:
            return self.api(method, path, body)
        except ApiError as e:
            self._say(str(e), error=True)
        except OSError as e:
            self._say(f"cannot reach gpupool: {e}", error=True)
        return None

    def _say(self, text: str, error: bool = False) -> None:
        if hasattr(self, "message"):
            colour = "#b00020" if error else "#1b5e20"
            self.message.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    def submit(self) -> dict | None:
        body = {"name": self.name.value.strip(), "project": self.project.value,
                **gpu_ask(self.gpu.value), "workers": self.workers.value,
                "preemptible": self.preemptible.value, "command": self.command.value.split()}
        t = self._call("POST", "/trainings", body)
        if t is not None:
            self._say(f"{t['name']}: {t['status']} ({t['gpu']})")
            self.refresh()
        return t

    def refresh(self) -> None:
        p = self.project.value
        if not p:
            return
        proj = self._call("GET", f"/projects/{p}")
        if proj is not None:
            limit = proj.get("limit")
            self.quota.value = (
                f"Project <b>{html.escape(p)}</b>: quota {proj['gpus']:g} GPUs, in use "
                f"{proj['allocated_gpus']:g}" + (f", limit {limit:g}" if limit is not None else "")
                + f"; {proj.get('running', 0)} running, {proj.get('pending', 0)} pending")
        items = (self._call("GET", f"/trainings?project={p}") or {}).get("items", [])
        rows = "".join(
            f"<tr><td>{html.escape(t['name'])}</td><td>{t['status']}</td><td>{html.escape(t['gpu'])}</td>"
            f"<td>{t['preemptions']}</td><td>{html.escape(t['reason'])}</td></tr>" for t in items)
        self.jobs.value = ("<table><tr><th>Job</th><th>Status</th><th>GPU</th><th>Preemptions</th>"
                           f"<th>Reason</th></tr>{rows}</table>")

    def watch(self, every_s: float = 5.0) -> None:
        """Refresh in the background every ``every_s`` seconds until ``stop_watching()``."""
        self.stop_watching()
        stop = self._watching = threading.Event()

        def loop():
            while not stop.wait(every_s):
                self.refresh()

        threading.Thread(target=loop, daemon=True).start()

    def stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.set()
            self._watching = None
