"""Make an sglang package bundle for a GPU node that reaches no package index (docs/gpu-runners.md).

The bundle is what the node lacks of a release's lock. NODE lists the node's packages: a bare name (the node has
it, at a version taken as good enough) or name==version. A locked package is carried when the node lacks it, when
NODE names another version, or when it is part of the engine's pinned stack (ENGINE_STACK: the release's
behaviour depends on those exact versions), and never when it is the node's torch and the CUDA libraries torch
links (NEVER), or something a small model on one Hopper GPU does not load (LEFT_OUT). The packages are installed
with uv for the node's platform, hash-checked from the lock, stripped of the libraries the H200 lane does without
(FA3's 1-2 GB `flash_ops`, Blackwell-only folders, static libraries), then compressed and split into parts that
each fit one device call beside the working tree as it is when the bundle is made (64 MiB in all, a margin
kept; `--part-mib` sets it). `ci/gpu/h200-bundle.sh RELEASE PARTS_DIR` unpacks it on the node.

    python3 ci/gpu/make_bundle.py matrix/locks/9fd74eab7972.lock.txt ci/gpu/h200-node-packages.txt OUT

OUT gets site.tar.xz.00, .01, ..., requirements.txt (what went in, with the lock's hashes) and MANIFEST.txt
(sizes, the largest packages, what was stripped and every package not carried, with why). It runs where an
index is reachable; it needs uv, tar and xz.

`--carry-torch` is for a release that pins another torch than the node's (sglang 0.5.23 pins 2.14.1; the node
has 2.11.0): the NEVER packages are then carried where the node's version is not the lock's, or not known (a
bare name in NODE; `--node-version NAME==VERSION` says it without editing the list), and left to the node only
where it has the lock's version. The bundle's torch then shadows the node's on the wrappers' path.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The engine and what it pins exactly: carried even where the node has the package (at another version, or one
# the node's list does not say). sglang 0.5.12's bundle needed tokenizers 0.22.2 (transformers 5.6.0 refuses 0.23).
ENGINE_STACK = (
    "sglang",
    "sglang-kernel",
    "sgl-kernel",
    "sgl-deep-gemm",
    "flashinfer-python",
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "safetensors",
    "kernels",
    "torchao",
    "xgrammar",
    "llguidance",
)
# The node's torch and the CUDA libraries it links: a bundle that carried these would replace the stack the
# node's driver was tested with. (Other nvidia-* packages, cudnn-frontend and ml-py, are ordinary packages.)
NEVER = re.compile(
    r"^(torch|torchaudio|torchvision|triton|cuda-toolkit|nvidia-(cublas|cuda-cupti|cuda-nvrtc|cuda-runtime"
    r"|cudnn-cu\d+|cufft|cufile|curand|cusolver|cusparse|cusparselt-cu\d+|nccl-cu\d+|nvjitlink|nvshmem-cu\d+|nvtx))$"
)
# Not loaded by a small model on one Hopper GPU served with triton or FlashMLA attention, and large.
LEFT_OUT = (
    "flashinfer-cubin",  # prebuilt cubins; flashinfer JIT-compiles what it needs
    "flash-attn-4",  # Blackwell
    "tokenspeed-*",
    "torchcodec",
    "z3-solver",
    "datasets",  # `bench_serving` imports it; its random-ids dataset needs a stub only
    "modelscope",
    "tilelang",  # another NSA backend (--nsa-*-backend tilelang), 50 MB
    # Not nvidia-cutlass-dsl (`cutlass`, CuTe DSL), though its kernels are Blackwell's: sglang 0.5.15 imports it while
    # its model registry loads `sglang.srt.models.deepseek_v2`, which skips that module without it and serves GLM-5
    # through the Transformers fallback, which cannot (the H200, 2026-12-05; signature transformers-fallback).
    # CUDA's compiler as wheels: the node has nvcc (DeepGEMM's JIT finds it through CUDA_HOME)
    "nvidia-cuda-nvcc",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
    "nvidia-cuda-tileiras",
    "nvidia-mathdx",
)
# Inside the installed tree: FA3 (1.07 GB in 0.5.12, 1.76 GB in 0.5.15), Blackwell-only kernels, static archives.
STRIPPED = ("sgl_kernel/flash_ops*.so", "sgl_kernel/sm100", "**/*.a")
# A device call carries 64 MiB with the working tree: one part a call, in what the tree leaves, less a margin
# for what the tree gains before the visit (results, logs). Never below MIN_PART_BYTES: a tree that large
# must shrink first.
CALL_BYTES = 64 * 1024 * 1024
MARGIN_BYTES = 4 * 1024 * 1024
MIN_PART_BYTES = 8 * 1024 * 1024
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_blocks(lock: Path) -> list[tuple[str, str, str]]:
    """(name, version, block) for each pinned requirement of a `uv pip compile` lock, its hash lines kept."""
    blocks: list[tuple[str, str, str]] = []
    lines = lock.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _REQ.match(lines[i])
        if match is None:
            i += 1
            continue
        block = [lines[i]]
        while block[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            block.append(lines[i])
        blocks.append((canonical(match.group(1)), match.group(2), "\n".join(block).rstrip(" \\")))
        i += 1
    return blocks


def node_packages(node: Path) -> dict[str, str | None]:
    """The node's packages: name -> version, or None where the list gives the name alone."""
    out: dict[str, str | None] = {}
    for raw in node.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _REQ.match(line)
        out[canonical(match.group(1) if match else line)] = match.group(2) if match else None
    return out


def left_out(name: str, extra: tuple[str, ...]) -> bool:
    patterns = [canonical(p) for p in (*LEFT_OUT, *extra)]
    return any(re.fullmatch(re.escape(p).replace(r"\*", ".*"), name) for p in patterns)


def select(
    lock: Path,
    node: Path,
    extra_left_out: tuple[str, ...] = (),
    *,
    carry_torch: bool = False,
    node_versions: dict[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """The lock's requirement blocks the bundle carries, and a line per package it does not carry, with why.

    `carry_torch`: a NEVER package (torch, triton, torch's CUDA libraries) is carried unless the node has it at
    the lock's version; a bare name in the node's list (version unknown) is carried. `node_versions` adds to or
    overrides the node list's versions."""
    have = node_packages(node)
    have.update({canonical(name): version for name, version in (node_versions or {}).items()})
    stack = {canonical(name) for name in ENGINE_STACK}
    carried, skipped = [], []
    for name, version, block in lock_blocks(lock):
        if NEVER.match(name) and carry_torch:
            if have.get(name, "") == version:
                skipped.append(f"{name}=={version}: the node has it ({version}), torch's stack left to the node")
            else:
                carried.append(block)
        elif NEVER.match(name):
            skipped.append(f"{name}=={version}: the node's CUDA stack, never bundled")
        elif left_out(name, extra_left_out):
            skipped.append(f"{name}=={version}: left out (not loaded by the H200 lane)")
        elif name in have and name not in stack and have[name] in (None, version):
            skipped.append(f"{name}=={version}: the node has it ({have[name] or 'its own version'})")
        else:
            carried.append(block)
    return carried, skipped


def _never(block: str) -> bool:
    match = _REQ.match(block)
    return match is not None and NEVER.match(canonical(match.group(1))) is not None


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def tree_bytes(repo: Path) -> int:
    """What a device call carries of the repository: its tracked files and the untracked ones git does not
    ignore, as they are now."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    files = (repo / name for name in listed.decode("utf-8", "surrogateescape").split("\0") if name)
    return sum(path.stat().st_size for path in files if path.is_file() and not path.is_symlink())


def part_bytes(tree: int) -> int:
    """The largest part that travels in one device call beside a working tree of `tree` bytes."""
    return max(MIN_PART_BYTES, CALL_BYTES - tree - MARGIN_BYTES)


def _compress(site: Path, into: Path, part: int) -> bool:
    """`tar | xz` of `site`, split into parts of `part` bytes in `into`; whether both ended well."""
    tar = subprocess.Popen(["tar", "-C", str(site), "-c", "."], stdout=subprocess.PIPE)
    xz = subprocess.Popen(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=subprocess.PIPE)
    assert tar.stdout is not None and xz.stdout is not None
    tar.stdout.close()
    index = 0
    while chunk := xz.stdout.read(part):
        (into / f"site.tar.xz.{index:02d}").write_bytes(chunk)
        index += 1
    return xz.wait() == 0 and tar.wait() == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", type=Path, help="a servematrix lock (matrix/locks/ENV.lock.txt)")
    parser.add_argument("node", type=Path, help="the GPU node's packages: a name, or name==version, per line")
    parser.add_argument("out", type=Path, help="where the parts, requirements.txt and MANIFEST.txt go")
    parser.add_argument("--keep-out", action="append", default=[], metavar="NAME", help="also leave out NAME")
    parser.add_argument(
        "--carry-torch",
        action="store_true",
        help="carry torch, triton and torch's CUDA libraries where the node's version is not the lock's",
    )
    parser.add_argument(
        "--node-version",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="the node has NAME at VERSION (adds to or overrides NODE's line)",
    )
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", default="x86_64-manylinux_2_34")
    parser.add_argument(
        "--part-mib", type=int, metavar="N", help="parts of N MiB (default: what this working tree leaves of a call)"
    )
    args = parser.parse_args(argv)
    for path in (args.lock, args.node):
        if not path.is_file():
            print(f"make_bundle: {path}: no such file", file=sys.stderr)
            return 2
    node_versions = {}
    for spec in args.node_version:
        match = _REQ.match(spec)
        if match is None:
            print(f"make_bundle: --node-version {spec!r}: not NAME==VERSION", file=sys.stderr)
            return 2
        node_versions[match.group(1)] = match.group(2)
    tree = tree_bytes(Path(__file__).resolve().parents[2])
    part_size = args.part_mib * 1024 * 1024 if args.part_mib else part_bytes(tree)
    carried, skipped = select(
        args.lock, args.node, tuple(args.keep_out), carry_torch=args.carry_torch, node_versions=node_versions
    )
    args.out.mkdir(parents=True, exist_ok=True)
    requirements = args.out / "requirements.txt"
    requirements.write_text("\n".join(carried) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="bundle-") as tmp:
        site = Path(tmp) / "site"
        subprocess.run(
            # copied, not linked from uv's cache: another uv linking the same files mid-tar changes them
            ["uv", "pip", "install", "--no-deps", "--require-hashes", "--link-mode", "copy", "--target", str(site),
             "--python-version", args.python_version, "--python-platform", args.platform, "-r", str(requirements)],
            check=True,
        )  # fmt: skip
        stripped = []
        for pattern in STRIPPED:
            for path in sorted(site.glob(pattern)):
                stripped.append(f"{path.relative_to(site)}: {_size(path):,} bytes")
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        sizes = {top.name: _size(top) for top in site.iterdir()}
        # The parts are written aside and moved into place only when all of them are: no half a bundle.
        staging = Path(tempfile.mkdtemp(prefix=".parts-", dir=args.out))
        try:
            if not _compress(site, staging, part_size):
                print("make_bundle: tar | xz failed", file=sys.stderr)
                return 1
            for old in args.out.glob("site.tar.xz.*"):
                old.unlink()
            for part in sorted(staging.iterdir()):
                part.rename(args.out / part.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    parts = sorted(args.out.glob("site.tar.xz.*"))
    torch_stack = [block.splitlines()[0].rstrip(" \\") for block in carried if _never(block)]
    manifest = [
        f"lock: {args.lock.name}",
        f"carried: {len(carried)} packages, {sum(sizes.values()):,} bytes installed after stripping",
        f"parts: {len(parts)}, {sum(p.stat().st_size for p in parts):,} bytes, each at most {part_size:,} "
        f"(the working tree was {tree:,} bytes)",
        *(f"largest: {name}: {size:,} bytes" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:10]),
        *(f"stripped: {line}" for line in stripped),
        *(f"carried, torch's stack: {line}" for line in torch_stack),
        *(f"not carried: {line}" for line in skipped),
    ]
    (args.out / "MANIFEST.txt").write_text("\n".join(manifest) + "\n", encoding="utf-8")
    print("\n".join(manifest[:3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
