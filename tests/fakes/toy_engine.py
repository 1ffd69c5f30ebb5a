"""The hooks of the test-defined engine `toyserve` (tests/fakes/engines/toyserve.toml): one CPU pre-flight,
`context-limit`, which knows that releases before 2.0 refuse a --max-len above 2048."""

from __future__ import annotations

from packaging.version import Version

from servematrix.engines.hooks import PreflightInput
from servematrix.formats import verdict
from servematrix.formats.verdict import Verdict

LIMIT_BEFORE_2 = 2048


def context_limit(inp: PreflightInput) -> Verdict | None:
    argv = list(inp.cell.command)
    wanted = int(argv[argv.index("--max-len") + 1]) if "--max-len" in argv else 0
    if Version(inp.cell.env.version) < Version("2.0") and wanted > LIMIT_BEFORE_2:
        return verdict.failed(
            "context-too-long", excerpt=f"toyserve {inp.cell.env.version} accepts --max-len up to {LIMIT_BEFORE_2}"
        )
    return None


PREFLIGHTS = {"context-limit": context_limit}
