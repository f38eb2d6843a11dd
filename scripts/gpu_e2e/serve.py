"""The model server of ``scripts/gpu-e2e``: a small model built in code (no downloaded
weights) on the GPU, served over HTTP on ``$PORT``.

    python serve.py MODE

``/health`` answers ok once the model is loaded; ``/predict`` runs the model once and
answers JSON with the replica's pid, the output and its view of the GPU's memory:
``gpu_total`` (the cap, under the interception library) and ``gpu_used`` (what the
replica holds of it). With MODE fake the "model" is 256 MiB of weights and a kernel
launch on the fake driver.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tornado import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu  # noqa: E402


class Model:
    def __init__(self, mode: str):
        self.g = gpu.open_gpu(mode)
        if mode == "real":
            import torch

            torch.manual_seed(0)
            self.torch = torch
            self.net = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.GELU(),
                                           torch.nn.Linear(4096, 16)).cuda().eval()
        else:
            self.torch = None
            self.g.alloc(256 << 20)

    def predict(self) -> list[float]:
        if self.torch is None:
            self.g.step()
            return [1.0]
        with self.torch.no_grad():
            out = self.net(self.torch.ones(1, 2048, device="cuda"))
        return [round(float(v), 4) for v in out[0, :4]]


class Health(web.RequestHandler):
    def get(self):
        self.write("ok")


class Predict(web.RequestHandler):
    def get(self):
        model: Model = self.settings["model"]
        output = model.predict()
        free, total = model.g.mem_info()
        self.write(json.dumps({"pid": os.getpid(), "device": model.g.name(), "output": output,
                               "gpu_total": total, "gpu_used": total - free}))


async def serve(mode: str) -> None:
    app = web.Application([("/health", Health), ("/predict", Predict)], model=Model(mode))
    app.listen(int(os.environ.get("PORT", "8000")), "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
