"""One file of a wheel on an index, read without downloading the wheel: its METADATA is a few kB at a known
place in a zip of tens of MB (sglang's wheel: 39 MB, 6400 files). The zip's directory and the one member are
read with HTTP Range requests, as uv and pip read metadata that an index does not serve on its own."""

from __future__ import annotations

import io
import zipfile
from typing import TYPE_CHECKING

import httpx
from packaging.utils import canonicalize_name

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["RemoteWheelError", "wheel_metadata"]

# zipfile reads the directory in one go and a member in two small reads: a read-ahead this large makes
# each of those one request.
_READ_AHEAD = 256 * 1024
MAX_METADATA = 16 * 2**20  # a release's METADATA is kB; one that inflates past this is not read


class RemoteWheelError(Exception):
    """The wheel could not be read this way (no Range support, refused, not a wheel of that name)."""


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of an HTTP resource: every read is a Range request."""

    def __init__(self, client: httpx.Client, url: str, size: int) -> None:
        super().__init__()
        self._client, self._url, self._size, self._pos = client, url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._pos + len(view), self._size)
        if end <= self._pos:
            return 0
        # Streamed, and read no further than the range asked for: a server that ignores Range (or compresses
        # what it sends) must not make this read a whole wheel, or an endless body, into memory.
        headers = {"Range": f"bytes={self._pos}-{end - 1}", "Accept-Encoding": "identity"}
        with self._client.stream("GET", self._url, headers=headers) as response:
            if response.status_code != httpx.codes.PARTIAL_CONTENT:
                raise RemoteWheelError(f"{self._url}: HTTP {response.status_code} to a Range request")
            if not response.headers.get("content-range", "").startswith(f"bytes {self._pos}-"):
                raise RemoteWheelError(f"{self._url}: another range than bytes {self._pos}- came back")
            if response.headers.get("content-encoding", "identity") != "identity":
                raise RemoteWheelError(
                    f"{self._url}: the range came back encoded ({response.headers['content-encoding']})"
                )
            data = b""
            for piece in response.iter_raw():
                data += piece
                if len(data) >= end - self._pos:
                    break
        data = data[: end - self._pos]
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def wheel_metadata(url: str, name: str, *, size: int | None = None, timeout_s: float = 60) -> str:
    """The METADATA of project `name` in the wheel at `url` (http or https). `size` is the wheel's length
    when known (an index's pylock.toml says it); else one HEAD request asks. Raises RemoteWheelError."""
    try:
        # trust_env: the same CA bundle, proxy and .netrc settings as uv and pip read from the environment.
        with httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=True) as client:
            if size is None:
                head = client.head(url)
                head.raise_for_status()
                size = int(head.headers["content-length"])
            remote = io.BufferedReader(_RangeFile(client, url, size), buffer_size=_READ_AHEAD)
            with zipfile.ZipFile(remote) as wheel:
                for member in wheel.namelist():
                    folder, _, file = member.partition("/")
                    dist = folder.removesuffix(".dist-info").rsplit("-", 1)[0]
                    if (
                        file == "METADATA"
                        and folder.endswith(".dist-info")
                        and canonicalize_name(dist) == canonicalize_name(name)
                    ):
                        with wheel.open(member) as found:  # the size its header claims is no bound
                            text = found.read(MAX_METADATA + 1)
                        if len(text) > MAX_METADATA:
                            raise RemoteWheelError(f"{url}: {member} is over {MAX_METADATA // 2**20} MiB")
                        return text.decode("utf-8")
    except (httpx.HTTPError, zipfile.BadZipFile, KeyError, ValueError, UnicodeDecodeError) as exc:
        raise RemoteWheelError(f"{url}: {exc}") from exc
    raise RemoteWheelError(f"{url}: no {name} dist-info/METADATA in the wheel")
