"""Build time and size of the chart's images (``scripts/build-images``: buildah on a local
Debian base), cold and warm.

    python bench/image_build.py [--cold] [--json] [NAME...]

Warm: ``scripts/build-images`` against ``~/.cache/gpupool/images`` as it is (a warm cache
builds nothing; the figure is the cost of hashing the inputs). ``--cold`` builds into a
scratch ``GPUPOOL_CACHE`` (the mmdebstrap base included), then runs the warm case on it, so
``warm_vs_cold`` compares the two in one run. Prints one JSON object: per image its seconds
and archive MB (as the script reports them), the base's seconds, and the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(names: list[str], cache: str | None) -> dict:
    env = dict(os.environ)
    if cache:
        env["GPUPOOL_CACHE"] = cache
    t0 = time.monotonic()
    p = subprocess.run([str(REPO / "scripts" / "build-images"), *names], env=env,
                       capture_output=True, text=True)
    total = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"build-images failed ({p.returncode}):\n{p.stderr[-4000:]}")
    images = {m[1]: {"mb": int(m[2]), "s": int(m[3])}
              for m in re.finditer(r"\] (\S+): (\d+) MB in (\d+) s", p.stderr)}
    return {"total_s": round(total, 1), "images": images}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold", action="store_true", help="build into a scratch cache first")
    ap.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    ap.add_argument("names", nargs="*", help="images (default: all four)")
    args = ap.parse_args()
    out: dict = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                          capture_output=True, text=True).stdout.strip()}
    with tempfile.TemporaryDirectory(prefix="image-bench-") as scratch:
        cache = scratch if args.cold else None
        if args.cold:
            out["cold"] = build(args.names, cache)
        out["warm"] = build(args.names, cache)
        if args.cold:
            out["warm_vs_cold"] = round(out["warm"]["total_s"] / out["cold"]["total_s"], 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
