"""Free TCP ports for listeners gpupool chooses itself (the SSH gateway's default port;
the test hubs' ports)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """``n`` free ports on ``ip`` below the kernel's ephemeral range. A port the kernel hands
    out for port 0 comes from that range, and between choosing it and binding it, any
    outgoing connection (the proxy polling a hub that is not up yet) may take it as its own
    source port: the listener then fails with "Address already in use"."""
    low = _ephemeral_low()
    socks, ports = [], []
    rnd = random.Random()
    while len(ports) < n:
        port = rnd.randrange(max(1024, low - 12_000), low)
        s = _socket(ip, reuse=False)  # held while choosing the next: no port twice
        try:
            s.bind((ip, port))
        except OSError:
            s.close()
            continue
        socks.append(s)
        ports.append(port)
    for s in socks:
        s.close()
    return ports


def is_free(ip: str, port: int) -> bool:
    """Whether a listener could bind ``ip:port`` now (as asyncio's servers do, with
    SO_REUSEADDR: a closed connection's TIME_WAIT does not count)."""
    s = _socket(ip)
    try:
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _socket(ip: str, reuse: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
