"""How the panel, the hub pages and the CLI write sizes, times and GPU shares for people:
"79.6 GiB", "today 06:35 UTC", "0.25 GPU". One place, so every page says it alike."""

from __future__ import annotations

import time
from datetime import UTC, datetime

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def size(n_bytes: float | None) -> str:
    """Binary units, at most one decimal, none when whole: "512 MiB", "79.6 GiB", "80 GiB"."""
    if n_bytes is None:
        return "—"
    n = float(n_bytes)
    unit = 0
    while abs(n) >= 1024 and unit < len(_UNITS) - 1:
        n /= 1024
        unit += 1
    text = f"{n:.1f}".removesuffix(".0")
    if text == "1024" and unit < len(_UNITS) - 1:  # 1023.96 GiB rounds up to the next unit
        text, unit = "1", unit + 1
    return f"{text} {_UNITS[unit]}"


def mib(n_mib: float | None) -> str:
    return size(None if n_mib is None else n_mib * 1024 * 1024)


def gib(n_gib: float | None) -> str:
    return size(None if n_gib is None else n_gib * 1024 ** 3)


def when(ts: float | None, now: float | None = None) -> str:
    """A moment in UTC, as short as it can be read without doubt: "today 06:35 UTC",
    "yesterday 23:10 UTC", "3 Dec 06:35 UTC" this year, else "3 Dec 2025 06:35 UTC"."""
    if not ts:
        return "—"
    t = datetime.fromtimestamp(ts, UTC)
    today = datetime.fromtimestamp(time.time() if now is None else now, UTC).date()
    hm = t.strftime("%H:%M")
    days = (today - t.date()).days
    if days == 0:
        return f"today {hm} UTC"
    if days == 1:
        return f"yesterday {hm} UTC"
    if t.year == today.year:
        return f"{t.day} {t:%b} {hm} UTC"
    return f"{t.day} {t:%b} {t.year} {hm} UTC"


def moment(value: float | str | None) -> str:
    """A moment in UTC written in full, for the ends of a range: "2026-11-28 23:17 UTC",
    from a timestamp or an ISO 8601 string (the REST API's form)."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        t = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    else:
        t = datetime.fromtimestamp(value, UTC)
    return f"{t:%Y-%m-%d %H:%M} UTC"


def duration(seconds: float | None) -> str:
    """"45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    if seconds is None:
        return "—"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def ago(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "never"
    return f"{duration((time.time() if now is None else now) - ts)} ago"


def gpus(milli: int | float | None) -> str:
    """A GPU amount from thousandths: "0.25 GPU", "1 GPU", "2 GPUs"."""
    if not milli:
        return "no GPU"
    n = milli / 1000
    return f"{n:g} GPU" + ("s" if n > 1 else "")


def gpu_share(env: dict[str, str]) -> str:
    """A workload's GPU share from its environment (scheduler/embedded/adapter.py gpu_env), as its
    own tools show it: "no GPU", "1 GPU (local GPU 0)", "0.25 GPU of local GPU 0: 19.9 GiB
    GPU memory, 25% compute"."""
    indices = [i for i in env.get("GPUPOOL_GPU_INDICES", "").split(",") if i]
    if not indices:
        return "no GPU"
    where = f"{env.get('GPUPOOL_NODE', '')} GPU {','.join(indices)}".strip()
    fraction = float(env.get("GPUPOOL_GPU_FRACTION") or 1)
    if fraction >= 1:
        return f"{gpus(len(indices) * 1000)} ({where})"
    text = f"{fraction:g} GPU of {where}"
    limits = [f"{size(int(env['GPUPOOL_MEMORY_LIMIT']))} GPU memory" if env.get("GPUPOOL_MEMORY_LIMIT") else "",
              f"{env['GPUPOOL_COMPUTE_SHARE']}% compute" if env.get("GPUPOOL_COMPUTE_SHARE") else ""]
    return f"{text}: {', '.join(x for x in limits if x)}" if any(limits) else text


def placement(parts: list[dict] | None) -> str:
    """Where a workload runs, one part per node: "local GPU 2 × 1; local GPU 3 × 1"."""
    return "; ".join(f"{p['node']} GPU {','.join(str(i) for i in p['gpu_indices'])} × {p['gpu_milli'] / 1000:g}"
                     for p in parts or [])


def waiting(reason: str, position: int | None) -> str:
    """Why a request waits, as the form's forecast, the progress page, the queue page and
    the CLI all say it: the scheduler's sentence after the queue position."""
    where = f"Waiting in the queue (position {position})" if position else "Waiting in the queue"
    return f"{where}: {reason}" if reason else where


def row_waiting(row) -> str:
    """``waiting`` for a stored workload (a WorkloadRow or its REST dict)."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return waiting(get("reason") or "", get("queue_position"))


FILTERS = {"wait_reason": row_waiting, "size": size, "mib": mib, "gib": gib, "when": when, "moment": moment, "ago": ago, "duration": duration,
           "gpus": gpus, "placement": placement}
