"""A real (small) training run for the preemption tests: minibatch SGD on a linear model
with numpy, checkpointed with gpupool.checkpoint. Deterministic for a seed, so a run that
was preempted and resumed must end with exactly the weights of an uninterrupted one.

Env: STEPS (total), EVERY (checkpoint interval), STEP_SLEEP (seconds per step), SEED,
RESULT (JSON file for the final weights), PROGRESS (file that gets one line per step run).
"""

import json
import os
import random
import time

import numpy as np

from gpupool.checkpoint import Checkpointer

steps = int(os.environ.get("STEPS", "200"))
every = int(os.environ.get("EVERY", "10"))
pause = float(os.environ.get("STEP_SLEEP", "0.01"))
seed = int(os.environ.get("SEED", "0"))
random.seed(seed)
np.random.seed(seed)
rng = np.random.default_rng(seed)
X = rng.normal(size=(512, 16))
y = X @ rng.normal(size=16) + 0.1 * rng.normal(size=512)
w = np.zeros(16)

ck = Checkpointer(every=every)
ck.register("w", w)
ck.register("rng", rng)
ck.register_rng()
start = ck.restore()
attempt = os.environ.get("GPUPOOL_ATTEMPT", "0")
with open(os.environ.get("PROGRESS", "progress.txt"), "a") as progress:
    for step in range(start, steps):
        batch = rng.integers(0, len(X), size=32)
        lr = 0.05 * (1 + 0.1 * random.random()) * (1 + 0.01 * np.random.rand())
        grad = X[batch].T @ (X[batch] @ w - y[batch]) / len(batch)
        w -= lr * grad
        progress.write(f"{step} {attempt}\n")
        progress.flush()
        time.sleep(pause)
        ck.step(step + 1)
loss = float(np.mean((X @ w - y) ** 2))
with open(os.environ.get("RESULT", "result.json"), "w") as f:
    json.dump({"w": w.tolist(), "loss": loss, "steps": steps}, f)
