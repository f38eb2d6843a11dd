"""The GPU work of ``scripts/gpu-e2e``, one set of operations for both of its modes: with
PyTorch on a real GPU (``real``), or with ctypes on the fake driver that ``make native``
builds (``fake``: native/build/fake/libcuda.so.1, no GPU). Workspace kernels, the training,
the model server and the script itself import it; where a workload holds a fraction of a
GPU, the interception library is in its LD_PRELOAD either way, so both modes go through
the same caps.

    python gpu.py rate MODE SECONDS     steps per second of the matmul loop (JSON)
    python gpu.py busy MODE             launch a step every half second, forever
    python gpu.py hold MODE SECONDS     hold some memory and run steps for SECONDS
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_CUDA = ROOT / "native" / "build" / "fake" / "libcuda.so.1"
CUDA_OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
FAKE_STEP_S = 0.001  # the fake's "kernel time" of one step


class FakeGpu:
    """Device 0 of the fake driver: allocations are bookkeeping, a step is one kernel
    launch and a millisecond of sleep standing for the kernel's run."""

    def __init__(self):
        cu = self.cu = ctypes.CDLL(str(FAKE_CUDA))
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
        self._check(cu.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self._check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self._check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.held: list[int] = []

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned CUDA error {rc}")

    def name(self) -> str:
        return "fake device 0 (CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "") + ")"

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
        return free.value, total.value

    def alloc(self, nbytes: int) -> bool:
        """Allocate and hold ``nbytes``; False when the driver (or the cap) refuses."""
        p = ctypes.c_uint64()
        rc = self.cu.cuMemAlloc_v2(ctypes.byref(p), nbytes)
        if rc == CUDA_OOM:
            return False
        self._check(rc, "cuMemAlloc_v2")
        self.held.append(p.value)
        return True

    def release(self) -> None:
        for p in self.held:
            self.cu.cuMemFree_v2(p)
        self.held.clear()

    def step(self) -> None:
        self._check(self.cu.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None), "cuLaunchKernel")
        time.sleep(FAKE_STEP_S)

    def launch_phases(self) -> list[float]:
        """Where in the compute-share period each launch so far fell (0 to 1), from the
        fake's own record (kept while FAKE_CUDA_LAUNCH_TIMES is set)."""
        times = ctypes.POINTER(ctypes.c_ulonglong)()
        n = self.cu.fake_cuda_launch_times(ctypes.byref(times))
        period = int(os.environ.get("GPUPOOL_COMPUTE_PERIOD_MS") or 100) * 1_000_000
        return [times[i] % period / period for i in range(n)]


class TorchGpu:
    """Device 0 as PyTorch sees it; a step is a 4096 x 4096 bf16 matmul, synchronised."""

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
        self.torch = torch
        self.held: list = []
        self.a = self.b = None

    def name(self) -> str:
        return self.torch.cuda.get_device_name(0)

    def mem_info(self) -> tuple[int, int]:
        return self.torch.cuda.mem_get_info()

    def alloc(self, nbytes: int) -> bool:
        try:
            self.held.append(self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda"))
            return True
        except self.torch.cuda.OutOfMemoryError:
            return False

    def release(self) -> None:
        self.held.clear()
        self.torch.cuda.empty_cache()

    def step(self) -> None:
        if self.a is None:
            self.a = self.torch.randn(4096, 4096, device="cuda", dtype=self.torch.bfloat16)
            self.b = self.torch.randn(4096, 4096, device="cuda", dtype=self.torch.bfloat16)
        self.a @ self.b  # noqa: B018 (the work is the point)
        self.torch.cuda.synchronize()

    def launch_phases(self) -> None:
        return None


def open_gpu(mode: str):
    if mode == "fake":
        return FakeGpu()
    if mode == "real":
        return TorchGpu()
    raise ValueError(f"mode must be fake or real, got {mode!r}")


def rate(g, seconds: float) -> float:
    """Steps per second of the loop over ``seconds`` (after one warm-up step)."""
    g.step()
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        g.step()
        n += 1
    return n / (time.monotonic() - start)


def kernel_checks(mode: str, seconds: float = 2.0) -> dict:
    """What a workspace's kernel reports: the memory the GPU shows (the cap, under the
    interception library), whether an allocation of half of it works and one past what is
    left is refused, and the matmul loop's rate under the compute share."""
    if mode == "fake":
        os.environ["FAKE_CUDA_LAUNCH_TIMES"] = "1"  # read at each launch by the fake
    g = open_gpu(mode)
    free, total = g.mem_info()
    half_ok = g.alloc(total // 2)
    past_cap_refused = not g.alloc(total - total // 2 + (1 << 20))
    g.release()
    out = {"device": g.name(), "total": total, "free": free, "half_ok": half_ok,
           "past_cap_refused": past_cap_refused, "rate": rate(g, seconds)}
    phases = g.launch_phases()
    if phases:  # the fake: the point of the period by which 99% of the launches fell
        phases.sort()
        out["window"] = phases[int(0.99 * (len(phases) - 1))]
        out["window_max"] = phases[-1]
    return out


def main(argv: list[str]) -> None:
    what, mode = argv[0], argv[1]
    g = open_gpu(mode)
    if what == "rate":
        print(json.dumps({"rate": rate(g, float(argv[2])), "device": g.name()}))
    elif what == "busy":
        while True:
            g.step()
            time.sleep(0.5)
    elif what == "hold":
        g.alloc(64 << 20)
        end = time.monotonic() + float(argv[2])
        while time.monotonic() < end:
            g.step()
            time.sleep(0.05)
        print(f"held the GPU ({g.name()}) for {argv[2]} s", flush=True)
    else:
        raise SystemExit(f"unknown command {what!r}: rate, busy or hold")


if __name__ == "__main__":
    main(sys.argv[1:])
