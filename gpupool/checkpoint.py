"""Checkpoints for training scripts: save on SIGTERM and every K steps, resume on start.

Standard library only, so it imports inside any workload (no hub, no scheduler, no
PyTorch needed). PyTorch objects work when PyTorch is installed: anything with
``state_dict()``/``load_state_dict()`` (models, optimizers, schedulers, GradScaler) and
the RNG state of ``torch`` and ``torch.cuda``.

    from gpupool.checkpoint import Checkpointer

    ck = Checkpointer(every=100)           # dir: $GPUPOOL_CHECKPOINT_DIR or ./checkpoints
    ck.register("model", model)            # state_dict()/load_state_dict()
    ck.register("optimizer", optimizer)
    ck.register("state", state)            # a dict, list or numpy array: restored in place
    ck.register("rng", rng)                # a numpy Generator: its bit generator's state
    ck.register_rng()                      # random, numpy's global RNG, torch (if loaded)
    start = ck.restore()                   # step of the latest checkpoint, 0 if none
    for step in range(start, total):
        train_one_step()
        ck.step(step + 1)                  # saves every 100 steps; on SIGTERM saves and exits

Preemption: gpupool sends SIGTERM and waits a grace period before SIGKILL. The handler
only sets a flag; the next ``step()`` saves (state is consistent between steps) and exits
with status 143. So work lost to a preemption is at most one step, and to a crash or
SIGKILL at most ``every`` steps.

Files: ``ckpt-000000100.pkl`` per checkpoint (the newest ``keep`` are kept) and
``latest.json`` naming the newest. Each is written to a temporary file in the same folder,
fsynced and renamed, so a reader never sees a torn file; ``restore`` skips a file it
cannot read and falls back to the one before.

Errors: ``CheckpointError`` (a ``RuntimeError``) for something that cannot be saved or
restored (an unknown kind of object, a name registered twice).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import GpupoolError

__all__ = ["Checkpointer", "CheckpointError", "latest_step", "PREEMPTED_EXIT_CODE"]

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a TERM-ed process
_FILE_RE = re.compile(r"^ckpt-(\d+)\.pkl$")
LATEST = "latest.json"


class CheckpointError(GpupoolError, RuntimeError):
    """Something that cannot be saved or restored."""


class _Entry:
    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]):
        self.get, self.put = get, put


def _accessors(name: str, obj: Any) -> _Entry:
    """How to read and restore ``obj``: in place where the object allows it."""
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
        return _Entry(obj.state_dict, obj.load_state_dict)
    bitgen = getattr(obj, "bit_generator", None)  # numpy.random.Generator
    if bitgen is not None and hasattr(bitgen, "state"):
        def put_gen(v):
            obj.bit_generator.state = v
        return _Entry(lambda: obj.bit_generator.state, put_gen)
    if isinstance(obj, dict):
        def put_dict(v):
            obj.clear()
            obj.update(v)
        return _Entry(lambda: dict(obj), put_dict)
    if isinstance(obj, list):
        def put_list(v):
            obj[:] = v
        return _Entry(lambda: list(obj), put_list)
    if hasattr(obj, "__array__") and hasattr(obj, "shape") and hasattr(obj, "copy"):
        def put_array(v):
            obj[...] = v
        return _Entry(lambda: obj.copy(), put_array)
    raise CheckpointError(
        f"{name}: cannot checkpoint a {type(obj).__name__}; register a dict, list, numpy "
        "array or Generator, an object with state_dict()/load_state_dict(), or give get= and set="
    )


def _rng_get() -> dict:
    import random

    out: dict[str, Any] = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["torch.cuda"] = torch.cuda.get_rng_state_all()
    return out


def _rng_put(v: dict) -> None:
    import random

    random.setstate(v["random"])
    if "numpy" in v:
        import numpy as np

        np.random.set_state(v["numpy"])
    if "torch" in v:
        import torch

        torch.set_rng_state(v["torch"])
        if "torch.cuda" in v and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(v["torch.cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(fileobj)`` to a temporary file, fsync, rename over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _steps_on_disk(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)) for f in os.listdir(directory) if (m := _FILE_RE.match(f))),
                  reverse=True)


def latest_step(directory: str | os.PathLike) -> int | None:
    """The step of the newest checkpoint in ``directory`` (from latest.json), or None."""
    try:
        return int(json.loads((Path(directory) / LATEST).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        steps = _steps_on_disk(Path(directory))
        return steps[0] if steps else None


class Checkpointer:
    """Registers what to save; saves every ``every`` steps and on SIGTERM; restores."""

    def __init__(self, directory: str | os.PathLike | None = None, every: int | None = None,
                 keep: int = 2, handle_sigterm: bool = True, exit_on_signal: bool = True):
        directory = directory or os.environ.get("GPUPOOL_CHECKPOINT_DIR") or "checkpoints"
        self.dir = Path(directory)
        if every is None:
            every = int(os.environ.get("GPUPOOL_CHECKPOINT_EVERY", "100"))
        if not isinstance(every, int) or every < 1:
            raise CheckpointError(f"every: must be a whole number of steps >= 1, got {every!r}")
        if not isinstance(keep, int) or keep < 1:
            raise CheckpointError(f"keep: must be a whole number >= 1, got {keep!r}")
        self.every, self.keep, self.exit_on_signal = every, keep, exit_on_signal
        self.entries: dict[str, _Entry] = {}
        self.last_saved: int | None = None
        self.stop_requested = False
        self.restored_from: int | None = None
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self._on_signal)

    # -- what to save --------------------------------------------------------------------
    def register(self, name: str, obj: Any = None, *, get: Callable[[], Any] | None = None,
                 set: Callable[[Any], None] | None = None) -> None:  # noqa: A002 (reads well)
        if name in self.entries:
            raise CheckpointError(f"{name}: registered twice")
        if get is not None or set is not None:
            if get is None or set is None:
                raise CheckpointError(f"{name}: give both get= and set=")
            self.entries[name] = _Entry(get, set)
        else:
            self.entries[name] = _accessors(name, obj)

    def register_rng(self) -> None:
        """Python's ``random``, numpy's global RNG and torch's (when they are imported)."""
        self.register("__rng__", get=_rng_get, set=_rng_put)

    # -- saving --------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        self.stop_requested = True

    def step(self, step: int) -> None:
        """Call after each completed step: saves every ``every`` steps, and on a pending
        SIGTERM saves and exits with status 143."""
        if self.stop_requested:
            if self.last_saved != step:
                self.save(step)
            if self.exit_on_signal:
                print(f"gpupool.checkpoint: saved step {step} on SIGTERM; exiting", file=sys.stderr,
                      flush=True)
                raise SystemExit(PREEMPTED_EXIT_CODE)
            return
        if step % self.every == 0 and self.last_saved != step:
            self.save(step)

    def save(self, step: int) -> Path:
        state = {name: e.get() for name, e in self.entries.items()}
        payload = {"step": step, "time": time.time(), "state": state}
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"ckpt-{step:09d}.pkl"
        torch = sys.modules.get("torch")
        if torch is not None:
            _atomic_write(path, lambda f: torch.save(payload, f))
        else:
            _atomic_write(path, lambda f: pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL))
        meta = json.dumps({"step": step, "file": path.name, "time": payload["time"]}).encode()
        _atomic_write(self.dir / LATEST, lambda f: f.write(meta))
        self.last_saved = step
        for old in _steps_on_disk(self.dir)[self.keep:]:
            try:
                (self.dir / f"ckpt-{old:09d}.pkl").unlink()
            except OSError:
                pass
        return path

    # -- restoring -----------------------------------------------------------------------
    def _load(self, path: Path) -> dict:
        torch = sys.modules.get("torch")
        if torch is not None:
            return torch.load(path, map_location="cpu", weights_only=False)
        with open(path, "rb") as f:
            return pickle.load(f)

    def restore(self) -> int:
        """Load the newest readable checkpoint into the registered objects; return its
        step (0 when there is none)."""
        candidates = []
        newest = latest_step(self.dir)
        if newest is not None:
            candidates.append(newest)
        candidates += [s for s in _steps_on_disk(self.dir) if s not in candidates]
        for step in candidates:
            path = self.dir / f"ckpt-{step:09d}.pkl"
            try:
                payload = self._load(path)
            except Exception as e:  # a damaged or partial file: try the one before
                print(f"gpupool.checkpoint: skipping {path.name}: {e}", file=sys.stderr)
                continue
            missing = sorted(set(self.entries) - set(payload["state"]))
            if missing:
                raise CheckpointError(f"{path}: has no saved state for {', '.join(missing)}")
            for name, e in self.entries.items():
                e.put(payload["state"][name])
            self.last_saved = self.restored_from = payload["step"]
            print(f"gpupool.checkpoint: resumed from step {payload['step']} ({path})",
                  file=sys.stderr, flush=True)
            return int(payload["step"])
        return 0
