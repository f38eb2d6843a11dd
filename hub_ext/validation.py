"""The input rules every door of gpupool applies: the REST API, the spawn form, the CLI,
the org file, training and inference specs, credentials and data sources.

- Names: one pattern per kind, checked with ``fullmatch`` (``re.match('^...$')`` also
  accepts a trailing newline). The OpenAPI document carries each as ``^PATTERN$``.
- Strings: a length limit, no control characters (free text may hold tab and newlines),
  no lone surrogates (they cannot be encoded, stored or shown).
- Numbers: finite and within bounds; integers with a digit limit, so a 400-digit number
  is a 400, never an OverflowError. GPU quotas and limits are at most ``MAX_GPUS``.
- Dates and times: years 1970-9999, computed without overflow.
- JSON bodies: at most ``MAX_BODY_BYTES`` (413, refused before the body is read) and
  ``MAX_JSON_DEPTH`` levels deep; lists (members, env, command) have a length limit.
- Paths: normalised (``//`` collapsed, ``posixpath.normpath``) before any check on them.

Every refusal raises ``FieldError`` naming the field and the limit (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import posixpath
import re
from datetime import datetime, timezone

from gpupool.errors import GpupoolError
from scheduler.model import MAX_GPUS

__all__ = [
    "MAX_BODY_BYTES", "MAX_GPUS", "MAX_JSON_DEPTH", "PATTERNS", "FieldError", "check_fields",
    "command", "env", "integer_arg", "is_name", "json_body", "name", "names", "number", "path",
    "show", "ssh_keys", "text", "unix_time", "utc_time",
]


class FieldError(GpupoolError, ValueError):
    """A bad value in a request; ``field`` names it, the message says what is allowed."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


# -- names: kind -> (pattern, what it allows) ------------------------------------------
PATTERNS: dict[str, tuple[str, str]] = {
    # DNS labels, so they work as pod, folder and URL names: departments, projects,
    # workloads, trainings, inference services, node pools.
    "name": (r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
             "1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"),
    # Credentials and data sources: shorter, to leave room in the volume names built from them.
    "item": (r"[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?",
             "1-50 lowercase letters, digits or '-', starting and ending with a letter or digit"),
    "user": (r"[A-Za-z0-9._@-]{1,255}", "1-255 letters, digits, '.', '_', '@' or '-'"),
    "server": (r"[A-Za-z0-9-]{0,63}", "at most 63 letters, digits or '-' ('' is the default server)"),
    "env_key": (r"[A-Za-z_][A-Za-z0-9_]{0,127}",
                "an environment variable name: 1-128 letters, digits or '_', not starting with a digit"),
    "file_key": (r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}",
                 "a file name: 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"),
}
_COMPILED = {k: re.compile(p) for k, (p, _) in PATTERNS.items()}

# -- bounds -------------------------------------------------------------------------------
MAX_BODY_BYTES = 4 * 1024 * 1024  # 32 credential values of 64 KiB fit, with JSON's escapes
# A body up to this many times MAX_BODY_BYTES is read and dropped to answer 413; a bigger
# one closes the connection unread.
BODY_DRAIN_FACTOR = 16
MAX_JSON_DEPTH = 16  # the deepest request gpupool takes is 3 levels
MAX_INT_DIGITS = 18  # fits in 64 bits; bigger is no count of anything here
# A JSON body's integers are parsed up to this many digits (int() is quadratic in them);
# number() then refuses anything over MAX_INT_DIGITS naming its field.
MAX_JSON_INT_DIGITS = 1000
MAX_WEIGHT = float(MAX_GPUS)  # over-quota weights
MAX_TEXT = 1024  # single-line strings without a limit of their own (paths, URL paths)
MAX_IMAGE_CHARS = 512  # a container image reference: registry/name:tag@digest
MAX_GPU_MEMORY_GIB = 1_000_000.0
MAX_DESCRIPTION = 200
MAX_MEMBERS = 5_000  # per project, in one request
MAX_ROLES = 256  # role assignments of one user, in one request
MAX_COMMAND_ARGS, MAX_ARG_CHARS, MAX_COMMAND_CHARS = 1024, 32_768, 131_072
MAX_ENV, MAX_ENV_VALUE_CHARS, MAX_ENV_CHARS = 256, 32_768, 131_072
MIN_YEAR, MAX_YEAR = 1970, 9999
MAX_UNIX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z

# Control characters and lone surrogates; free text may hold tab, newline and CR.
_BAD_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_BAD_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _bad_char(s: str, multiline: bool) -> str | None:
    m = (_BAD_TEXT if multiline else _BAD_LINE).search(s)
    if m is None:
        return None
    c = m.group()
    return "a lone surrogate" if "\ud800" <= c <= "\udfff" else f"the control character U+{ord(c):04X}"


def has_surrogate(s: str) -> bool:
    return _SURROGATE.search(s) is not None


def show(raw, most: int = 60) -> str:
    """A value for an error message: repr, cut (never echo a 10 MB value back)."""
    r = repr(raw)
    return r if len(r) <= most else r[:most] + "..."


# -- strings and names ---------------------------------------------------------------------
def text(raw, field: str, most: int = MAX_TEXT, multiline: bool = False, empty: bool = True) -> str:
    """A string of at most ``most`` characters, without control characters (``multiline``:
    tab, newline and CR allowed) or lone surrogates."""
    if not isinstance(raw, str):
        raise FieldError(field, f"must be a string of at most {most} characters, got {show(raw)}")
    if len(raw) > most:
        raise FieldError(field, f"must be at most {most} characters, got {len(raw)}")
    if not raw and not empty:
        raise FieldError(field, "must not be empty")
    bad = _bad_char(raw, multiline)
    if bad:
        raise FieldError(field, f"must not contain {bad}")
    return raw


def name(raw, field: str = "name", kind: str = "name") -> str:
    """A name of ``kind`` (see PATTERNS), matched in full."""
    if not isinstance(raw, str) or _COMPILED[kind].fullmatch(raw) is None:
        raise FieldError(field, f"must be {PATTERNS[kind][1]}, got {show(raw)}")
    return raw


def is_name(raw, kind: str = "name") -> bool:
    return isinstance(raw, str) and _COMPILED[kind].fullmatch(raw) is not None


def names(raw, field: str, kind: str = "name", most: int = 16, unique: bool = True) -> list[str]:
    """A list of names: a JSON list, a form list or ``'a,b'``; at most ``most``."""
    if raw in (None, ""):
        return []
    if isinstance(raw, str):
        raw = [n.strip() for n in raw.split(",") if n.strip()]
    if not isinstance(raw, (list, tuple)):
        raise FieldError(field, f"must be a list of names, got {show(raw)}")
    if len(raw) > most:
        raise FieldError(field, f"must name at most {most}, got {len(raw)}")
    raw = [n.decode() if isinstance(n, bytes) else n for n in raw]
    for n in raw:
        if not is_name(n, kind):
            raise FieldError(field, f"{show(n)} is not a name ({PATTERNS[kind][1]})")
    if unique and len(set(raw)) != len(raw):
        raise FieldError(field, "names the same one twice")
    return list(raw)


def check_fields(data, known) -> None:
    """A request body must be a JSON object naming only ``known`` fields."""
    if not isinstance(data, dict):
        raise FieldError("body", "must be a JSON object")
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        key = unknown[0]
        if len(key) > 80 or _bad_char(key, False):
            key = show(key)
        raise FieldError(key, f"unknown field; allowed: {', '.join(sorted(known))}")


# -- numbers ----------------------------------------------------------------------------
def number(raw, field: str, lo: float, hi: float, integer: bool = False, unit: str = ""):
    """A finite number from ``lo`` to ``hi`` (whole with ``integer``): JSON numbers, or text
    from forms and query strings (at most MAX_INT_DIGITS digits before the point)."""
    rng = f"from {lo:.15g} to {hi:.15g}{unit}"
    if isinstance(raw, bool) or raw is None:
        raise FieldError(field, f"must be a number {rng}, got {show(raw)}")
    if isinstance(raw, str):
        digits = raw.strip().lstrip("+-").split(".")[0].split("e")[0].split("E")[0]
        if len(digits) > MAX_INT_DIGITS:
            raise FieldError(field, f"must be a number {rng} (at most {MAX_INT_DIGITS} digits), "
                             f"got {len(digits)} digits")
    elif isinstance(raw, int) and abs(raw) >= 10 ** MAX_INT_DIGITS:
        raise FieldError(field, f"must be {rng}, got a {len(str(abs(raw)))}-digit number "
                         f"(at most {MAX_INT_DIGITS} digits)")
    try:
        v = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise FieldError(field, f"must be a number {rng}, got {show(raw)}") from None
    if not math.isfinite(v) or v < lo - 1e-9 or v > hi + 1e-9:
        raise FieldError(field, f"must be {rng}, got {show(raw)}")
    if integer:
        if v != int(v):
            raise FieldError(field, f"must be a whole number {rng}, got {show(raw)}")
        return int(v)
    return v


def integer_arg(raw: str | None, field: str, default: int, lo: int, hi: int) -> int:
    """A whole number from a query string (``None`` or '': ``default``)."""
    if raw in (None, ""):
        return default
    if len(raw) > MAX_INT_DIGITS + 1 or not re.fullmatch(r"[+-]?[0-9]+", raw):
        raise FieldError(field, f"must be a whole number from {lo} to {hi}, got {show(raw)}")
    return number(raw, field, lo, hi, integer=True)


def unix_time(raw, field: str) -> float:
    """A UNIX time in seconds, from 1970 to the end of 9999."""
    if isinstance(raw, str) and len(raw) > 40:
        raise FieldError(field, f"must be a UNIX time in seconds from 0 to {MAX_UNIX_TIME:.0f}, "
                         f"got {len(raw)} characters")
    try:
        return number(raw, field, 0, MAX_UNIX_TIME, unit=" (a UNIX time in seconds)")
    except FieldError as e:
        raise FieldError(field, e.message.replace("a number", "a UNIX time in seconds")) from None


def utc_time(raw: str, field: str, end_of_day: bool = False) -> float:
    """An ISO 8601 date (``end_of_day``: the end of that day) or date-time (UTC without a
    zone) as a UNIX time; years 1970-9999."""
    example = "such as 2026-11-29 or 2026-11-29T13:00:00Z"
    t = text(raw, field, 64).strip()
    try:
        if len(t) == 10:  # a date
            day = datetime.strptime(t, "%Y-%m-%d").replace(tzinfo=timezone.utc)
            # seconds, not timedelta: the day after 9999-12-31 is no datetime
            ts = day.timestamp() + (86400 if end_of_day else 0)
        else:
            dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
            ts = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError):
        raise FieldError(field, f"must be an ISO 8601 date or date-time {example}, "
                         f"got {show(t)}") from None
    if not 0 <= ts <= MAX_UNIX_TIME:
        raise FieldError(field, f"must be from {MIN_YEAR}-01-01T00:00:00Z to "
                         f"{MAX_YEAR}-12-31T23:59:59Z (a date as 'to' counts to its end), got {show(t)}")
    return ts


# -- lists, mappings, paths -------------------------------------------------------------------
def command(raw, field: str = "command", required: bool = True) -> list[str]:
    """A program and its arguments: a list of strings (or one string split on blanks), at
    most MAX_COMMAND_ARGS of at most MAX_ARG_CHARS each, MAX_COMMAND_CHARS in all."""
    if isinstance(raw, str):
        text(raw, field, MAX_COMMAND_CHARS, multiline=True)
        raw = raw.split()
    if not isinstance(raw, (list, tuple)):
        raise FieldError(field, "must be a list of strings (the program and its arguments)")
    if required and not raw:
        raise FieldError(field, "must be a non-empty list of strings (the program and its arguments)")
    if len(raw) > MAX_COMMAND_ARGS:
        raise FieldError(field, f"must have at most {MAX_COMMAND_ARGS} arguments, got {len(raw)}")
    total = 0
    for i, arg in enumerate(raw):
        text(arg, f"{field}[{i}]", MAX_ARG_CHARS, multiline=True)
        total += len(arg)
    if total > MAX_COMMAND_CHARS:
        raise FieldError(field, f"must be at most {MAX_COMMAND_CHARS} characters in all, got {total}")
    return list(raw)


def env(raw, field: str = "env") -> dict[str, str]:
    """Environment variables: at most MAX_ENV ``NAME: value`` pairs, values of at most
    MAX_ENV_VALUE_CHARS characters, MAX_ENV_CHARS in all (a spec stays small to store and list)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FieldError(field, f"must be an object of NAME: string value pairs, got {show(raw)}")
    if len(raw) > MAX_ENV:
        raise FieldError(field, f"must have at most {MAX_ENV} variables, got {len(raw)}")
    total = 0
    for k, v in raw.items():
        if not is_name(k, "env_key"):
            raise FieldError(field, f"key {show(k)} must be {PATTERNS['env_key'][1]}")
        total += len(k) + len(text(v, f"{field}.{k}", MAX_ENV_VALUE_CHARS, multiline=True))
    if total > MAX_ENV_CHARS:
        raise FieldError(field, f"must be at most {MAX_ENV_CHARS} characters in all, got {total}")
    return dict(raw)


SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                 "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
MAX_SSH_KEYS = 16
MAX_SSH_KEY_CHARS = 8192


def ssh_keys(raw, field: str = "keys") -> list[str]:
    """``authorized_keys`` lines without options: ``TYPE BASE64 [comment]``, TYPE one of
    SSH_KEY_TYPES and the same type named inside the key blob; at most MAX_SSH_KEYS."""
    if not isinstance(raw, list):
        raise FieldError(field, "must be a list of public keys ('ssh-ed25519 AAAA... comment')")
    if len(raw) > MAX_SSH_KEYS:
        raise FieldError(field, f"must have at most {MAX_SSH_KEYS} keys, got {len(raw)}")
    out = []
    for i, line in enumerate(raw):
        f = f"{field}[{i}]"
        parts = text(line, f, MAX_SSH_KEY_CHARS, empty=False).strip().split(None, 2)
        if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
            raise FieldError(f, f"must be 'TYPE BASE64 [comment]' with TYPE one of {', '.join(SSH_KEY_TYPES)}, "
                             f"got {show(line)}")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except (binascii.Error, ValueError):
            raise FieldError(f, "the key is not valid base64") from None
        n = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
        if blob[4:4 + n] != parts[0].encode():
            raise FieldError(f, f"the key's data is not a {parts[0]} key")
        out.append(" ".join(parts))
    return out


def path(raw, field: str, most: int = MAX_TEXT) -> str:
    """An absolute path without '..', normalised: ``//`` collapsed (POSIX keeps a leading
    ``//`` through normpath, which would slip past a check for ``/etc``) and '.' removed."""
    p = text(raw, field, most)
    if not p.startswith("/"):
        raise FieldError(field, f"must be an absolute path (starting with '/'), got {show(p)}")
    p = re.sub(r"/{2,}", "/", p)
    if ".." in p.split("/"):
        raise FieldError(field, f"must not contain '..', got {show(p)}")
    return posixpath.normpath(p)


# -- bodies -------------------------------------------------------------------------------
def _int_digits(s: str) -> int:
    if len(s.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise FieldError("body", f"numbers must have at most {MAX_JSON_INT_DIGITS} digits, got "
                         f"{len(s.lstrip('-'))}")
    return int(s)


def _depth_ok(data, most: int) -> bool:
    stack = [(data, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > most:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def json_body(raw: bytes | str, most_bytes: int = MAX_BODY_BYTES) -> dict:
    """A JSON object from a request body: at most ``most_bytes`` and MAX_JSON_DEPTH levels,
    integers of at most MAX_INT_DIGITS digits."""
    if len(raw) > most_bytes:
        raise FieldError("body", f"must be at most {most_bytes} bytes, got {len(raw)}")
    depth = f"must be nested at most {MAX_JSON_DEPTH} levels deep"
    try:
        data = json.loads(raw, parse_int=_int_digits)
    except FieldError:
        raise
    except RecursionError:
        raise FieldError("body", depth) from None
    except ValueError as e:
        raise FieldError("body", f"must be JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise FieldError("body", "must be a JSON object")
    if not _depth_ok(data, MAX_JSON_DEPTH):
        raise FieldError("body", depth)
    return data
