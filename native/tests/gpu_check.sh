#!/usr/bin/env bash
# GPU check of the interception library: needs an NVIDIA GPU, its driver, and PyTorch.
# Builds the library, then shows with PyTorch that (1) torch.cuda.mem_get_info() reports
# the cap, (2) allocating past it raises CUDA out-of-memory, (3) two processes share one
# cap, (4) nvidia-smi inside the preload shows the cap, (5) a training step is at most 1%
# slower with the library than without, (6) the scheduler's quarter of the GPU that the hub
# discovers through NVML is what PyTorch sees. Exits non-zero on the first failed check.
#
#   native/tests/gpu_check.sh            (CAP_MB=2048 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
make -s -C native lib
LIB=$PWD/native/build/libgpupool-cuda.so
CAP_MB=${CAP_MB:-2048}
CAP=$((CAP_MB * 1024 * 1024))
REGION=$(mktemp -d)/account
export GPUPOOL_SHARED_REGION=$REGION
run() { LD_PRELOAD=$LIB GPUPOOL_MEMORY_LIMIT=$CAP "$@"; }

echo "== 1. mem_get_info reports the cap"
run "$PY" - <<PYEOF
import torch
free, total = torch.cuda.mem_get_info()
print("mem_get_info", free, total)
assert total == $CAP, total
PYEOF

echo "== 2. allocating past the cap raises CUDA out of memory"
run "$PY" - <<PYEOF
import torch
x = torch.empty($CAP // 2, dtype=torch.uint8, device="cuda")
try:
    y = torch.empty($CAP, dtype=torch.uint8, device="cuda")
    raise SystemExit("allocation past the cap succeeded")
except torch.cuda.OutOfMemoryError as e:
    print("OutOfMemoryError:", str(e).splitlines()[0])
PYEOF

echo "== 3. two processes share one cap"
run "$PY" - <<PYEOF &
import time, torch
x = torch.empty(int($CAP * 0.6), dtype=torch.uint8, device="cuda")
open("$REGION.ready", "w").close()
time.sleep(20)
PYEOF
HOLDER=$!
while [ ! -e "$REGION.ready" ]; do sleep 0.2; done
run "$PY" - <<PYEOF
import torch
free, total = torch.cuda.mem_get_info()
print("second process sees free", free, "of", total)
assert free <= $CAP * 0.41, free
try:
    torch.empty(int($CAP * 0.6), dtype=torch.uint8, device="cuda")
    raise SystemExit("the second process exceeded the shared cap")
except torch.cuda.OutOfMemoryError:
    print("second process refused past the shared cap")
PYEOF
kill $HOLDER; wait $HOLDER 2>/dev/null || true

echo "== 4. nvidia-smi inside the preload shows the cap"
OUT=$(run nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits)
echo "nvidia-smi: $OUT"
TOTAL_MIB=$(echo "$OUT" | head -1 | cut -d, -f1 | tr -d ' ')
[ "$TOTAL_MIB" -eq "$CAP_MB" ] || { echo "nvidia-smi total $TOTAL_MIB != $CAP_MB"; exit 1; }

echo "== 5. a training step is at most 1% slower"
T_PLAIN=$("$PY" native/tests/train_step.py)
T_HOOK=$(LD_PRELOAD=$LIB GPUPOOL_MEMORY_LIMIT=$((40 * 1024 * 1024 * 1024)) "$PY" native/tests/train_step.py)
"$PY" - <<PYEOF
plain, hooked = $T_PLAIN, $T_HOOK
slow = hooked / plain - 1
print(f"step without {plain*1e3:.3f} ms, with {hooked*1e3:.3f} ms: {slow*100:+.2f}%")
assert slow <= 0.01, "more than 1% slower"
PYEOF
echo "== 6. a quarter of the discovered GPU, as the scheduler hands it out, is what PyTorch sees"
GPUPOOL_SHARED_REGION=$(mktemp -d)/account LIB=$LIB "$PY" - <<'PYEOF'
import os, subprocess, sys
sys.path.insert(0, os.getcwd())
from hub_ext.inventory import discover
from scheduler.contract import share_env
nodes, source = discover([])
assert source == "nvml", source
gpu = nodes[0].gpus[0]
env = share_env(gpu.memory_mib, 250)  # 0.25 of the GPU, in milli
print("discovered", gpu.model, gpu.memory_mib, "MiB; a quarter:", env)
seen = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"],
                      env={**os.environ, "LD_PRELOAD": os.environ["LIB"], **env},
                      capture_output=True, text=True, check=True).stdout.strip()
print("PyTorch sees a total of", seen, "bytes")
assert int(seen) == int(env["GPUPOOL_MEMORY_LIMIT"]), (seen, env)
PYEOF

echo "gpu_check: all checks passed"
