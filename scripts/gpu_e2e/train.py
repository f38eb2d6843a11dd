"""The training of ``scripts/gpu-e2e``: STEPS steps on the GPU, a checkpoint every EVERY
steps and on SIGTERM (gpupool.checkpoint), resumed from the latest one on start. With
E2E_MODE=real a small PyTorch model learns on the GPU; with E2E_MODE=fake each step is a
kernel launch on the fake driver.

Its log says where each attempt started and each step it finished, so that a reader can
match the step an attempt resumed from with the last step of the attempt before:

    start step=120 attempt=1 device=NVIDIA H100 80GB HBM3
    step 121
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu  # noqa: E402

from gpupool.checkpoint import Checkpointer  # noqa: E402

mode = os.environ.get("E2E_MODE", "real")
steps = int(os.environ.get("STEPS", "100000"))
every = int(os.environ.get("EVERY", "10"))
pause = float(os.environ.get("STEP_SLEEP", "0.05"))

g = gpu.open_gpu(mode)
ck = Checkpointer(every=every)
if mode == "real":
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ck.register("model", model)
    ck.register("optimizer", opt)

    def train_step() -> None:
        x = torch.randn(256, 512, device="cuda")
        loss = (model(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
else:
    g.alloc(256 << 20)  # the model's weights
    train_step = g.step
ck.register_rng()
start = ck.restore()
print(f"start step={start} attempt={os.environ.get('GPUPOOL_ATTEMPT', '0')} device={g.name()}", flush=True)
for step in range(start, steps):
    train_step()
    print(f"step {step + 1}", flush=True)
    time.sleep(pause)
    ck.step(step + 1)  # on SIGTERM: saves this step and exits
print("done", flush=True)
