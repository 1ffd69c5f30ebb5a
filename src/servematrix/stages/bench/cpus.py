"""Disjoint CPU sets for the server and the benchmark client on one host."""

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from servematrix.stages.bench_worker import (
    format_cpus,
)


@dataclass(frozen=True, kw_only=True)
class CpuSplit:
    """Disjoint CPU sets for the server and the benchmark client on one host."""

    server: tuple[int, ...]
    client: tuple[int, ...]

    @property
    def server_cpuset(self) -> str:
        """The server's CPUs as ``taskset -c`` / ``podman run --cpuset-cpus`` take them ("0-11")."""
        return format_cpus(self.server)

    @property
    def client_cpuset(self) -> str:
        return format_cpus(self.client)

    def pin_server(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run with its affinity set to the server's CPUs (inherited by every process it starts). Uses
        this interpreter to set the affinity, then execs ``argv`` (no taskset needed on the host)."""
        code = f"import os,sys;os.sched_setaffinity(0,{set(self.server)!r});os.execvp(sys.argv[1],sys.argv[1:])"
        return [sys.executable, "-c", code, *argv]


def _sibling_groups(cpus: Sequence[int], sysfs: Path) -> list[tuple[int, ...]]:
    """``cpus`` grouped by physical core (SMT siblings together), from sysfs; one group per CPU if unknown."""
    from servematrix.stages.bench_worker import parse_cpus

    allowed, seen, groups = set(cpus), set(), []
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        path = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = parse_cpus(path.read_text().strip()) & allowed
        except (OSError, ValueError):
            siblings = {cpu}
        siblings.add(cpu)
        seen |= siblings
        groups.append(tuple(sorted(siblings)))
    return groups


def split_cpus(
    client_cpus: int,
    *,
    cpus: Iterable[int] | None = None,
    sysfs: Path = Path("/sys/devices/system/cpu"),
) -> CpuSplit | None:
    """Split ``cpus`` (default: this process's affinity) into ``client_cpus`` CPUs for the client and the rest
    for the server, by whole physical cores where SMT siblings are known (siblings share a core's execution
    units, so splitting them would not stop the two from competing). The client takes the highest-numbered
    cores, and the server always keeps at least one core. None if there is nothing to split (one CPU)."""
    if client_cpus < 1:
        raise ValueError("client_cpus must be >= 1")
    pool = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if len(pool) < 2:
        return None
    groups = _sibling_groups(pool, sysfs)
    if len(groups) == 1:  # one core with several threads: split its threads, the best there is
        groups = [(cpu,) for cpu in groups[0]]
    client: list[int] = []
    while len(client) < client_cpus and len(groups) > 1:
        client[:0] = groups.pop()
    server = [cpu for g in groups for cpu in g]
    return CpuSplit(server=tuple(server), client=tuple(sorted(client)))
