"""The interception library's compute share on a real GPU: a training step that synchronises
every step (the case the admission window is exact for), timed without the library and
with ``GPUPOOL_COMPUTE_SHARE`` at each share; then two processes at once, each paced at half
and each unpaced. Needs an NVIDIA GPU, PyTorch and ``make -C native lib``; prints JSON.

``x_unpaced`` is the step time against the unpaced one (a share of s% would ideally give
100/s); ``got_pct`` is the GPU time that implies (100 / x_unpaced).

    python3 bench/compute_share_gpu.py [--shares 100,50,25,10] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "native" / "build" / "libgpupool-cuda.so"

STEP = ROOT / "native" / "tests" / "train_step.py"  # the step gpu_check.sh times too


def start(share: int | None, steps: int, region: str) -> subprocess.Popen:
    env = dict(os.environ, GPUPOOL_SHARED_REGION=region)
    if share is not None:  # a memory limit switches the library on; 40 GiB leaves the step room
        env.update(LD_PRELOAD=str(LIB), GPUPOOL_MEMORY_LIMIT=str(40 << 30), GPUPOOL_COMPUTE_SHARE=str(share))
    cmd = [sys.executable, str(STEP), "--sync", "--steps", str(steps), "--repeats", "3"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)


def step_s(*procs: subprocess.Popen) -> list[float]:
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"compute_share_gpu: a step process failed (exit {p.returncode})")
        out.append(float(text.strip()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shares", default="100,50,25,10", help="compute shares in percent, comma-separated")
    ap.add_argument("--steps", type=int, default=100, help="steps per timed run (best of 3)")
    args = ap.parse_args()
    shares = [int(s) for s in args.shares.split(",")]
    if any(not 1 <= s <= 100 for s in shares) or args.steps < 1:
        raise SystemExit("compute_share_gpu: --shares must be percents from 1 to 100, --steps at least 1")
    if not LIB.exists():
        raise SystemExit(f"compute_share_gpu: {LIB} is missing: run make -C native lib")
    region = str(Path(tempfile.mkdtemp()) / "account")
    (unpaced,) = step_s(start(None, args.steps, region))
    out: dict = {"unpaced_step_s": round(unpaced, 6), "shares": {}}
    for s in shares:
        (t,) = step_s(start(s, args.steps, region))
        out["shares"][str(s)] = {"step_s": round(t, 6), "x_unpaced": round(t / unpaced, 3),
                                 "got_pct": round(100 * unpaced / t, 1)}
    out["two_at_50_step_s"] = [round(t, 6) for t in step_s(start(50, args.steps, region), start(50, args.steps, region))]
    out["two_unpaced_step_s"] = [round(t, 6) for t in step_s(start(None, args.steps, region), start(None, args.steps, region))]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
