"""A cell and its environment, as the plan makes them and every later layer reads them (the engines' hooks
included): pure data. An environment is a point on the version axes plus a GPU kind (`GpuKind`, the matrix's
`[gpu.<kind>]`); a cell is an environment and a mode, with the server argv it was planned with.

Making them (expansion, ids, argv) belongs to `planning/cells.py`; reading the matrix file to `config/spec.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PINNED = "pinned"  # an axis value: the version the engine release pins (the engine data's `pins`)
# The platform a GPU kind's environments are resolved and locked for, unless it says another. sglang >= 0.5.11
# publishes manylinux_2_34 wheels only; an older tag makes every recent release "unresolvable" for the wrong
# reason.
DEFAULT_PLATFORM = "x86_64-manylinux_2_34"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ContainerOptions(_Strict):
    podman_devices: list[str] = []  # CDI names, e.g. nvidia.com/gpu=all
    docker_gpus: str | None = None  # docker run --gpus VALUE
    shm_size: str | None = None
    ulimits: list[str] = []
    mounts: list[str] = []  # read-only model caches: HOST:CONTAINER


class ReleaseArgs(_Strict):
    """`[[gpu.<kind>.args_by_release]]`: the kind's server arguments for a range of the engine's releases. A
    flag the kind's `args` already give takes this value in place; a new one is appended. Recipes change by
    release (sglang 0.5.12 dropped the CUTLASS NVFP4 MoE runner that 0.5.10's recipe used)."""

    versions: str = Field(min_length=1)  # a version specifier of the engine's own version, e.g. ">=0.5.12"
    args: list[str] = Field(min_length=1)
    source: str = Field(min_length=1)  # where this recipe was read: a wheel's file, a public recipe


class GpuKind(_Strict):
    arch: str = Field(pattern=r"^(sm_\d+a?|cpu)$")
    count: int = Field(ge=0)
    # nvidia-smi's name of the card ("NVIDIA H200"), or its start before an edition ("NVIDIA RTX PRO 6000
    # Blackwell" for the Server and Workstation Editions): a host whose GPUs have another name does not serve
    # the kind's cells, though the arch matches (an H100 is sm_90 too); empty: any card of the arch.
    sku: str = ""
    runner_labels: list[str] = []
    platform: str = DEFAULT_PLATFORM
    # It becomes GitHub's timeout-minutes and sbatch's --time: at most the longest job a self-hosted runner runs.
    timeout_minutes: int = Field(default=120, gt=0, le=7200)
    args: list[str] = []
    args_by_release: list[ReleaseArgs] = []
    env: dict[str, str] = {}
    # One server rank per GPU of the kind, with the engine's tensor-parallel args (engine data
    # `tensor_parallel`: the size from `count`, and the ports its ranks use, checked valid and free).
    tensor_parallel: bool = False
    container: ContainerOptions = ContainerOptions()


@dataclass(frozen=True, kw_only=True)
class Environment:
    env_id: str
    engine: str
    axes: Mapping[str, str]  # the engine's version axes, then gpu
    gpu: GpuKind
    python: str

    @property
    def version(self) -> str:
        """The engine's own version (the first axis)."""
        return next(iter(self.axes.values()))

    @property
    def ranks(self) -> int:
        """The server's ranks: one per GPU on a kind that asks for tensor parallelism, else one."""
        return self.gpu.count if self.gpu.tensor_parallel and self.gpu.count > 1 else 1

    def effective(self, axis: str, pins: Mapping[str, Mapping[str, str]]) -> str | None:
        """The axis value, with `pinned` replaced by the release's known pin where the engine data has one."""
        value = self.axes.get(axis)
        if value == PINNED:
            return pins.get(self.version, {}).get(axis)
        return value


@dataclass(frozen=True, kw_only=True)
class Cell:
    id: str
    env: Environment
    mode: str
    applicable: bool
    reason: str
    command: tuple[str, ...]
    server_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # flag -> value set by a flag axis that sweeps this cell's GPU kind: a value its release lacks makes the
    # cell not applicable (said by the engine's flag check), not a failure of the stack.
    swept_flags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def env_id(self) -> str:
        return self.env.env_id

    def selectable(self) -> dict[str, str]:
        """The values --select and include/exclude rules see."""
        return {**self.env.axes, "mode": self.mode, "engine": self.env.engine, "env": self.env_id, "id": self.id}

    def to_contract(self) -> dict[str, Any]:
        """The `plan --format json` shape of the design contract."""
        return {
            "id": self.id,
            "env_id": self.env_id,
            "engine": self.env.engine,
            "mode": self.mode,
            "axes": dict(self.env.axes),
            "applicable": self.applicable,
            "reason": self.reason,
            "command": list(self.command),
            "requires": {"gpu_arch": self.env.gpu.arch, "gpus": self.env.gpu.count},
        }
