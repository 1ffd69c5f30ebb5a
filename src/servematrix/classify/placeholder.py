"""A lock pin the index serves only as a placeholder: NVIDIA's `wheel-stub` sdists build by downloading the real
wheel from NVIDIA's own index, so an install from an index or mirror that lacks it (this project's hosts reach
only PyPI) fails in the build, whatever the stack would do. sglang 0.5.18-0.5.22 pin `cuda-tile==1.6.0rc5`, whose
only file on PyPI is such a placeholder (1.6.0rc10 and 1.6.0 have wheels).

That is a fact of the lock and the index, not of the stack: `run/reuse.py` replays it instead of installing
again on every fresh clone, and the report names it instead of a bare install fault."""

from __future__ import annotations

import re
from dataclasses import dataclass

# wheel_stub/error.py's message (InstallFailedError), as uv prints the failed build's output.
_STUB = re.compile(
    r"The installation of (?P<name>[A-Za-z0-9._-]+) for version (?P<version>\S+) failed\.\s+"
    r"This is a special placeholder package which downloads a real wheel package\s+from (?P<index>\S+?)\.?\s",
)


@dataclass(frozen=True)
class Placeholder:
    name: str
    version: str
    index: str  # where its real wheel lives

    def note(self) -> str:
        return (
            f"the lock pins {self.name} {self.version}, which the index serves only as a placeholder sdist "
            f"(wheel-stub) that downloads its wheel from {self.index} when built: this host reaches only the "
            "index, so the lock cannot be installed here (a fact of the lock and the index; --fresh tries again)"
        )


def placeholder_fault(text: str) -> Placeholder | None:
    """The placeholder an install's output says it could not fetch, or None."""
    found = _STUB.search(text)
    if found is None:
        return None
    return Placeholder(found["name"], found["version"], found["index"])
