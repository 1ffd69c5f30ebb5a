"""A stand-in package index on localhost for the release watcher: PEP 691 JSON project pages (upload times,
yanked files) and real wheels, served with Range support by tests/wheelserver.py's handler, so a release's
METADATA is read as it is from the real index, and uv resolves from it too."""

from __future__ import annotations

import contextlib
import hashlib
import json
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from tests.wheelserver import RangeHandler, serve

JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class Upload:
    """One file of a release on the stand-in index."""

    version: str
    uploaded: str = "2026-01-01T00:00:00Z"
    requires: Sequence[str] = ()
    tag: str = "py3-none-any"  # "sdist": a source archive only
    yanked: bool | str = False
    extra: dict = field(default_factory=dict)


def wheel(path: Path, name: str, version: str, requires: Sequence[str] = (), tag: str = "py3-none-any") -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    target = path / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(target, "w") as zipped:
        zipped.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        lines = [f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"]
        lines += [f"Requires-Dist: {r}\n" for r in requires]
        zipped.writestr(f"{dist}.dist-info/METADATA", "".join(lines))
        zipped.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        zipped.writestr(f"{dist}.dist-info/RECORD", "")
    return target


def write_index(root: Path, projects: Mapping[str, Sequence[Upload]]) -> Path:
    """root/simple/<name>/index.json and root/files/*: what `IndexHandler` serves."""
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    for name, uploads in projects.items():
        entries = []
        for upload in uploads:
            if upload.tag == "sdist":
                made = files / f"{name.replace('-', '_')}-{upload.version}.tar.gz"
                made.write_bytes(b"not really an sdist")
            else:
                made = wheel(files, name, upload.version, upload.requires, upload.tag)
            data = made.read_bytes()
            entries.append(
                {
                    "filename": made.name,
                    "url": f"../../files/{made.name}",
                    "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                    "size": len(data),
                    "upload-time": upload.uploaded,
                    "yanked": upload.yanked,
                    **upload.extra,
                }
            )
        page = root / "simple" / canonicalize_name(name)
        page.mkdir(parents=True, exist_ok=True)
        body = {"meta": {"api-version": "1.1"}, "name": canonicalize_name(name), "files": entries, "versions": []}
        (page / "index.json").write_text(json.dumps(body), encoding="utf-8")
    return root


class IndexHandler(RangeHandler):
    """A project page as PEP 691 JSON; a project the index lacks is a 404; files with Range support."""

    def do_GET(self) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "simple":
            page = Path(self.translate_path(f"/simple/{parts[1]}/index.json"))
            if not page.is_file():
                self.send_error(404)
                return
            data = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", JSON)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()


@contextlib.contextmanager
def standin_index(root: Path, projects: Mapping[str, Sequence[Upload]]) -> Iterator[str]:
    """The index URL (…/simple) of a stand-in index serving `projects`."""
    write_index(root, projects)
    with serve(root, IndexHandler) as (base, _sent):
        yield f"{base}/simple"
