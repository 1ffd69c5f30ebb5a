"""The server's port: free, and such that every port the engine derives from it is valid and free.

sglang derives a gRPC port as --port + 10000 and refuses to start when that passes 65535; a port from the
whole ephemeral range fails that about one time in five, and the failure would be blamed on the stack. The
offsets are engine data (`derived_ports` in data/engines/*.toml, and the ports a tensor-parallel server's
ranks use).

A port is free when it is picked, but its server binds it only seconds later: servers packed on one host at
once (`packing.py`) could pick the same one. `reserved_port` holds the port and its derived ports for the
whole start, against every harness of this user on the host, with one file per port (created exclusively,
naming the harness's pid; a dead harness's files are taken over). Other programs are not harnesses: any
outgoing connection on the host (a benchmark client's, uv's) is given a local port from the kernel's
ephemeral range, and one given the picked port before the server binds it makes the start fail with
address-in-use. So the port and its derived ports are picked outside that range where any such port exists.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

MAX_PORT = 65535
LOWEST = 20000  # above the usual service ports; below the ephemeral range the kernel hands out
ATTEMPTS = 200
MAX_SWEPT = 1000  # reservation files looked at per reservation for a dead holder
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux's; elsewhere nothing is avoided


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


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The ports the kernel gives outgoing connections (first, last), or None where the host does not say."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return None
    return (low, high) if 1 <= low <= high <= MAX_PORT else None


def _candidates(offsets: tuple[int, ...], ephemeral: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Ranges of ports (first, last) that leave `port` and every `port + offset` valid and, where any port
    does, outside the ephemeral range."""
    offsets = (0, *offsets)
    valid = (max(LOWEST, *(1 - o for o in offsets)), min(MAX_PORT - o for o in offsets))
    if valid[0] > valid[1]:
        return []
    if ephemeral is None:
        return [valid]
    quiet = [(LOWEST, ephemeral[0] - 1), (ephemeral[1] + 1, MAX_PORT)]
    ranges = [valid]
    for offset in offsets:  # the ports p with p + offset in a quiet range, intersected over the offsets
        shifted = [(first - offset, last - offset) for first, last in quiet]
        ranges = [(max(a, c), min(b, d)) for a, b in ranges for c, d in shifted if max(a, c) <= min(b, d)]
    return ranges or [valid]  # no port avoids the range: a valid one is still better than none


def pick_port(offsets: Iterable[int] = (), host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A free port whose derived ports (`port + offset` for each offset) are valid and free, all of them
    outside the host's ephemeral range where the offsets leave room for that."""
    offsets = tuple(offsets)
    ranges = _candidates(offsets, ephemeral_range())
    if not ranges:
        raise NoPortError(f"no port range leaves room for offsets {offsets}")
    rng = rng or random.Random()
    weights = [last - first + 1 for first, last in ranges]
    for _ in range(ATTEMPTS):
        first, last = rng.choices(ranges, weights)[0]
        port = rng.randint(first, last)
        if usable(port, offsets, host):
            return port
    spans = ", ".join(f"{first}-{last}" for first, last in ranges)
    raise NoPortError(f"no free port in {spans} with free ports at offsets {offsets} after {ATTEMPTS} tries")


def reservations_dir() -> Path:
    """Where this user's harnesses hold their ports: beside the system's temporary files, shared by all of them."""
    return Path(tempfile.gettempdir()) / f"servematrix-ports-{os.getuid()}"


@contextlib.contextmanager
def reserved_port(offsets: Iterable[int] = (), host: str = "127.0.0.1", *, folder: Path | None = None) -> Iterator[int]:
    """`pick_port`, held with every derived port until the block ends: no other harness of this user on the
    host picks any of them meanwhile. A folder that cannot be written, or that another user owns or may write,
    holds nothing (the pick still checks)."""
    offsets = tuple(offsets)
    folder = folder or reservations_dir()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        private = _private(folder)
    except OSError:
        private = False
    if not private:
        yield pick_port(offsets, host)
        return
    for leftover in list(folder.iterdir())[:MAX_SWEPT]:  # what SIGKILLed harnesses left: files of dead holders
        _holder_gone(leftover)
    for _ in range(ATTEMPTS):
        port = pick_port(offsets, host)
        held = _hold(folder, [port, *(port + o for o in offsets)])
        if held is None:
            continue
        try:
            yield port
        finally:
            for path in held:
                path.unlink(missing_ok=True)
        return
    raise NoPortError(f"no port with free ports at offsets {offsets} could be held in {folder} after {ATTEMPTS} tries")


def _private(folder: Path) -> bool:
    """Whether only this user can change the folder: another local user who made it first (in the shared
    temporary folder) could otherwise fill it with reservations that deny every port, or refuse ours."""
    info = folder.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _hold(folder: Path, wanted: list[int]) -> list[Path] | None:
    """A file for each port, all or none; None if another live harness holds one of them."""
    held: list[Path] = []
    for port in dict.fromkeys(wanted):
        path = folder / str(port)
        if not _create(path) and not (_holder_gone(path) and _create(path)):
            for mine in held:
                mine.unlink(missing_ok=True)
            return None
        held.append(path)
    return held


def _create(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(str(os.getpid()))
    return True


def _holder_gone(path: Path) -> bool:
    """A reservation whose harness no longer runs is removed (it was killed before it could remove it)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    if not text.strip().isdigit():
        return False  # being written: its holder is alive
    if psutil.pid_exists(int(text)):
        return False
    path.unlink(missing_ok=True)
    return True
