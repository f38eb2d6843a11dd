"""A training step on the GPU (8 linear layers of 4096x4096, batch 256), timed: prints the
best seconds per step over ``--repeats`` runs of ``--steps``. With ``--sync`` it waits for
the GPU after every step (the case the compute share's window is exact for); without, only
after each run. Used by gpu_check.sh and bench/compute_share_gpu.py."""

import argparse
import time

import torch

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--steps", type=int, default=50)
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--sync", action="store_true", help="wait for the GPU after every step")
args = ap.parse_args()

torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(256, 4096, device="cuda")


def step():
    opt.zero_grad(set_to_none=True)
    m(x).square().mean().backward()
    opt.step()
    if args.sync:
        torch.cuda.synchronize()


for _ in range(20):
    step()
torch.cuda.synchronize()
best = float("inf")
for _ in range(args.repeats):
    t = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t) / args.steps)
print(best)
