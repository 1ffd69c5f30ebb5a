"""Facts about the host that go into every stored row, and which GPUs it has.

The GPUs are nvidia-smi's, or, where `SERVEMATRIX_STANDIN_GPUS=N` is set (`run --standin-gpus N`), N
stand-in GPUs: a test device for a host without GPUs, which stands in for any arch a cell needs. The runner
then serves the cells that need GPUs, on whatever backend the run has (the tests' fake server), and packs
them onto the stand-ins as it would onto real GPUs. Rows record the stand-ins as the host's GPUs.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass

from servematrix.errors import InputError
from servematrix.util import STANDIN_GPUS_ENV

STANDIN_ARCH = "stand-in"  # a stand-in GPU answers to every arch


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    arch: str  # sm_100, sm_120, ...
    driver: str


@dataclass(frozen=True, kw_only=True)
class Host:
    hostname: str
    cpu: str
    cpus: int
    os: str
    gpus: tuple[Gpu, ...]

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["gpu_sku"] = self.gpus[0].name if self.gpus else None
        data["driver"] = self.gpus[0].driver if self.gpus else None
        return data

    def count(self, arch: str, sku: str = "") -> int:
        """The GPUs of this arch, and of this card where one is named (a stand-in is any GPU)."""
        return sum(1 for g in self.gpus if g.arch == STANDIN_ARCH or (g.arch == arch and is_card(g.name, sku)))

    def summary(self) -> str:
        """Its GPUs by arch and name ("1x sm_90 NVIDIA H100 80GB HBM3"), as a run's preamble says them."""
        kinds = sorted({(g.arch, g.name) for g in self.gpus})
        return ", ".join(
            f"{sum(1 for g in self.gpus if (g.arch, g.name) == (arch, name))}x "
            + (name if arch == STANDIN_ARCH else f"{arch} {name}")
            for arch, name in kinds
        )


def is_card(name: str, sku: str) -> bool:
    """Whether nvidia-smi's `name` is the card `sku` names: the name itself, or the name and an edition after a
    space ("NVIDIA RTX PRO 6000 Blackwell" is "... Blackwell Server Edition" too, "NVIDIA H200" is not
    "NVIDIA H2000"). An empty `sku` is any card."""
    name, sku = name.casefold().strip(), sku.casefold().strip()
    return not sku or name == sku or name.startswith(sku + " ")


@functools.cache
def host() -> Host:
    return Host(
        hostname=socket.gethostname(),
        cpu=_cpu_model(),
        cpus=len(os.sched_getaffinity(0)),
        os=f"{platform.system()} {platform.release()}",
        gpus=tuple(_standin_gpus() if os.environ.get(STANDIN_GPUS_ENV) else _nvidia_gpus()),
    )


def _standin_gpus() -> list[Gpu]:
    text = os.environ.get(STANDIN_GPUS_ENV, "")
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"{STANDIN_GPUS_ENV}={text!r}: expected a number of stand-in GPUs, at least 1")
    return [Gpu(name="stand-in GPU (test device)", arch=STANDIN_ARCH, driver="none")] * int(text)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_gpus() -> list[Gpu]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        name, cap, driver = (part.strip() for part in line.split(",", 2))
        gpus.append(Gpu(name=name, arch="sm_" + cap.replace(".", ""), driver=driver))
    return gpus
