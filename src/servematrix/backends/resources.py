"""Files the backends read that live at the top of the source tree, where the project keeps them once:
`containers/Dockerfile` (podman/docker) and the flake (`flake.nix`, `flake.lock`, `nix/`) for the Nix path.

The wheel carries them under `servematrix/_resources/` (pyproject.toml's force-include: the build copies
them, nobody edits a second copy), read through importlib.resources. An editable install has no such
folder and reads the checkout it was installed from.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from servematrix.errors import InputError

PACKAGED = "_resources"
# Where each resource sits in the wheel (under PACKAGED) and in a checkout (from its root).
LAYOUT = {
    "dockerfile": ("containers/Dockerfile", "containers/Dockerfile"),
    "flake": ("flake", "."),
}


def resource(name: str) -> Path:
    """The installed copy of a resource, else the checkout's; InputError (one line) when neither exists."""
    packaged_rel, checkout_rel = LAYOUT[name]
    packaged = files("servematrix").joinpath(PACKAGED, packaged_rel)
    if isinstance(packaged, Path) and packaged.exists():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / checkout_rel
    marker = checkout / "flake.nix" if name == "flake" else checkout
    if marker.exists():
        return checkout.resolve()
    raise InputError(
        f"servematrix's {packaged_rel} is neither in the installed package nor in a checkout: reinstall servematrix "
        "(pip install .) from a checkout of the repository"
    )


def is_packaged(path: Path) -> bool:
    """Whether `path` is the wheel's copy (read-only, not a git checkout) rather than a checkout's."""
    return PACKAGED in path.parts
