"""The server's port: free, and such that every port the engine derives from it is valid and free.

sglang derives a gRPC port as --port + 10000 and refuses to start when that passes 65535; a port from the
whole ephemeral range fails that about one time in five, and the failure would be blamed on the stack. The
offsets are engine data (`derived_ports` in data/engines/*.toml).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

MAX_PORT = 65535
LOWEST = 20000  # above the usual service ports; below the ephemeral range the kernel hands out
ATTEMPTS = 200


class NoPortError(RuntimeError):
    """No port with all its derived ports free was found: a fault of the host, never of the stack."""


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def usable(port: int, offsets: Iterable[int], host: str = "127.0.0.1") -> bool:
    """Whether `port` and each `port + offset` is a valid port that is free now."""
    ports = [port, *(port + offset for offset in offsets)]
    return all(1 <= p <= MAX_PORT for p in ports) and all(is_free(p, host) for p in ports)


def pick_port(offsets: Iterable[int] = (), host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A free port whose derived ports (`port + offset` for each offset) are valid and free."""
    offsets = tuple(offsets)
    highest = MAX_PORT - max((o for o in offsets if o > 0), default=0)
    if highest < LOWEST:
        raise NoPortError(f"no port range leaves room for offsets {offsets}")
    rng = rng or random.Random()
    for _ in range(ATTEMPTS):
        port = rng.randint(LOWEST, highest)
        if usable(port, offsets, host):
            return port
    raise NoPortError(f"no free port in {LOWEST}-{highest} with free ports at offsets {offsets} after {ATTEMPTS} tries")
